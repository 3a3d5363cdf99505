#!/usr/bin/env bash
# One device call, Beauty round 8: the levers of rounds 5-7 together (64-code SIDs, SID loss weight 4,
# item ID vectors for the L0+L1 model) beside the same-run SASRec-CE, 3 processes x 7 min. See gpu_beauty_round.sh.
GRID=benchmarks/grids/beauty-round8.json PARALLEL=3 THREADS=4 TUNE_TIMEOUT=${TUNE_TIMEOUT:-570} exec bash benchmarks/gpu_beauty_round.sh
