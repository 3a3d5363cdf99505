#!/usr/bin/env bash
# One device call (~4 min): the graphed-serving GPU tests, then serving with the default CUDA-graph
# mode (every stage graphed) at a 1,000-item history, beam 60, ranking on: in process, then over
# HTTP with 1 and 4 clients (request bodies encoded before the clock starts). Carry .whl and
# runs/beauty. Everything goes to $OUT/run.log.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
echo "== GPU tests"
TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/decode/test_graphs.py ${TESTS_EXTRA:-} \
  tests/model/test_graphs_static.py tests/kernels/test_beam_select.py 2>&1 | tail -2
echo "== serving, default graph mode"
WD=runs/beauty-serve; train_serve_model
timeout 80 python3 benchmarks/bench_recommend.py $WD --device cuda --history-len 1000 --beam-width 60 --n 50 2>&1 | grep -v Warn | tail -2
for c in ${CLIENTS:-1 4}; do
  timeout 100 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
    --duration 20 --concurrency $c --modes one > /tmp/bench_serve.log 2>&1; grep -v "INFO\|Warn" /tmp/bench_serve.log | tail -1
done
