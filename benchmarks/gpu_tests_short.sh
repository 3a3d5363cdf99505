#!/usr/bin/env bash
# A short device call (~3 min): the GPU tests the twenty-second and twenty-third sessions' calls ran out of
# time for -- the compiled PinGER forward with both fast paths as one graph, the model on the Triton
# kernels, then the rest of tests/train/test_compile.py. Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
export TRITON_INTERPRET=0
t() { echo "== $*"; timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" "$@" 2>&1 \
  | grep -E "^E |^(FAILED|ERROR)|passed|failed" | head -8; }
t tests/train/test_compile.py -k fast_paths
t tests/kernels/test_model_triton.py
t tests/train/test_compile.py -k "not fast_paths"
