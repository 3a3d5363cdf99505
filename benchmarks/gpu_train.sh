#!/usr/bin/env bash
# One device call: prepare Amazon Beauty, train-throughput benchmark (PinGER vs TIGER layout),
# then the same-run quality table (SASRec-CE bar, genrec PinGER, TIGER layout, popularity).
source benchmarks/gpu_env.sh || exit 1
WD=/tmp/beauty
python3 -m genrec.cli data prepare amazon-beauty-2014 $WD > /dev/null && python3 -m genrec.cli features build $WD > /dev/null \
  && python3 -m genrec.cli sid build $WD | tail -3 || exit 1
python3 benchmarks/bench_train.py $WD --preset gpu-base --steps 30 --warmup 5 --variants pinger,tiger \
  objective.w_action=0 2>&1 | tail -4 | tee "$OUT/bench_train.log"
python3 benchmarks/bench_train.py $WD --preset gpu-base --steps 30 --warmup 5 --variants pinger \
  objective.w_action=0 model.attn_impl=triton 2>&1 | tail -2 | tee -a "$OUT/bench_train.log"
timeout ${QUALITY_TIMEOUT:-380} python3 benchmarks/run_quality.py $WD --preset gpu-base --variants ${VARIANTS:-sasrec,pinger,tiger} \
  train.total_steps=${STEPS:-2500} train.eval_every=0 train.early_stopping.metric= train.early_stopping.patience=0 train.ckpt_every=0 data.valid_cases=2000 objective.w_action=0 \
  2>&1 | grep -v Warning | tail -14 | tee "$OUT/quality.log"
