#!/usr/bin/env bash
# One device call (issue 5, twentieth session): the SM clock and power draw under each training-attention
# workload, sustained for 4 s (benchmarks/probe_clocks.py). No wheels needed.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 200 python3 benchmarks/probe_clocks.py 2>&1 | grep -v -i warn | tee $OUT/clocks.log
