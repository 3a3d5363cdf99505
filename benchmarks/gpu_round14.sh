#!/usr/bin/env bash
# One device call, Beauty round 14: SASRec-CE with/without the weight average beside the averaged 64-code SID
# model without and with item ID vectors; 4 processes x 6 min, compiled. See gpu_beauty_round.sh.
GRID=benchmarks/grids/beauty-round14.json PARALLEL=4 THREADS=4 exec bash benchmarks/gpu_beauty_round.sh
