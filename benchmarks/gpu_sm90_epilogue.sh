#!/usr/bin/env bash
# One device call (issue 5, fifteenth session): the Gluon kernel tests on the GPU, probe_sm90 (checked
# against the fp32 reference, then timed against the Triton kernels), and Nsight Compute's
# per-instruction stall sampling of the tuned Gluon kernels (gpu_ncu_source.sh; CSVs under $OUT),
# unless given --no-ncu.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" $OUT/tests.log | tail -8
timeout 250 python3 benchmarks/probe_sm90.py --iters 20 --warmup 5 --out $OUT/probe.json > $OUT/probe.log 2>&1
echo "probe rc=$?"; grep -E "FAIL|checks:|ERROR" $OUT/probe.log | head; grep -E "^(12x64|8x128)" -A1 $OUT/probe.log | grep -v "^--"
[ "$1" = "--no-ncu" ] || { bash benchmarks/gpu_ncu_source.sh > $OUT/ncu_run.log 2>&1; head -4 $OUT/ncu_run.log; }
