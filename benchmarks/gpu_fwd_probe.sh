#!/usr/bin/env bash
# One device call (~3 min): the item-block kernel of this commit against earlier commits' kernels (OLD_REVS,
# default: the session's start fd99f80 and the mask-only change 6eb7aa0) and its tuned neighbours. GPU tests
# of the kernel's variants first, then benchmarks/probe_item_block_fwd.py. Carry .whl.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
OLD=()
for rev in ${OLD_REVS:-fd99f80 6eb7aa0}; do
  git show $rev:src/genrec/kernels/item_block.py > /tmp/item_block_$rev.py && OLD+=(--old "$rev=/tmp/item_block_$rev.py")
done
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -p no:logging -m "gpu or not gpu" \
  tests/kernels/test_item_block.py -k "variant or half_precision or poisoned or many_blocks" 2>&1 | grep -E "^E |passed|failed" | head -20
timeout 330 python3 benchmarks/probe_item_block_fwd.py "${OLD[@]}" --out $OUT/probe_fwd.json
