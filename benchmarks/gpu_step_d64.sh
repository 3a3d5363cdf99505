#!/usr/bin/env bash
# One device call (issue 5, sixteenth session; ~6 min): the model tests on the GPU (d_model 64 runs
# head dim 64, which ItemBlockConfig.tuned now gives the Gluon kernels; 256 runs head dim 128), then
# the full training step, PinGER against the TIGER layout at equal context (synthetic full-length
# histories, d 768, 12 heads x 64, 4 layers, SID loss only, compiled), at 1 x 8,192 items (and
# 8 x 1,024 with the argument `all`). The workdir (tables, item vectors, SIDs) is built here from MovieLens 100K in .gpudata (carry
# it and .whl): a workdir's Iceberg catalogue records absolute paths, so a copied one does not open.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
step_workdir
TRITON_INTERPRET=0 timeout 130 python3 -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" \
  tests/kernels/test_model_triton.py -k "test_model_forward_backward and 64" 2>&1 | grep -E "^E |passed|failed" | head -12
bench_step 1x8192-d768-compiled 170 $WD --synthetic 1x8192 --steps 20 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
[ "${1:-}" != all ] || bench_step 8x1024-d768-compiled 130 $WD --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
