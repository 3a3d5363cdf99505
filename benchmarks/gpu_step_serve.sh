#!/usr/bin/env bash
# One device call (~6 min): the full training step PinGER vs TIGER at equal context -- synthetic
# full-length histories of 1,024 items (the kernel benchmark's shape: 12 heads of 64) and Beauty's
# 50 items, TIGER's objective (SID loss only) and the joint one, no dropout on either side; then
# serving at a 1,000-item history, beam 60, ranking on, GENREC_CUDA_GRAPHS=all: in process and
# over HTTP (one client). Carry .whl and runs/beauty. Everything goes to $OUT/run.log.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
echo "== GPU tests"
TRITON_INTERPRET=0 timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/model/test_graphs_static.py 2>&1 | tail -2
BT="timeout 150 python3 benchmarks/bench_train.py --preset gpu-base"
BIG="model.d_model=768 model.n_heads=12 model.d_ff=3072 model.dropout=0.0 model.attn_impl=triton"
echo "== training step, synthetic 8 x 1,024 items, d 768, 12 heads x 64, 4 layers"
$BT runs/beauty --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger,tiger $BIG objective.w_item=0 objective.w_action=0 2>&1 | tail -3
$BT runs/beauty --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger $BIG objective.w_action=0 2>&1 | tail -1
echo "== training step, Beauty, 50 items, no dropout"
$BT runs/beauty --steps 30 --warmup 30 --variants pinger,tiger model.dropout=0.0 model.attn_impl=triton objective.w_item=0 objective.w_action=0 2>&1 | tail -2
echo "== serving"
WD=runs/beauty-serve; train_serve_model
GENREC_CUDA_GRAPHS=all timeout 80 python3 benchmarks/bench_recommend.py $WD --device cuda --history-len 1000 --beam-width 60 --n 50 2>&1 | grep -v Warn | tail -2
GENREC_CUDA_GRAPHS=all timeout 100 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
  --duration 20 --concurrency 1 --modes one > /tmp/bench_serve.log 2>&1; grep -v "INFO\|Warn" /tmp/bench_serve.log | tail -3
