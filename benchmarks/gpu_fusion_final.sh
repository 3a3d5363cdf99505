#!/usr/bin/env bash
# One device call (issue 5, twenty-third session; ~9 min): the compiled training step at 8 x 1,024 items after
# the fix of its graph breaks (d 768, 12 x 64, 4 layers, SID loss only): PinGER with SID fusion's kernel,
# PinGER with the attention in PyTorch, TIGER, alternating; then every GPU-marked test and the Triton kernel
# tests compiled for the GPU. Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
step_workdir
S="--synthetic 8x1024 --steps 16 --warmup 8"
bench_step kernel-1 100 $WD $S --variants pinger,tiger $D768 $COMMON train.compile=true
bench_step torch-1 70 $WD $S --variants pinger --fusion codes-torch $D768 $COMMON train.compile=true
bench_step kernel-2 70 $WD $S --variants pinger $D768 $COMMON train.compile=true
unset GENREC_CUDA_GRAPHS
TRITON_INTERPRET=0 timeout 90 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_sid_fusion.py \
  tests/train/test_compile.py tests/kernels/test_model_triton.py -m "gpu or not gpu" > $OUT/first_tests.log 2>&1
echo "compile/fusion/model_triton rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/first_tests.log | tail -6
TRITON_INTERPRET=0 timeout ${TESTS_TIMEOUT:-230} python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests \
  > $OUT/gpu_tests.log 2>&1; echo "pytest -m gpu rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_tests.log | tail -15
