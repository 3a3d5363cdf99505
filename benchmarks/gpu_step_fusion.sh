#!/usr/bin/env bash
# One device call (issue 5, twenty-second session; ~5 min): SID fusion from codes (the SID tokens' keys and
# values projected once per codebook row) on the GPU: its test, bench_fusion at 8,192 items, then the full
# training step at 8 x 1,024 items, PinGER against the TIGER layout (d 768, 12 x 64, 4 layers, SID loss only),
# eager and compiled, with one traced compiled step per variant broken down by call site and by kernel.
# Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
step_workdir
TRITON_INTERPRET=0 timeout 60 python3 -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" \
  tests/model/test_fusion.py 2>&1 | tail -3
timeout 60 python3 benchmarks/bench_fusion.py --items 8192 --iters 20
bench_step eager 120 $WD --synthetic 8x1024 --steps 10 --warmup 5 --variants pinger,tiger $D768 $COMMON
bench_step compiled 200 $WD --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger,tiger --trace $OUT/ctrace \
  $D768 $COMMON train.compile=true
for v in pinger tiger; do
  [ -f $OUT/ctrace.$v.json ] || continue
  python3 benchmarks/trace_breakdown.py $OUT/ctrace.$v.json --depth 3 --top 20 --kernels
  gzip -f $OUT/ctrace.$v.json
done
