#!/usr/bin/env bash
# One device call (issue 5, twenty-second session; ~5 min): where the full training step's time goes at
# 8 x 1,024 items, PinGER against the TIGER layout at equal context (d 768, 12 x 64, 4 layers, SID loss
# only; synthetic full-length histories). 1) eager, with the forward / backward / optimiser split and one
# traced step per variant, charged to genrec call sites by benchmarks/trace_breakdown.py; 2) compiled
# (train.compile=true), both variants; 3) compiled PinGER without SID fusion. Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
step_workdir
bench_step eager 150 $WD --synthetic 8x1024 --steps 10 --warmup 5 --variants pinger,tiger --trace $OUT/trace $D768 $COMMON
for v in pinger tiger; do
  [ -f $OUT/trace.$v.json ] || continue
  python3 benchmarks/trace_breakdown.py $OUT/trace.$v.json --depth 3 --top 25
  gzip -f $OUT/trace.$v.json
done
bench_step compiled 150 $WD --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
bench_step compiled-nofusion 120 $WD --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger $D768 $COMMON train.compile=true model.sid_fusion=false
