#!/usr/bin/env bash
# One device call (~4 min): the concurrent-capture GPU test with the capture lock, and once with the
# lock disabled (expected to fail: the evidence for the lock); then 4 HTTP clients against the
# graphed server without and with micro-batching (batch8), server log tracebacks printed.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
echo "== GPU tests (capture lock on)"
TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/model/test_graphs_static.py tests/decode/test_graphs.py 2>&1 | tail -2
echo "== the concurrent-capture test with the lock disabled, 3 tries"
for i in 1 2 3; do
TRITON_INTERPRET=0 timeout 60 python3 - <<'PY' 2>&1 | grep -v Warn | tail -1
import contextlib, sys
sys.path.insert(0, "tests/model")
import genrec.model.graphs as g
g._CAPTURE_LOCK = contextlib.nullcontext()
import test_graphs_static as t
try:
    t.test_captures_from_several_threads_at_once(); print("lock off: passed")
except BaseException as e:
    print("lock off: FAILED", type(e).__name__, str(e)[:200].replace("\n", " "))
PY
done
echo "== serving, 4 clients"
WD=runs/beauty-serve; train_serve_model
for m in one batch8; do
  timeout 100 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
    --duration 15 --concurrency 4 --modes $m > /tmp/bench_serve.log 2>&1
  echo "$m: $(grep -v 'INFO\|Warn' /tmp/bench_serve.log | tail -1)"
  grep -n "Error\|Traceback" /tmp/bench_serve.log | head -5
done
