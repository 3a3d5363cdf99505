#!/usr/bin/env bash
# One device call, Beauty round 11 (prepared, not yet run): round 10's SID model with dropout 0.5, at
# gpu-base size and at SASRec-CE's (d 128, 2 layers), beside the same-run SASRec-CE; 3 processes x 6 min, compiled,
# annealed to the deadline, early stopping off. See gpu_beauty_round.sh.
TUNE_TIMEOUT=${TUNE_TIMEOUT:-575} GRID=benchmarks/grids/beauty-round11.json PARALLEL=3 THREADS=4 exec bash benchmarks/gpu_beauty_round.sh
