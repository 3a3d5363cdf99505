#!/usr/bin/env bash
# One device call (issue 5, twentieth session): what the forward's K/V ring costs its step, by warp
# stall reason -- Nsight Compute on the step probe with and without the ring (benchmarks/
# probe_mma_rate.py --launch-only: head dim 128, 64 keys, softmax, 2 programs per SM, 500 steps).
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for k in _step_kernel _ring_kernel; do
  timeout 200 $NCU --clock-control none -k regex:$k --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
    python3 benchmarks/probe_mma_rate.py --launch-only --steps 500 > $OUT/ncu$k.log 2>&1
  echo "== $k rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued|stalled" $OUT/ncu$k.log \
    | awk '$NF+0 >= 0.05 || !/stalled/' | head -40
done
