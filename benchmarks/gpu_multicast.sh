#!/usr/bin/env bash
# One device call: TMA multicast over a 2-CTA cluster vs the plain K/V ring (benchmarks/probe_multicast.py; needs
# Triton >= 3.9 Gluon: carry `.t39`, made by `bash benchmarks/pack_triton.sh`).
source benchmarks/t39_env.sh
export PYTHONPATH=$T39:src TRITON_BACKENDS_IN_TREE=1 PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 TRITON_DEFAULT_FP_FUSION=1
timeout 300 python3 benchmarks/probe_multicast.py 2>&1 | grep -v -i warn | tee $OUT/multicast.log
