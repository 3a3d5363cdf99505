#!/usr/bin/env bash
# One device call (~8 min): (1) the item-block kernel of this commit against the session's starting kernel
# (fd99f80), tuned configurations, same run; (2) the full training step, PinGER against the TIGER layout at
# equal context (synthetic full-length histories, d 768, 12 heads x 64, 4 layers, SID loss only), compiled,
# at 8 x 1,024, 2 x 4,096 and 1 x 8,192 items, and eager at 1 x 8,192. Carry .whl and runs/beauty.
# REPEAT=1 (~4 min): no tests; the kernel and the compiled 1 x 8,192 step only, the step over 40 steps.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
git show fd99f80:src/genrec/kernels/item_block.py > /tmp/item_block_fd99f80.py
[ "${REPEAT:-0}" = 1 ] || TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -p no:logging -m "gpu or not gpu" \
  tests/kernels/test_item_block.py -k "variant or half_precision or poisoned or many_blocks" 2>&1 | grep -E "^E |passed|failed" | head -20
timeout 120 python3 benchmarks/probe_item_block_fwd.py --old fd99f80=/tmp/item_block_fd99f80.py --no-neighbours \
  --iters 50 --out $OUT/probe_fwd.json | tail -14
if [ "${REPEAT:-0}" = 1 ]; then
  bench_step 1x8192-d768-compiled-40 200 runs/beauty --synthetic 1x8192 --steps 40 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
  exit 0
fi
bench_step 1x8192-d768-compiled 170 runs/beauty --synthetic 1x8192 --steps 20 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
bench_step 1x8192-d768-eager 80 runs/beauty --synthetic 1x8192 --steps 20 --warmup 5 --variants pinger,tiger $D768 $COMMON
bench_step 2x4096-d768-compiled 150 runs/beauty --synthetic 2x4096 --steps 20 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
bench_step 8x1024-d768-compiled 140 runs/beauty --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
