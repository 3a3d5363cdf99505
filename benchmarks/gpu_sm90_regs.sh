#!/usr/bin/env bash
# One device call (issue 5, fifteenth session): the Gluon kernel tests (register operands and the
# heads-first grid included), the Triton kernels' grid-order variant, then probe_sm90 (checked, then
# timed against the Triton kernels; both grid orders), and Nsight Compute on the tuned Gluon kernels
# (the SM-idle tail shows as SM active cycles below elapsed cycles).
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py \
  tests/kernels/test_item_block.py -k "sm90 or lpt" > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" $OUT/tests.log | tail -8
timeout 330 python3 benchmarks/probe_sm90.py --iters 20 --warmup 5 --out $OUT/probe.json > $OUT/probe.log 2>&1
echo "probe rc=$?"; grep -E "FAIL|checks:|ERROR" $OUT/probe.log | head -20; tail -52 $OUT/probe.log
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ -n "$NCU_ARGS" ]; then
  timeout 120 $NCU --clock-control none -k regex:sm90 --launch-skip 3 --launch-count 3 --section SpeedOfLight \
    python3 benchmarks/ncu_sm90.py $NCU_ARGS > $OUT/ncu.log 2>&1
  echo "ncu rc=$?"; grep -E "sm90_|Duration|Elapsed Cycles|SM Active" $OUT/ncu.log | head -30
fi
