#!/usr/bin/env bash
# One device call (twenty-seventh session, ~8 min): bisect the gap between probe_cascade_host.py and
# `bench kernels` on the cascade's trusted eager call at W = 10 (probe_cascade_gap.py, one process), then the
# bench's cascade rows and table at its defaults (--iters 20 --warmup 5), then the GPU kernel tests (the
# cascade kernel narrows int64 lengths itself since 2cd62a7; not run on the GPU since). Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
export TRITON_INTERPRET=0
timeout 120 python3 benchmarks/probe_cascade_gap.py 2>&1 | grep -v -i warn
timeout 150 python3 benchmarks/bench_kernels.py --only cascade --quick --iters 20 --warmup 5 2>&1 | grep -v -i warn \
  | sed -n '/cascade decode/,$p'
mkdir -p $OUT/tests; OUT=$OUT/tests KERNELS_TIMEOUT=200 bash benchmarks/gpu_tests.sh kernels
