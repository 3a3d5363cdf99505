#!/usr/bin/env bash
# One device call: per-instruction stall sampling (Nsight Compute source page, SASS) of the tuned
# Gluon kernels at 8 x 128, plus the SpeedOfLight / warp-state summary; CSV files under $OUT.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for k in fwd dq dense_kv; do
  timeout 150 $NCU --clock-control none -k regex:_sm90_${k}_kernel --launch-skip 1 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
    python3 benchmarks/ncu_sm90.py $NCU_ARGS > $OUT/src_${k}.csv 2> $OUT/src_${k}.err
  echo "$k rc=$? lines=$(wc -l < $OUT/src_${k}.csv)"
done
timeout 100 $NCU --clock-control none -k regex:sm90 --launch-skip 3 --launch-count 3 --section WarpStateStats \
  --metrics smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_wait,smsp__pcsamp_warps_issue_stalled_math_pipe_throttle,smsp__pcsamp_warps_issue_stalled_membar,smsp__pcsamp_warps_issue_stalled_short_scoreboard,smsp__pcsamp_warps_issue_stalled_selected,smsp__pcsamp_warps_issue_stalled_lg_throttle,smsp__pcsamp_warps_issue_stalled_mio_throttle,smsp__pcsamp_warps_issue_stalled_dispatch_stall,smsp__pcsamp_warps_issue_stalled_sleeping,smsp__pcsamp_warps_issue_stalled_branch_resolving,smsp__pcsamp_warps_issue_stalled_no_instructions,smsp__pcsamp_warps_issue_stalled_not_selected,smsp__pcsamp_warps_issue_stalled_tex_throttle,smsp__pcsamp_warps_issue_stalled_drain,smsp__pcsamp_warps_issue_stalled_imc_miss \
  python3 benchmarks/ncu_sm90.py $NCU_ARGS > $OUT/stalls.log 2>&1
echo "stalls rc=$?"; grep -E "sm90_|pcsamp" $OUT/stalls.log | head -60
