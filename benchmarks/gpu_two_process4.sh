#!/usr/bin/env bash
# One device call: the GPU two-process tests (two-process == one-process with the pool on the GPU
# through CUDA IPC, pool smaller than the concurrency, ranker kill -9 under load), then serving at a
# 1,000-item history, beam 60, ranking on: one-process, two-process (pool on the GPU, the default
# there) and two-process with the pool in CPU shared memory; 1 client and 4 clients, 10 s each.
# Carry .whl, runs/beauty, .gpudata (movielens-100k for the test fixture).
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/serve/test_two_process.py \
  tests/serve/test_kv_pool.py 2>&1 | grep -v Warn | tail -8
WD=runs/beauty-serve; train_serve_model
for c in 1 4; do for m in one two twocpu; do
  [ $c = 4 ] && [ $m = twocpu ] && continue
  timeout 120 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
    --duration 10 --concurrency $c --modes $m > /tmp/bench_$m$c.log 2>&1
  echo "$m, $c client(s): $(grep -v 'INFO\|Warn' /tmp/bench_$m$c.log | tail -1)"
  grep -n "Error\|degraded\b\|ranking failed" /tmp/bench_$m$c.log | grep -v "site-packages\|| mode" | head -6
done; done
