#!/usr/bin/env bash
# One device call (issue 5, nineteenth session): the forward's step alone -- matmuls, then matmuls and
# softmax, from shared memory with no loads -- at 1-3 programs per SM (benchmarks/probe_mma_rate.py).
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 300 python3 benchmarks/probe_mma_rate.py 2>&1 | grep -v -i warn | tee $OUT/mma_rate.log
