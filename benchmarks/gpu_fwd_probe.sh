#!/usr/bin/env bash
# One device call (~5 min): the item-block kernel's cheaper in-block mask, paired forward blocks and the
# swapped grid. GPU tests of the kernel's variants first, then benchmarks/probe_item_block_fwd.py against the
# previous commit's kernel in the same run. Carry .whl.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
git show ${OLD_REV:-HEAD~1}:src/genrec/kernels/item_block.py > /tmp/item_block_old.py
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -p no:logging -m "gpu or not gpu" \
  tests/kernels/test_item_block.py -k "variant or half_precision or poisoned or many_blocks" 2>&1 | grep -E "^E |passed|failed" | head -20
timeout 330 python3 benchmarks/probe_item_block_fwd.py --old /tmp/item_block_old.py --out $OUT/probe_fwd.json
