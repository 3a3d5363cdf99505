#!/usr/bin/env bash
# One device call (issue 5, twenty-third session; ~8 min): SID fusion's attention as a Triton kernel
# (genrec.kernels.sid_fusion). Its tests compiled for the GPU, bench_fusion at 8,192 items (the layer and the
# attention alone, kernel against PyTorch), then the full training step at 8 x 1,024 items (d 768, 12 x 64,
# 4 layers, SID loss only), PinGER with the kernel, PinGER with the attention in PyTorch, and TIGER: eager
# (the default) and compiled, alternating. Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
step_workdir
TRITON_INTERPRET=0 timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" \
  tests/kernels/test_sid_fusion.py tests/model/test_fusion.py 2>&1 | grep -E "^E |passed|failed|error" | head -12
timeout 100 python3 benchmarks/bench_fusion.py --items 8192 --iters 20 2>&1 | grep -v Warn
S="--synthetic 8x1024 --variants pinger"
bench_step eager-kernel 70 $WD $S,tiger --steps 10 --warmup 5 $D768 $COMMON
bench_step eager-torch 50 $WD $S --steps 10 --warmup 5 --fusion codes-torch $D768 $COMMON
bench_step eager-kernel2 50 $WD $S --steps 10 --warmup 5 $D768 $COMMON
bench_step compiled-kernel 110 $WD $S,tiger --steps 20 --warmup 10 $D768 $COMMON train.compile=true
bench_step compiled-torch 90 $WD $S --steps 20 --warmup 10 --fusion codes-torch $D768 $COMMON train.compile=true
