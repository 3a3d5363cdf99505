#!/usr/bin/env bash
# One device call (issue 5, nineteenth session): why the 128-key two-block forward prototype is slower
# than the production forward -- Nsight Compute's speed-of-light and warp-state summaries of both
# (one launch each, clocks left alone) -- then the training-attention table with every peer in the
# same run (benchmarks/gpu_sm90.sh). No wheels needed.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv
for k in _sm90_fwd_kernel _ws_fwd128_kernel; do
  timeout 120 $NCU --clock-control none -k regex:$k --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy \
    python3 benchmarks/probe_ws_fwd128.py --launch-only > $OUT/ncu_$k.log 2>&1
  echo "== $k rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Stall|Block Limit" $OUT/ncu_$k.log | head -30
done
bash benchmarks/gpu_sm90.sh
