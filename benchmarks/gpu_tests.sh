#!/usr/bin/env bash
# One device call: every test marked gpu (two-process serving with the KV pool on the GPU and its warm
# path, the CUDA-IPC pool, CUDA graphs, beam selection, bf16 training, model equivalence on CUDA) and
# the Triton kernel tests compiled for the GPU (TRITON_INTERPRET=0). Carry .whl and .gpudata, made here with
# `bash scripts/fetch_gpu_wheels.sh` and `mkdir -p .gpudata && cp -r ../shared/datasets/* .gpudata/`.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
TRITON_INTERPRET=0 timeout ${TESTS_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests \
  > $OUT/gpu_tests.log 2>&1; echo "pytest -m gpu rc=$?"
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short \
  tests/kernels/test_item_block_candidates.py tests/kernels/test_cascade.py tests/kernels/test_sid_fusion.py > $OUT/kernel_tests.log 2>&1; echo "kernels rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/kernel_tests.log | tail -8
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_tests.log | tail -15
