#!/usr/bin/env bash
# One device call (issue 5; prepared in the twenty-first session): dq's dense loop alone with 64 and with 128
# query rows per program (benchmarks/probe_dq_rows.py: a check against torch, then the time per query row at
# both head dims). No wheels needed (Triton 3.6, the image's).
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 300 python3 benchmarks/probe_dq_rows.py --iters 20 2>&1 | grep -v -i warn | tee $OUT/dq_rows.log
