#!/usr/bin/env bash
# One device call (~5 min; PROFILE=1 also writes a profile of the PinGER step to $OUT): the full training step, PinGER against the TIGER layout at equal context,
# now that TIGER's full forward runs causal SDPA (FlashAttention) on CUDA instead of an explicit mask
# (d01fb27): the 1.24x of 9909bcb (8 x 1,024 items, d 768) measured again; longer contexts (4 x 2,048,
# 2 x 4,096 items), and narrower models (d 256 and 384, heads of 64) at 1,024 and 2,048 items, where
# attention is a larger share of the step. 4 layers, no dropout, TIGER's objective (SID loss only) on
# both sides. First the GPU tests the causal path touches (its twin test; the model, graph and decode
# tests, where dense / HSTU models now prefill on it). Carry .whl and runs/beauty.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_model_triton.py \
  tests/model tests/decode 2>&1 | tail -4
if [ -n "$PROFILE" ]; then
  timeout 100 python3 benchmarks/bench_train.py --preset gpu-base runs/beauty --synthetic 8x1024 --steps 10 --warmup 5 \
    --profile 3 --variants pinger model.d_model=768 model.n_heads=12 model.d_ff=3072 model.dropout=0.0 \
    model.attn_impl=triton objective.w_item=0 objective.w_action=0 > $OUT/profile_pinger.log 2>&1
fi
D384="model.d_model=384 model.n_heads=6 model.d_ff=1536"
D256="model.d_model=256 model.n_heads=4 model.d_ff=1024"
run() {  # shape, width name, width overrides
  echo "== training step, synthetic $1 items, $2"; mkdir -p $OUT/$1-$2
  OUT=$OUT/$1-$2 timeout 75 $BT runs/beauty --synthetic $1 --steps 20 --warmup 10 --variants pinger,tiger \
    $3 $COMMON 2>&1 | tail -3
}
run 8x1024 d768 "$D768"; run 4x2048 d768 "$D768"; run 2x4096 d768 "$D768"
run 8x1024 d256 "$D256"; run 8x1024 d384 "$D384"; run 4x2048 d256 "$D256"
