#!/usr/bin/env bash
# One device call (prepared in the twenty-fifth session, not yet run; ~9 min): whether gpu-base can default to
# train.compile_mode=reduce-overhead. Amazon Beauty (variable-length histories up to 50 items, so several batch
# shapes, each recorded as its own CUDA graph) is prepared here from .gpudata; then `genrec train` (gpu-base,
# PinGER) runs 1,500 steps with a validation every 500 in the default mode and with CUDA graphs: items/s per
# log window, the validation recall at each evaluation (it should match within bf16 noise), peak GPU memory.
# Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
WD=runs/beauty
timeout 150 sh -c "python3 -m genrec.cli data prepare amazon-beauty-2014 $WD && python3 -m genrec.cli features build $WD \
  && python3 -m genrec.cli sid build $WD" > $OUT/prepare.log 2>&1 || { tail -5 $OUT/prepare.log; exit 1; }
for mode in default reduce-overhead; do
  d=runs/beauty-$mode; mkdir -p $d; for p in tables features sid; do ln -sfn $PWD/$WD/$p $d/$p; done
  timeout 170 python3 -m genrec.cli train $d --preset gpu-base --no-resume train.compile_mode=$mode \
    train.total_steps=1500 train.log_every=250 train.eval_every=500 train.ckpt_every=0 train.progress=off \
    train.tensorboard=false data.valid_cases=2000 > $OUT/train-$mode.log 2>&1 || tail -4 $OUT/train-$mode.log
  python3 -c "import json; r=[json.loads(l) for l in open('$d/train_log.jsonl')]; \
print('$mode', [(x['step'], round(x['items_per_s'])) for x in r]); \
e=[json.loads(l) for l in open('$d/eval_log.jsonl')]; \
print('$mode eval', [(x['step'], round(x.get('valid/ann/recall@10', float('nan')), 4), round(x.get('valid/sid/recall@10', float('nan')), 4)) for x in e])"
  grep -i "cudagraph\|re-record\|recompil" $OUT/train-$mode.log | sort | uniq -c | head -5
done
