#!/usr/bin/env bash
# One device call: where does the CUDA-IPC KV pool break (debug_cuda_ipc.py, faulthandler in the
# children), the GPU pool test, then two-process serving on the GPU with the pool in CPU shared
# memory (two) and on the GPU through CUDA IPC (twocuda), beside one-process (one); 1 client, 8 s.
# Carry .whl, runs/beauty.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
timeout 120 python3 benchmarks/debug_cuda_ipc.py
TRITON_INTERPRET=0 timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/serve/test_kv_pool.py 2>&1 | grep -v Warn | tail -4
WD=runs/beauty-serve; train_serve_model
for m in one two twocuda; do
  timeout 150 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
    --duration 8 --concurrency 1 --modes $m > /tmp/bench_$m.log 2>&1
  echo "$m, 1 client: $(grep -v 'INFO\|Warn' /tmp/bench_$m.log | tail -1)"
  grep -n "Error\|degraded because\|ranking failed" /tmp/bench_$m.log | grep -v "site-packages" | head -12
done
