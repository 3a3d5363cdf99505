#!/usr/bin/env bash
# One device call (~3 min): the item-block kernel of this commit against earlier commits' kernels (OLD_REVS,
# default fd99f80, the tenth session's start: commits the device's git copy holds) and its tuned
# neighbours (probe_item_block_fwd.configs). First the static view
# of the kernels under the device's Triton, and the GPU tests of the kernel's variants. Carry .whl.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
OLD=()
for rev in ${OLD_REVS:-fd99f80}; do
  git show $rev:src/genrec/kernels/item_block.py > /tmp/item_block_$rev.py && OLD+=(--old "$rev=/tmp/item_block_$rev.py")
done
timeout 60 python3 benchmarks/inspect_item_block.py --out $OUT/inspect.json 2>&1 | grep -v Warn
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -p no:logging -m "gpu or not gpu" \
  tests/kernels/test_item_block.py -k "variant or half_precision or poisoned or many_blocks or rising" 2>&1 | grep -E "^E |passed|failed" | head -20
timeout 330 python3 benchmarks/probe_item_block_fwd.py "${OLD[@]}" --out $OUT/probe_fwd.json
