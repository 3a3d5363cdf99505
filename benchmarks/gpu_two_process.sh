#!/usr/bin/env bash
# One device call (~3 min): the CUDA-IPC KV pool test across processes, then the graphed server in
# two-process mode (retrieval in the HTTP process, ranking in its own, K/V through the CUDA-IPC
# pool) at a 1,000-item history, beam 60, 1 and 4 clients. Carry .whl and runs/beauty.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
echo "== GPU tests"
TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/serve/test_kv_pool.py 2>&1 | tail -2
WD=runs/beauty-serve; train_serve_model
for c in 1 4; do
  timeout 120 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
    --duration 15 --concurrency $c --modes two > /tmp/bench_serve.log 2>&1
  echo "two-process, $c clients: $(grep -v 'INFO\|Warn' /tmp/bench_serve.log | tail -1)"
  grep -n "Error\|Traceback" /tmp/bench_serve.log | head -8
done
