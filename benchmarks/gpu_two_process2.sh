#!/usr/bin/env bash
# One short device call: the CUDA-IPC KV pool test, then two-process serving on the GPU (the ranking
# process now ranks on the pool's GPU, K/V through CUDA IPC), 1 client, 8 s. Carry .whl, runs/beauty.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
TRITON_INTERPRET=0 timeout 70 python3 -m pytest -q -p no:cacheprovider -m gpu tests/serve/test_kv_pool.py 2>&1 | grep -v Warn | tail -4
WD=runs/beauty-serve; train_serve_model
timeout 90 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
  --duration 8 --concurrency 1 --modes two > /tmp/bench_serve.log 2>&1
echo "two-process, 1 client: $(grep -v 'INFO\|Warn' /tmp/bench_serve.log | tail -1)"
grep -n "Error" -B 6 /tmp/bench_serve.log | grep -v "^.*site-packages" | head -30
