#!/usr/bin/env bash
# One device call: quality ladders (benchmarks/quality_ladder.py), each dataset's rungs at once on the one GPU
# beside the plain SASRec yardstick trained on the same sequences; several datasets run side by side. The SID
# variants a ladder's rungs train on are declared in its "sids" and built by quality_ladder.py.
# Carry .whl and .gpudata: amazon-beauty-2014 and yardstick/*.py copied from ../shared, and P5 exports of
# MovieLens (`genrec data export-p5 movielens-100k .gpudata/p5-ml100k`, likewise p5-mlsmall).
#   RUNS="beauty:configs/ladder-beauty.json ml100k:configs/ladder-ml.json" bash benchmarks/gpu_ladder.sh
# A third field sets overrides for every rung of that ladder (comma-separated), e.g. a shorter time cap so the
# dataset's preparation and scoring fit one device call: "beauty:configs/ladder-beauty.json:train.max_minutes=4.5".
# SID_ARGS replaces the base SIDs' `sid build` options (default: 3 levels; SID_ARGS="--seed 0" gives sid build's defaults).
# NAME synth: `genrec data synth` (SYNTH_ARGS, default --users 1000 --items 10000 --events 2000000) instead of a dataset.
# LADDER_ARGS passes more options to every quality_ladder.py, e.g. LADDER_ARGS="--only pinger-50 pinger-200"; a fourth
# field to one ladder only: "mlsmall:configs/ladder-context.json:train.max_minutes=5:--only,pinger-2000".
# A NAME is a dataset name with any suffix, each its own run directory: seeds side by side, e.g.
#   RUNS="ml100k-s1:configs/ladder-preset.json:train.seed=1:--yardstick-seed,1 ml100k-s2:…:train.seed=2:--yardstick-seed,2"
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
one() {  # NAME LADDER [SET [ARGS]]: prepare the run directory, then the ladder; output in $OUT/NAME.log and NAME/ladder.json
  local name=$1 ladder=$2 wd=runs/$1 p5 prep extra=()
  [ -n "${3:-}" ] && extra=(--set ${3//,/ })
  [ -n "${4:-}" ] && extra+=(${4//,/ })
  case $name in
    beauty*) p5=.gpudata/amazon-beauty-2014; prep="amazon-beauty-2014 $wd"; cb="--codebook-size 64";;
    ml100k*) p5=.gpudata/p5-ml100k; prep="amazon-p5 $wd --source $p5"; cb="";;
    mlsmall*) p5=.gpudata/p5-mlsmall; prep="amazon-p5 $wd --source $p5"; cb="";;
    synth*) p5=; cb="";;  # genrec data synth: long histories (median ~1,200 events), no P5 file: no plain SASRec
  esac
  { if [[ $name = synth* ]]; then python3 -m genrec.cli data synth $wd ${SYNTH_ARGS:---users 1000 --items 10000 --events 2000000}
    else python3 -m genrec.cli data prepare $prep; fi && python3 -m genrec.cli features build $wd \
      && python3 -m genrec.cli sid build $wd ${SID_ARGS:---levels 3 $cb}; } > /tmp/$name.prep.log 2>&1 \
      || { tail -5 /tmp/$name.prep.log; return 1; }
  timeout ${LADDER_TIMEOUT:-560} python3 benchmarks/quality_ladder.py $wd --ladder $ladder --parallel ${PARALLEL:-14} \
    "${extra[@]}" ${LADDER_ARGS:-} ${p5:+--p5 $p5} --yardstick .gpudata/yardstick/sasrec.py --out $OUT/$name 2>&1 | grep -v "Warn\|warn" > $OUT/$name.log
}
pids=()
for spec in ${RUNS:-beauty:configs/ladder-beauty.json}; do one ${spec//:/ } & pids+=($!); done
wait "${pids[@]}"  # these jobs only: a bare `wait` also waits for the log's tee above, which never ends
for spec in ${RUNS:-beauty:configs/ladder-beauty.json}; do echo "== ${spec%%:*}"; grep -v "^trained\|^scored" $OUT/${spec%%:*}.log; done
