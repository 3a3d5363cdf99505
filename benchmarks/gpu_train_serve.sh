#!/usr/bin/env bash
# One device call (~7 min): the graphed-serving GPU tests; the training step PinGER vs TIGER with
# a profile of the PinGER step, A/B of the item-block configuration and the reference attention;
# serving at a 1,000-item history, beam 60, ranking on, GENREC_CUDA_GRAPHS=all, in process and
# over HTTP (one client). Carry .whl and runs/beauty. Everything goes to $OUT/run.log.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
echo "== GPU tests (graphs)"
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/decode/test_graphs.py \
  tests/model/test_graphs_static.py tests/kernels/test_beam_select.py 2>&1 | grep -v "^tests.*PASSED" | tail -40
echo "== training step"
timeout 120 python3 benchmarks/bench_train.py runs/beauty --preset gpu-base --steps 20 --warmup 5 --variants pinger,tiger \
  --profile 5 model.attn_impl=triton 2>&1 | grep -v Warn
timeout 60 python3 benchmarks/bench_train.py runs/beauty --preset gpu-base --steps 20 --warmup 5 --variants pinger \
  --item-block original model.attn_impl=triton 2>&1 | tail -2
timeout 60 python3 benchmarks/bench_train.py runs/beauty --preset gpu-base --steps 20 --warmup 5 --variants pinger \
  model.attn_impl=reference 2>&1 | tail -2
timeout 60 python3 benchmarks/bench_train.py runs/beauty --preset gpu-base --steps 20 --warmup 5 --variants pinger \
  model.attn_impl=triton objective.w_item=0 objective.w_action=0 2>&1 | tail -2
echo "== serving"
WD=runs/beauty-serve; train_serve_model
GENREC_CUDA_GRAPHS=all timeout 70 python3 benchmarks/bench_recommend.py $WD --device cuda --history-len 1000 --beam-width 60 --n 50 2>&1 | grep -v Warn | tail -2
GENREC_CUDA_GRAPHS=all timeout 100 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
  --duration 20 --concurrency 1 --modes one > /tmp/bench_serve.log 2>&1; grep -v "INFO\|Warn" /tmp/bench_serve.log | tail -8
GENREC_CUDA_GRAPHS=all timeout 100 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
  --duration 20 --concurrency 4 --modes one > /tmp/bench_serve4.log 2>&1; grep -v "INFO\|Warn" /tmp/bench_serve4.log | tail -4
