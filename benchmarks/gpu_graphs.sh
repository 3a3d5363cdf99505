#!/usr/bin/env bash
# One device call: GPU tests of the graphed SID decode / selection kernel / split cascade, then the
# whole-SID-decode and ranking-lever benchmarks, the cascade kernel, and in-process serving with
# CUDA graphs on vs off at a 1,000-item history, beam 60. Needs runs/beauty and .whl carried.
source benchmarks/gpu_env.sh || exit 1
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/decode/test_graphs.py tests/model/test_graphs_static.py 2>&1 | tail -6 | tee "$OUT/gpu_tests.log"
timeout 200 python3 benchmarks/bench_decode.py --only sid,rank --iters 10 --warmup 3 2>&1 | grep -v Warn | tee "$OUT/bench_decode.log" | tail -12
timeout 60 python3 benchmarks/bench_kernels.py --only cascade --iters 20 --warmup 5 > "$OUT/bench_kernels.log" 2>&1; tail -10 "$OUT/bench_kernels.log"
WD=runs/beauty-serve; mkdir -p $WD; for p in tables features sid; do ln -sfn $PWD/runs/beauty/$p $WD/$p; done
timeout 120 python3 -m genrec.cli train $WD --preset gpu-base --no-resume variant=pinger data.context_len=1000 train.total_steps=30 \
  train.eval_every=0 train.ckpt_every=0 train.progress=off train.tensorboard=false data.valid_cases=200 > "$OUT/serve_train.log" 2>&1 || tail -5 "$OUT/serve_train.log"
for g in all sid off; do
  echo "== GENREC_CUDA_GRAPHS=$g"
  GENREC_CUDA_GRAPHS=$g timeout 100 python3 benchmarks/bench_recommend.py $WD --device cuda --history-len 1000 --beam-width 60 --n 50 2>&1 | grep -v Warn | tail -3 | tee "$OUT/bench_recommend_g$g.log"
done
