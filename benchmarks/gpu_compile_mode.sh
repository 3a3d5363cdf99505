#!/usr/bin/env bash
# One device call (twenty-fifth session; ~4 min): train.compile_mode on the GPU. 1) the gpu-marked test that a
# run with mode reduce-overhead (CUDA graphs) logs the same losses as one compiled without graphs, and the other
# compile tests of test_run_variants; 2) `genrec train` itself, gpu-base preset on MovieLens 100K
# (B 256, 50-item contexts), 400 steps, default mode against reduce-overhead: items/s from train_log.jsonl
# after the first 100 steps (compiles included in those). Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" \
  tests/train/test_run_variants.py -k "compile" 2>&1 | grep -E "^E |passed|failed" | head -12
step_workdir
for mode in default reduce-overhead; do
  mkdir -p runs/cm-$mode; for p in tables features sid; do ln -sfn $PWD/$WD/$p runs/cm-$mode/$p; done
  timeout 110 python3 -m genrec.cli train runs/cm-$mode --preset gpu-base --no-resume train.compile_mode=$mode \
    train.total_steps=400 train.log_every=100 train.eval_every=0 train.ckpt_every=0 train.progress=off \
    train.tensorboard=false > $OUT/train-$mode.log 2>&1 || tail -4 $OUT/train-$mode.log
  python3 -c "import json,sys; r=[json.loads(l) for l in open('runs/cm-$mode/train_log.jsonl')]; \
print('$mode', [(x['step'], round(x['items_per_s']), round(x['loss'], 4)) for x in r])"
done
