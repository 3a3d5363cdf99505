#!/usr/bin/env bash
# One device call (twenty-fifth session; ~9 min): 1) the fix of fd0d96d on the GPU: item_block_attention
# without a configuration in fp32 at head dims 64 and 128 against the reference (it failed to launch at
# 128), and bench_kernels' correctness checks, which stopped there in gpu_acceptance.sh; 2) the full training
# step, PinGER against the TIGER layout at equal context (d 768, 12 x 64, 4 layers, SID loss only), compiled
# with CUDA graphs (mode reduce-overhead), at 8 x 1,024, 2 x 4,096 and 1 x 8,192 items, each pair in one
# process. Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block.py \
  -k "default_config or half_precision or many_blocks or poisoned" 2>&1 | grep -E "^E |passed|failed" | head -12
TRITON_INTERPRET=0 timeout 90 python3 benchmarks/bench_kernels.py --only correctness 2>&1 | grep -E "check|error" | head -20
step_workdir
for shape in 8x1024 2x4096 1x8192; do
  bench_step graphs-$shape 150 $WD --synthetic $shape --steps 20 --warmup 10 --variants pinger,tiger \
    --compile-mode reduce-overhead $D768 $COMMON train.compile=true
done
