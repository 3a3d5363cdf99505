#!/usr/bin/env bash
# One device call (issue 5, seventeenth session): more tiles for the Gluon kernels at head dim 128 --
# dense dk/dv with K in registers and with 128 keys on 8 warps (two warp groups sharing each Q/dO
# tile), dq with Q and dO in registers -- checked against the fp32 reference, then timed per kernel
# beside the current ones (probe_sm90.py). No wheels needed.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 500 python3 benchmarks/probe_sm90.py --head-dims 128 --out $OUT/sweep128.json \
  --add 128:sm90_dense_kv=64,32,4,3,1 --add 128:sm90_dense_kv=128,32,8,3 --add 128:sm90_dense_kv=128,32,8,3,1 \
  --add 128:sm90_dense_kv=128,32,8,2,1 --add 128:sm90_dense_kv=64,16,4,4,1 --add 128:sm90_dq=64,64,4,2,2 \
  --add 128:sm90_fwd=64,32,4,2 "$@" 2>&1 | grep -v -i warn | tee $OUT/sweep128.log | tail -40
echo "probe rc=${PIPESTATUS[0]}"
