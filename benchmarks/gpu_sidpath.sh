#!/usr/bin/env bash
# One device call, Beauty round 6: SID loss weight 2 and 4 for PinGER (content-only winner otherwise
# unchanged) beside the same-run SASRec-CE baseline, 3 processes x 7 min; SID beam and L0+L1 fusion
# chosen on 5,000 validation users; test scored once. Carry .whl, runs/beauty.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
timeout ${TUNE_TIMEOUT:-570} python3 benchmarks/tune_quality.py runs/beauty --grid benchmarks/grids/beauty-sidpath.json \
  --parallel 3 --sid-beams 100 --l0l1-beam 50 --no-token-sweep --valid-cases 5000 --threads 4 2>&1 \
  | grep -v "Warn\|^\s*$" | tail -45
