#!/usr/bin/env bash
# One device call (~3 min, no wheels needed): the item-block kernel's GPU variant tests (fwd_prefetch among
# them), then the tuned kernel against it with the forward's scores prefetched (probe_item_block_fwd.py --prefetch).
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -p no:logging \
  tests/kernels/test_item_block.py -k "variant or rising or random_config" 2>&1 | grep -E "^E |passed|failed" | head -10
timeout 330 python3 benchmarks/probe_item_block_fwd.py --prefetch --out $OUT/probe_prefetch.json
