#!/usr/bin/env bash
# One device call (prepared, not yet run): the item-block kernel's fuse_dense_dq option on the GPU.
# 1. its correctness tests on the GPU (fp32 + bf16 against the reference, NaN-poisoned buffers);
# 2. the --fused-dq sweep at both issue-5 shapes: the tuned config with and without the option,
#    and the dense dk/dv kernel's tiles re-swept under it. Carry .whl.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_item_block.py -k "fuse_dense_dq or random_config" 2>&1 | tail -4
timeout 360 python3 benchmarks/sweep_item_block.py --fused-dq --out $OUT/sweep_fused_dq.json 2>&1 | grep -v Warn | tail -40
