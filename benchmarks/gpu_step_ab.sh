#!/usr/bin/env bash
# One device call (issue 5, twenty-second session; ~6 min; its 200 s for the tests was too short; `gpu_tests.sh` runs them all): the GPU-marked tests of the model, training,
# decoding and serving (SID fusion now runs from codes), then an A/B of SID fusion's two paths in the full
# training step at 8 x 1,024 items (compiled, d 768, 12 x 64, 4 layers, SID loss only), TIGER in the same
# call, each side twice, alternating. Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
step_workdir
TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/model tests/train \
  tests/decode tests/serve tests/kernels/test_model_triton.py 2>&1 | grep -E "^E |passed|failed|error" | head -15
for r in 1 2; do
  bench_step codes-$r 110 $WD --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
  bench_step embedded-$r 90 $WD --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger --fusion embedded $D768 $COMMON train.compile=true
done
