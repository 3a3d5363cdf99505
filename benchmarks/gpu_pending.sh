#!/usr/bin/env bash
# One device call (prepared in the twenty-fifth session, not yet run; ~4 min): what that session changed after
# its last device call. 1) The cascade kernel per call as the model's decode calls it (inputs trusted: no
# range-check sync) beside the per-call row with the check (now one sync, was two), against per-beam
# attention (bench_kernels --only cascade); 2) beam search over a cached 1,000-item history with each search's
# measured peak GPU memory, shared history against the per-beam copy, at W = 10 / 30 / 60 / 100 / 400
# (bench_decode --only beam); 3) the cascade and reference tests on the GPU. Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
export TRITON_INTERPRET=0
timeout 120 python3 benchmarks/bench_kernels.py --only cascade --quick --iters 20 --warmup 5 2>&1 | grep -v -i warn | tail -14
timeout 200 python3 benchmarks/bench_decode.py --only beam --iters 10 --warmup 3 2>&1 | grep -v -i warn | tail -8
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_cascade.py tests/kernels/test_reference.py \
  2>&1 | grep -E "^E |passed|failed" | head -8
