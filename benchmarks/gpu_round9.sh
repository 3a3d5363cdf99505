#!/usr/bin/env bash
# One device call, Beauty round 9: round 8's SID model (64-code SIDs, w_sid 4) alone beside the same-run
# SASRec-CE, 2 processes x 7.5 min, both annealed to the time budget (train.decay_by=deadline), and the
# item-block kernel's GPU tests in the background. See gpu_beauty_round.sh.
GRID=benchmarks/grids/beauty-round9.json PARALLEL=2 THREADS=6 GPU_TESTS=1 exec bash benchmarks/gpu_beauty_round.sh
