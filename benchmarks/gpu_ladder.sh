#!/usr/bin/env bash
# One device call: the quality ladder (benchmarks/quality_ladder.py) on Amazon Beauty, all rungs at once on
# the one GPU beside the plain SASRec yardstick. Carry .whl and .gpudata (amazon-beauty-2014 and
# yardstick/sasrec.py copied from ../shared). LADDER, PARALLEL and extra SET overrides from the environment.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
DATA=${DATA:-amazon-beauty-2014}; WD=runs/${DATA}
python3 -m genrec.cli data prepare $DATA $WD >/dev/null && python3 -m genrec.cli features build $WD >/dev/null \
  && python3 -m genrec.cli sid build $WD --codebook-size ${CODEBOOK:-64} >/dev/null || exit 1
timeout ${LADDER_TIMEOUT:-560} python3 benchmarks/quality_ladder.py $WD --ladder ${LADDER:-configs/ladder-beauty.json} \
  --parallel ${PARALLEL:-14} --p5 .gpudata/${P5:-$DATA} --yardstick .gpudata/yardstick/sasrec.py ${SET:+--set $SET} 2>&1 \
  | grep -v "Warn\|warn"
