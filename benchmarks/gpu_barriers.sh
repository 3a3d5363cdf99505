#!/usr/bin/env bash
# One device call (issue 5, nineteenth session): what Triton's CTA barriers in the Gluon kernels' main
# loops cost. benchmarks/ab_sm90.py compiles this checkout's module twice, the second time with every
# `bar.sync 0` inside the three kernels' main loops deleted from the PTX (--strip-loop-barriers; the
# ring's mbarriers still order TMA and MMA), checks the outputs bit for bit over repeated runs, and times
# the two in alternation. No wheels needed.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 TRITON_ALWAYS_COMPILE=1
export TRITON_CACHE_DIR=$(mktemp -d)
M=src/genrec/kernels/item_block_sm90.py
ab() { timeout 150 python3 benchmarks/ab_sm90.py $M --rounds 9 --strip-loop-barriers fwd,dq,dense_kv "$@" 2>&1 | grep -v -i warn; }
echo "== 128, full lengths"; ab --head-dim 128 --full | tee $OUT/bar128.log

echo "== 64, full lengths"; ab --head-dim 64 --full | tee $OUT/bar64.log
