#!/usr/bin/env bash
# One device call (issue 5, fourteenth session): the Gluon sm90 kernels reading the model's strided
# head-split views through 4-D tensor descriptors: their GPU tests, then probe_sm90.py (checks on both
# layouts, per-kernel timings, fwd+bwd on both layouts). No wheels needed.
export PYTHONPATH=src PYTHONUNBUFFERED=1
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py \
  > $OUT/sm90_tests.log 2>&1; echo "sm90 tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/sm90_tests.log | tail -8
timeout 300 python3 benchmarks/probe_sm90.py --out $OUT/probe_sm90.json --iters 20 --warmup 5 2>&1 \
  | grep -v -i 'warn\|detach\|return float' | tee $OUT/probe.log | tail -45
