#!/usr/bin/env bash
# Short device call: the graphed-decode GPU tests with tracebacks, then the cascade kernel timed
# both per call and from a CUDA-graph replay.
source benchmarks/gpu_env.sh > /dev/null || exit 1
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/decode/test_graphs.py tests/kernels/test_beam_select.py --tb=short 2>&1 | tail -40
timeout 90 python3 benchmarks/bench_kernels.py --only cascade --quick --iters 20 --warmup 5 2>&1 | grep "cascade W=" | tee "$OUT/cascade.log"
