#!/usr/bin/env bash
# One device call (prepared in the twenty-third session, not yet run; ~7 min): the compiled training step at
# 8 x 1,024 items (d 768, 12 x 64, 4 layers, SID loss only) with SID fusion's kernel, with its attention in
# PyTorch, and TIGER, alternating three rounds in ONE process (bench_train --rounds), so host noise between
# processes (25% in the twenty-third session) does not decide the A/B. Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
step_workdir
bench_step ab 400 $WD --synthetic 8x1024 --steps 16 --warmup 8 --rounds 3 \
  --variants pinger@codes,pinger@codes-torch,tiger $D768 $COMMON train.compile=true
