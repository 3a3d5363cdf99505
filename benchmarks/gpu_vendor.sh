#!/usr/bin/env bash
# One device call (issue 5, twenty-eighth session; ~6 min, no wheels): where genrec's training attention stands
# against the fastest vendor kernels on the same GPU in the same process, then the same-run table again.
# 1) probe_vendor_dense.py: SDPA forced to cuDNN / FlashAttention-2 / memory-efficient, and FlexAttention with its
#    causal block mask, on the DENSE PART ALONE (GQA-packed causal attention over n - 1 item positions: a floor for
#    any composition of vendor kernels), beside genrec's whole item-block attention; GPU time from CUDA graphs,
#    the item-block and best vendor rows also sustained 2 s with their SM clock;
# 2) bench_kernels: correctness checks, training attention at both shapes with every peer, ceilings.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
timeout 300 python3 benchmarks/probe_vendor_dense.py --iters 20 --warmup 5 --sustain 2 ${VENDOR_EXTRA:-} 2>&1 | grep -v -i 'warn' > $OUT/vendor.log
echo "vendor rc=${PIPESTATUS[0]}"; grep -E "^  ! " $OUT/vendor.log | head -12; tail -22 $OUT/vendor.log
timeout 320 python3 benchmarks/bench_kernels.py --only correctness,train,ceilings --quick --all-shapes --sustain 2 \
  --iters 20 --warmup 5 2>&1 | grep -v -i 'warn' > $OUT/bench.log
echo "bench rc=${PIPESTATUS[0]}"; grep -E "FAIL" $OUT/bench.log | head -5; tail -30 $OUT/bench.log
