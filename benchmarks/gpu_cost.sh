#!/usr/bin/env bash
# One device call (issue 5, sixteenth session): fixed cost per program against cost per tile for the
# item-block kernels (probe_sm90_cost.py, both head dims), then the per-instruction stall profile of
# the tuned Gluon kernels (gpu_ncu_source.sh). Files under $OUT. No wheels needed.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 200 python3 benchmarks/probe_sm90_cost.py --head-dim 128 "$@" 2>&1 | grep -v -i warn | tee $OUT/cost128.log | tail -9
timeout 120 python3 benchmarks/probe_sm90_cost.py --head-dim 64 2>&1 | grep -v -i warn | tee $OUT/cost64.log | tail -8
bash benchmarks/gpu_ncu_source.sh
