#!/usr/bin/env bash
# One device call (twenty-fourth session; ~9 min): gpu_step_fusion_ab.sh (the compiled training step at
# 8 x 1,024 items with SID fusion's kernel, its attention in PyTorch, and TIGER, three alternated rounds in
# one process), then every test of tests/train/test_compile.py compiled for the GPU (the fast-path trace test
# over the pinger, tiger and dense layouts, with and without candidates, had run on the H200 in its first
# form only). Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
step_workdir
bench_step ab 380 $WD --synthetic 8x1024 --steps 16 --warmup 8 --rounds 3 \
  --variants pinger@codes,pinger@codes-torch,tiger $D768 $COMMON train.compile=true
TRITON_INTERPRET=0 timeout ${COMPILE_TIMEOUT:-150} python3 -m pytest -v -p no:cacheprovider --tb=short \
  tests/train/test_compile.py > $OUT/compile_tests.log 2>&1
echo "compile tests rc=$? passed=$(grep -c ' PASSED' $OUT/compile_tests.log)" \
  "failed=$(grep -c ' FAILED\| ERROR' $OUT/compile_tests.log) skipped=$(grep -c ' SKIPPED' $OUT/compile_tests.log)"
grep -E " (FAILED|ERROR)|^E " $OUT/compile_tests.log | head -10
