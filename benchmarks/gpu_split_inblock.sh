#!/usr/bin/env bash
# One device call (no wheels needed): the tuned item-block kernel against the split in-block part
# (ItemBlockConfig.split_inblock), each configuration first checked against the fp32 reference on the GPU.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 170 python3 benchmarks/probe_item_block_fwd.py --split-inblock --iters 20 --out $OUT/probe_split.json
