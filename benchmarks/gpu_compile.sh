#!/usr/bin/env bash
# One device call (~7 min): train.compile (torch.compile of the training forward) on the full training step,
# PinGER against the TIGER layout at equal context (synthetic full-length histories, d 768, 12 heads x 64,
# 4 layers, SID loss only), eager and compiled, and the gpu-base step on Beauty's own batches. First the GPU
# tests of the compiled step and of the one-row SID fusion. Carry .whl and runs/beauty.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=line -m "gpu or not gpu" tests/train/test_compile.py \
  tests/model/test_fusion.py tests/kernels/test_item_block.py::test_opcheck_forward_op \
  tests/kernels/test_item_block.py::test_compiled_op_equals_reference_forward_and_backward 2>&1 | tail -25
bench_step 8x1024-d768-compiled 150 runs/beauty --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
bench_step 2x4096-d768-compiled 150 runs/beauty --synthetic 2x4096 --steps 20 --warmup 10 --variants pinger,tiger $D768 $COMMON train.compile=true
bench_step beauty-gpu-base-eager-triton 60 runs/beauty --steps 100 --warmup 20 --variants pinger variant=pinger objective.item_loss=full objective.w_action=0 objective.w_sid=4.0 model.attn_impl=triton
bench_step beauty-gpu-base-compiled-triton 150 runs/beauty --steps 100 --warmup 40 --variants pinger variant=pinger objective.item_loss=full objective.w_action=0 objective.w_sid=4.0 train.compile=true model.attn_impl=triton
bench_step beauty-gpu-base-eager 60 runs/beauty --steps 100 --warmup 20 --variants pinger variant=pinger objective.item_loss=full objective.w_action=0 objective.w_sid=4.0
bench_step beauty-gpu-base-compiled 150 runs/beauty --steps 100 --warmup 40 --variants pinger variant=pinger objective.item_loss=full objective.w_action=0 objective.w_sid=4.0 train.compile=true
