#!/usr/bin/env bash
# One device call (issue 5, twenty-second session; ~7 min): 1) SID fusion's GPU time, from codes against
# embedded codes (bench_fusion, 8,192 items); 2) the full training step at 8 x 1,024 items, PinGER against the
# TIGER layout (d 768, 12 x 64, 4 layers, SID loss only), compiled with torch's default mode and with
# mode=reduce-overhead (CUDA graphs), same call; 3) the same at 1 x 8,192 items with CUDA graphs.
# Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
step_workdir
timeout 60 python3 benchmarks/bench_fusion.py --items 8192 --iters 10
bench_step compiled 150 $WD --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
echo "== graphs (reduce-overhead)"; mkdir -p $OUT/graphs
OUT=$OUT/graphs TORCH_LOGS=perf_hints timeout 170 $BT $WD --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger,tiger \
  --compile-mode reduce-overhead $D768 $COMMON train.compile=true > $OUT/graphs.log 2>&1
grep -i "skipping cudagraph\|cudagraph" $OUT/graphs.log | sort | uniq -c | head -8; tail -3 $OUT/graphs.log
echo "== graphs 1x8192"; mkdir -p $OUT/graphs8192
OUT=$OUT/graphs8192 timeout 150 $BT $WD --synthetic 1x8192 --steps 20 --warmup 10 --variants pinger,tiger \
  --compile-mode reduce-overhead $D768 $COMMON train.compile=true 2>&1 | grep -v -i warn | tail -3
