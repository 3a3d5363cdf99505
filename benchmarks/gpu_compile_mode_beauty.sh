#!/usr/bin/env bash
# One device call (~4-5 min a mode): whether gpu-base can default to train.compile_mode=reduce-overhead.
# Amazon Beauty (variable-length histories up to 50 items, so several batch shapes: each a dynamic-shape
# recompile, and under reduce-overhead each its own CUDA graph) is prepared here from .gpudata (skipped when
# runs/beauty is already there on a warm machine); then `genrec train` (gpu-base, PinGER) runs STEPS steps
# (default 1,500) with a validation every 500, once per mode in MODES (default: "default reduce-overhead"):
# items/s per log window and the validation recall at each evaluation (it should match within bf16 noise).
# Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee -a "$OUT/run.log") 2>&1
WD=runs/beauty
if [ ! -d $WD/sid ]; then
  timeout 150 sh -c "python3 -m genrec.cli data prepare amazon-beauty-2014 $WD && python3 -m genrec.cli features build $WD \
    && python3 -m genrec.cli sid build $WD" > $OUT/prepare.log 2>&1 || { tail -5 $OUT/prepare.log; exit 1; }
fi
for mode in ${MODES:-default reduce-overhead}; do
  d=runs/beauty-$mode; rm -rf $d; mkdir -p $d; for p in tables features sid; do ln -sfn $PWD/$WD/$p $d/$p; done
  t0=$(date +%s)
  timeout ${TRAIN_TIMEOUT:-170} python3 -m genrec.cli train $d --preset gpu-base --no-resume train.compile_mode=$mode \
    train.total_steps=${STEPS:-1500} train.log_every=250 train.eval_every=500 train.ckpt_every=0 train.progress=off \
    train.tensorboard=false data.valid_cases=2000 > $OUT/train-$mode.log 2>&1 || tail -4 $OUT/train-$mode.log
  echo "$mode: wall $(( $(date +%s) - t0 )) s"
  python3 -c "import json; r=[json.loads(l) for l in open('$d/train_log.jsonl')]; \
print('$mode', [(x['step'], round(x['items_per_s'])) for x in r if 'items_per_s' in x]); \
e=[json.loads(l) for l in open('$d/eval_log.jsonl')]; \
print('$mode eval', [(x['step'], round(x.get('valid/ann/recall@10', float('nan')), 4), round(x.get('valid/sid/recall@10', float('nan')), 4)) for x in e])"
  grep -i "cudagraph\|re-record\|recompil" $OUT/train-$mode.log | sort | uniq -c | head -5
done
