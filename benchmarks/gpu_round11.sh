#!/usr/bin/env bash
# One device call, Beauty round 11 (prepared, not yet run): round 10's SID model (64-code SIDs, w_sid 4)
# with dropout 0.5, at gpu-base size and at SASRec-CE's (d 128, 2 layers), beside the same-run SASRec-CE;
# 3 processes x 7.5 min, annealed to the time budget (train.decay_by=deadline), early stopping off; SID
# beam and L0+L1 chosen on 5,000 validation users; test once.
# Carry .whl, runs/beauty, runs/beauty-cb64/sid (built as in gpu_round8.sh).
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
d=runs/beauty-cb64; ln -sfn $PWD/runs/beauty/tables $d/tables; ln -sfn $PWD/runs/beauty/features $d/features
timeout ${TUNE_TIMEOUT:-575} python3 benchmarks/tune_quality.py $d --grid benchmarks/grids/beauty-round11.json \
  --parallel 3 --sid-beams 100 --l0l1-beam 50 --no-token-sweep --valid-cases 5000 --threads 4 2>&1 \
  | grep -v "Warn\|^\s*$" | grep -v "started" | tail -40
