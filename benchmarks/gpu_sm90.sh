#!/usr/bin/env bash
# One device call (issue 5; fourteenth session, updated in the fifteenth and sixteenth): the
# training-attention benchmark with every peer in the same run (both shapes) and the H200 ceilings,
# then the kernel tests on the GPU (the Gluon sm90 kernels against the reference, plain / registers +
# heads-first / tuned tiles, the Triton lpt variant, the model at head dim 128 in bf16 and fp32).
# Each training row is also timed back to back for 2 s with its SM clock and power (--sustain, twenty-first
# session). No wheels needed.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 320 python3 benchmarks/bench_kernels.py --only correctness,train,ceilings --quick --all-shapes --sustain 2 \
  --iters 20 --warmup 5 2>&1 | grep -v -i 'warn' > $OUT/bench.log
echo "bench rc=$?"; tail -40 $OUT/bench.log
timeout 270 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py \
  tests/kernels/test_item_block.py tests/kernels/test_model_triton.py \
  -k "sm90 or lpt or (test_model_forward_backward and 256)" > $OUT/kernel_tests.log 2>&1
echo "kernel tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/kernel_tests.log | tail -8
