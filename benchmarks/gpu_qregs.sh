#!/usr/bin/env bash
# One device call (issue 5, twentieth session): is the forward's ring-fed step short of shared-memory
# bandwidth? The step probe with its K/V ring, Q in shared memory or in registers (benchmarks/
# probe_mma_rate.py --ring-q-regs 0,1), and the production forward at head dim 128 with Q in registers
# (ab_sm90.py: the same module both sides, --new-set); then the same-run table (gpu_sm90.sh).
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 100 python3 benchmarks/probe_mma_rate.py --ring-only --ring-q-regs 0,1 2>&1 | grep -v -i warn | tee $OUT/qregs.log
timeout 120 python3 benchmarks/ab_sm90.py src/genrec/kernels/item_block_sm90.py --full --rounds 7 \
  --new-set sm90_fwd=64,64,4,2,1 2>&1 | grep -v -i warn | tee -a $OUT/qregs.log
bash benchmarks/gpu_sm90.sh
