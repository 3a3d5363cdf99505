#!/usr/bin/env bash
# One device call (~6 min): GPU tests (graphed serving, the model's Triton path, candidates in the
# item-block path); the training step PinGER vs TIGER on Beauty (50 items) and on MovieLens 100K
# (200 items), joint and SID-only objectives, padded batch shapes, long warm-up; a profile of one
# in-process recommendation (1,000-item history, beam 60, ranking on, GENREC_CUDA_GRAPHS=all).
# Carry .whl, runs/beauty and runs/ml100k. Everything goes to $OUT/run.log.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
echo "== GPU tests"
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/model/test_graphs_static.py \
  tests/kernels/test_model_triton.py tests/kernels/test_item_block_candidates.py 2>&1 | tail -6
BT="timeout 150 python3 benchmarks/bench_train.py --preset gpu-base"
echo "== training step, Beauty, 50 items"
$BT runs/beauty --steps 30 --warmup 30 --variants pinger,tiger model.attn_impl=triton 2>&1 | tail -3
$BT runs/beauty --steps 30 --warmup 30 --variants pinger model.attn_impl=reference 2>&1 | tail -1
$BT runs/beauty --steps 30 --warmup 30 --variants pinger,tiger model.attn_impl=triton objective.w_item=0 objective.w_action=0 2>&1 | tail -2
echo "== training step, MovieLens 100K, 200 items"
$BT runs/ml100k --steps 20 --warmup 20 --variants pinger,tiger model.attn_impl=triton data.context_len=200 2>&1 | tail -3
$BT runs/ml100k --steps 20 --warmup 20 --variants pinger,tiger model.attn_impl=triton data.context_len=200 \
  objective.w_item=0 objective.w_action=0 2>&1 | tail -2
$BT runs/ml100k --steps 20 --warmup 20 --variants pinger model.attn_impl=reference data.context_len=200 2>&1 | tail -1
echo "== serving profile"
WD=runs/beauty-serve; train_serve_model
GENREC_CUDA_GRAPHS=all timeout 100 python3 benchmarks/bench_recommend.py $WD --device cuda --history-len 1000 --beam-width 60 --n 50 \
  --precisions float32 --profile 20 2>&1 | grep -v Warn
