#!/usr/bin/env bash
# One device call (~4 min, no wheels needed: torch + triton + pytest/hypothesis of the image): the GPU tests of
# the item-block kernel's variants (store_ds among them), then the tuned kernel against itself with dS stored
# (ItemBlockConfig.store_ds) over a grid of the dq kernel's tiles (probe_item_block_fwd.py --store-ds).
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git log --oneline -1
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -p no:logging \
  tests/kernels/test_item_block.py -k "variant or half_precision or poisoned or many_blocks or rising or store_ds" 2>&1 \
  | grep -E "^E |passed|failed" | head -20
timeout 330 python3 benchmarks/probe_item_block_fwd.py --store-ds --out $OUT/probe_store_ds.json
# the tuned kernel beside its peers at both shapes, in the same call (FlexAttention compiled, SDPA with the
# explicit mask, causal SDPA over the TIGER layout's 5,120 tokens) and the bf16 matmul / copy ceilings
timeout 200 python3 benchmarks/bench_kernels.py --only train,ceilings --quick --all-shapes --iters 20 --warmup 5 2>&1 \
  | grep -v "Warn\|warn" | tail -25
