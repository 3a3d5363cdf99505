#!/usr/bin/env bash
# One device call: the dense dk/dv step with and without dQ's share reduced to global memory by TMA
# (benchmarks/probe_dq_reduce.py: correctness vs torch, then time per step at 1 and 2 programs per SM).
# Needs Triton >= 3.9 Gluon (tma.async_atomic_add): carry `.t39` (made by `bash benchmarks/pack_triton.sh`);
# it is unpacked to /tmp/t39 if not there already and put first on PYTHONPATH with TRITON_BACKENDS_IN_TREE=1.
source benchmarks/t39_env.sh
export PYTHONPATH=$T39:src TRITON_BACKENDS_IN_TREE=1 PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 TRITON_DEFAULT_FP_FUSION=1
timeout 240 python3 benchmarks/probe_dq_reduce.py --steps 1000 2>&1 | grep -v -i warn | tee $OUT/dq_reduce.log
