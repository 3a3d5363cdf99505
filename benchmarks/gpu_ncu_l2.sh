#!/usr/bin/env bash
# One device call (issue 5, seventeenth session): is the tuned Gluon forward / dq at 8 x 128 bound by
# the L2 -> SM traffic of its K/V ring? Nsight Compute's speed-of-light and memory-workload sections
# (L2 and L1 throughput, bytes moved) for one launch of each sm90 kernel. Text under $OUT.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for k in fwd dq dense_kv; do
  timeout 120 $NCU --clock-control none -k regex:_sm90_${k}_kernel --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --metrics lts__t_bytes.sum,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,dram__bytes_read.sum,gpu__time_duration.sum \
    python3 benchmarks/ncu_sm90.py > $OUT/l2_${k}.txt 2>&1
  echo "== $k rc=$?"; grep -E "Duration|Throughput|lts__t_bytes|xbar2l1tex|dram__bytes_read|Max Bandwidth|L2 Hit|Busy" $OUT/l2_${k}.txt | head -20
done
