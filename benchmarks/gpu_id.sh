#!/usr/bin/env bash
# One device call, Beauty round 5: PinGER with item ID vectors (dropout 0.3 / 0.5) beside the
# content-only PinGER and the SASRec-CE baseline, same run, 4 processes x 5 min; the SID beam and
# the L0+L1 (configuration, fusion weights) chosen on 5,000 validation users; test scored once.
# Carry .whl, runs/beauty. (No background jobs: a bare `wait` also waits for the tee below.)
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
timeout ${TUNE_TIMEOUT:-450} python3 benchmarks/tune_quality.py runs/beauty --grid benchmarks/grids/beauty-id.json \
  --parallel 4 --sid-beams 100 --l0l1-beam 50 --no-token-sweep --valid-cases 5000 --threads 4 2>&1 \
  | grep -v "Warn\|^\s*$" | tail -40
