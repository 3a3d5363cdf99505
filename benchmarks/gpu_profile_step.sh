#!/usr/bin/env bash
# One device call: torch.profiler tables of the full training step (PinGER vs TIGER, 8 x 1,024 items, d 768).
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
BT="python3 benchmarks/bench_train.py --preset gpu-base"
COMMON="model.dropout=0.0 model.attn_impl=triton objective.w_item=0 objective.w_action=0"
D768="model.d_model=768 model.n_heads=12 model.d_ff=3072"
timeout 200 $BT runs/beauty --synthetic 8x1024 --steps 10 --warmup 5 --profile 3 --variants pinger,tiger $D768 $COMMON 2>&1 | grep -v Warn
