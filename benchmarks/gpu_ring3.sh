#!/usr/bin/env bash
# One device call (issue 5, twentieth session): does a third ring slot feed the forward's step? First the
# step probe with 2- and 3-slot K/V rings (benchmarks/probe_mma_rate.py), then an in-process A/B of the
# nineteenth session's forward with its own K/V on the ring (7968328, 80 KB at 2 slots, so 3 slots fit
# two programs per SM at head dim 128) against this checkout's: `git show 7968328:src/genrec/kernels/
# item_block_sm90.py > old_sm90.py` first (untracked; delete it after).
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 150 python3 benchmarks/probe_mma_rate.py --ring-only --ring-stages 2,3 2>&1 | grep -v -i warn | tee $OUT/ring3.log
for s in 3 2; do
  timeout 150 python3 benchmarks/ab_sm90.py old_sm90.py --full --rounds 7 --old-set sm90_fwd=64,64,4,$s 2>&1 \
    | grep -v -i warn | tee -a $OUT/ab_ring.log
done
timeout 120 python3 benchmarks/ab_sm90.py old_sm90.py --full --rounds 5 --head-dim 64 --old-set sm90_fwd=64,64,4,3,1 2>&1 \
  | grep -v -i warn | tee -a $OUT/ab_ring.log
