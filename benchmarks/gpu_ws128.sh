#!/usr/bin/env bash
# One device call (issue 5, nineteenth session): the 128-key, two-block forward prototype
# (benchmarks/probe_ws_fwd128.py) checked against the fp32 reference, then timed against the
# production forward at B 8 x 1,024 items x 5 tokens, 8 heads of 128. No wheels needed.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv
timeout 400 python3 benchmarks/probe_ws_fwd128.py "$@" 2>&1 | grep -v -i warn | tee $OUT/ws128.log
echo "probe rc=${PIPESTATUS[0]}"
