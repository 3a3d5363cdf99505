#!/usr/bin/env bash
# One device call: the Beauty tuning grid (all configurations at once on the GPU), then the test
# split once for each family's validation-chosen configuration, then the token-efficiency sweep.
# Carries the prepared run directory runs/beauty (tables, features, SIDs) from the build machine.
source benchmarks/gpu_env.sh || exit 1
timeout ${TUNE_TIMEOUT:-575} python3 benchmarks/tune_quality.py runs/beauty --grid ${GRID:-benchmarks/grids/beauty.json} \
  --parallel ${PARALLEL:-8} ${TUNE_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/tune.log" | tail -60
