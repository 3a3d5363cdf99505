#!/usr/bin/env bash
# One device call: GPU parity tests, then the kernel benchmark (full numbers in $OUT).
source benchmarks/gpu_env.sh || exit 1
python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_model_triton.py tests/model tests/train 2>&1 | tail -12 | tee "$OUT/gpu_tests.log"
timeout 420 python3 benchmarks/bench_kernels.py 2>&1 | tee "$OUT/bench_kernels.log" | tail -45
