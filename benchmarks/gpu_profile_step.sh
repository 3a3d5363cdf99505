#!/usr/bin/env bash
# One device call: torch.profiler tables of the full training step (PinGER vs TIGER, 8 x 1,024 items, d 768).
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
timeout 200 $BT runs/beauty --synthetic 8x1024 --steps 10 --warmup 5 --profile 3 --variants pinger,tiger $D768 $COMMON 2>&1 | grep -v Warn
