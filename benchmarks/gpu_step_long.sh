#!/usr/bin/env bash
# One device call (prepared, not yet run; ~5 min): the full training step, PinGER against the TIGER
# layout at equal context, now that TIGER's full forward runs causal SDPA (FlashAttention) on CUDA
# instead of an explicit mask (d01fb27): the 1.24x of 9909bcb (8 x 1,024 items) measured again, and
# longer contexts (4 x 2,048, 2 x 4,096 items), where attention is a larger share of the step.
# d 768, 12 heads x 64, 4 layers, no dropout, TIGER's objective (SID loss only) on both sides.
# First the GPU tests the causal path touches (its twin test; the model, graph and decode tests, where
# dense / HSTU models now prefill on it). Carry .whl and runs/beauty.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_model_triton.py \
  tests/model tests/decode 2>&1 | tail -4
BT="timeout 150 python3 benchmarks/bench_train.py --preset gpu-base"
BIG="model.d_model=768 model.n_heads=12 model.d_ff=3072 model.dropout=0.0 model.attn_impl=triton"
for shape in 8x1024 4x2048 2x4096; do
  echo "== training step, synthetic $shape items"
  $BT runs/beauty --synthetic $shape --steps 20 --warmup 10 --variants pinger,tiger $BIG objective.w_item=0 objective.w_action=0 2>&1 | tail -3
done
