#!/usr/bin/env bash
# One device call, Beauty round 10: round 8's SID model (64-code SIDs, w_sid 4) alone beside the same-run
# SASRec-CE, 2 processes x 7.5 min, both annealed to the time budget (train.decay_by=deadline), early stopping off; SID beam and
# L0+L1 chosen on 5,000 validation users; test once. Also, in the background, the item-block kernel's GPU
# tests (short tracebacks). Carry .whl, runs/beauty, runs/beauty-cb64/sid (built as in gpu_round8.sh).
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
(TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block.py \
  > $OUT/item_block_gpu_tests.log 2>&1) &
d=runs/beauty-cb64; ln -sfn $PWD/runs/beauty/tables $d/tables; ln -sfn $PWD/runs/beauty/features $d/features
timeout ${TUNE_TIMEOUT:-575} python3 benchmarks/tune_quality.py $d --grid benchmarks/grids/beauty-round10.json \
  --parallel 2 --sid-beams 100 --l0l1-beam 50 --no-token-sweep --valid-cases 5000 --threads 6 2>&1 \
  | grep -v "Warn\|^\s*$" | grep -v "started" | tail -40
wait $(jobs -p); tail -3 $OUT/item_block_gpu_tests.log
