#!/usr/bin/env bash
# One device call, Beauty round 12: round 10's models with train.compile=true, 6.5 min each. See gpu_beauty_round.sh.
GRID=benchmarks/grids/beauty-round12.json PARALLEL=2 THREADS=6 exec bash benchmarks/gpu_beauty_round.sh
