#!/usr/bin/env bash
# One device call (~2.5 min, no wheels needed): the item-block kernel's GPU variant tests (register caps among
# them), then the tuned kernel against it with register caps (probe_item_block_fwd.py --maxnreg).
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
TRITON_INTERPRET=0 timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -p no:logging \
  tests/kernels/test_item_block.py -k "variant" 2>&1 | grep -E "^E |passed|failed" | head -10
timeout 200 python3 benchmarks/probe_item_block_fwd.py --maxnreg --out $OUT/probe_maxnreg.json
