#!/usr/bin/env bash
# One device call, Beauty round 10: round 9 with early stopping off. See gpu_beauty_round.sh.
GRID=benchmarks/grids/beauty-round10.json PARALLEL=2 THREADS=6 GPU_TESTS=1 exec bash benchmarks/gpu_beauty_round.sh
