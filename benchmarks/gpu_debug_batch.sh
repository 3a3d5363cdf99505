#!/usr/bin/env bash
# One device call (~4 min): why micro-batched serving failed on the GPU (500s under batch8):
# batched recommend() on the graphed path vs single requests, from one thread and four; then the
# batch8 server with its log kept; then the 1-client HTTP runs again (raw, httpx) back to back.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
WD=runs/beauty-serve; train_serve_model
timeout 150 python3 benchmarks/debug_batch_gpu.py $WD 2>&1 | grep -v Warn | head -80
timeout 100 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
  --duration 10 --concurrency 4 --modes batch8 > /tmp/bench_serve.log 2>&1
grep -v "INFO\|Warn" /tmp/bench_serve.log | tail -1
grep -n "Traceback" -A 40 /tmp/bench_serve.log | head -60
for c in raw httpx raw; do
  timeout 100 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
    --duration 15 --concurrency 1 --modes one --client $c > /tmp/bs.log 2>&1; echo "$c: $(grep -v 'INFO\|Warn' /tmp/bs.log | tail -1)"
done
