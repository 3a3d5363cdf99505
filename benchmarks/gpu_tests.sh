#!/usr/bin/env bash
# Every test marked gpu (two-process serving with the KV pool on the GPU and its warm path, the CUDA-IPC pool,
# CUDA graphs, beam selection, bf16 training, model equivalence on CUDA, the compiled training forward) and
# the Triton kernel tests compiled for the GPU (TRITON_INTERPRET=0). Carry .whl and .gpudata, made here with
# `bash scripts/fetch_gpu_wheels.sh` and `mkdir -p .gpudata && cp -r ../shared/datasets/* .gpudata/`.
#   bash benchmarks/gpu_tests.sh [PART ...]     PART: kernels, rest, fp32 or all (the default: kernels and rest;
#                                               ~8 min, more than one call's limit when the machine starts cold:
#                                               run the halves apart). fp32: the model and kernel tests whose
#                                               fp32 products moved to three TF32 ones (twenty-fourth session)
# The logs are verbose (-v), so a run cut by its timeout still names every test that finished.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
parts=" ${*:-all} "
has() { [[ $parts == *" $1 "* || $parts == *" all "* && $1 != fp32 ]]; }
run() {  # NAME TIMEOUT PYTEST-ARGS...
  local name=$1 t=$2; shift 2
  TRITON_INTERPRET=0 timeout $t python3 -m pytest -v -p no:cacheprovider --tb=short "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$? passed=$(grep -c ' PASSED' $OUT/$name.log) failed=$(grep -c ' FAILED\| ERROR' $OUT/$name.log)" \
    "skipped=$(grep -c ' SKIPPED' $OUT/$name.log)"
  grep -E " (FAILED|ERROR)|^E " $OUT/$name.log | head -10
}
if has fp32; then
  run fp32 ${FP32_TIMEOUT:-240} tests/kernels/test_model_triton.py tests/kernels/test_sid_fusion.py \
    tests/kernels/test_item_block.py
fi
if has kernels; then
  run gpu_kernels ${KERNELS_TIMEOUT:-300} -m gpu tests/kernels
  run kernel_tests 150 tests/kernels/test_item_block_candidates.py tests/kernels/test_cascade.py \
    tests/kernels/test_sid_fusion.py
fi
if has rest; then
  run gpu_rest ${REST_TIMEOUT:-300} -m gpu tests --ignore=tests/kernels
fi
