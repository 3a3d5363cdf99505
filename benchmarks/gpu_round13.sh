#!/usr/bin/env bash
# One device call, Beauty round 13: round 12's two models, each with and without the weight average
# (train.ema_decay=0.999); 4 processes x 6 min, compiled. See gpu_beauty_round.sh.
GRID=benchmarks/grids/beauty-round13.json PARALLEL=4 THREADS=4 exec bash benchmarks/gpu_beauty_round.sh
