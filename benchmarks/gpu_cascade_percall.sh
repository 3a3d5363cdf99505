#!/usr/bin/env bash
# One device call (prepared in the twenty-sixth session, run in the twenty-seventh: its two bench runs hit their
# 150 s limit, fixed since in `_time_b2b`): why `bench kernels` times the
# cascade's eager call at W = 10 ~1.8x slower than probe_cascade_host.py on the same machine and commit
# (0.147 against 0.0745 ms, inputs trusted). Suspects: GPU clocks (the bench's per-call loop leaves the GPU
# idle between 17 us kernels; the probe interleaves back-to-back bursts), or warm-up length. Runs the probe,
# then the bench's cascade rows with its default warm-up and with 2,000 warm-up calls, each beside a
# 10 ms-interval nvidia-smi clock log; then the new GPU test that trains gpu-base compiled on Amazon Beauty
# (written in the twenty-sixth session after its budget ran out, not yet run on a GPU). Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
export TRITON_INTERPRET=0
clocklog() { nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,pstate --format=csv,noheader -lms 10 > "$OUT/clocks-$1.csv" & echo $!; }
p=$(clocklog probe); python3 benchmarks/probe_cascade_host.py 2>&1 | grep -v -i warn; kill $p
for w in 30 2000; do
  p=$(clocklog bench-w$w)
  timeout 150 python3 benchmarks/bench_kernels.py --only cascade --quick --iters 100 --warmup $w 2>&1 | grep -v -i warn | sed -n '/cascade decode/,/^$/p'
  kill $p
done
for f in "$OUT"/clocks-*.csv; do echo "$f: median SM clock $(cut -d, -f2 "$f" | sort -n | awk '{a[NR]=$1} END {print a[int(NR/2)+1]}')"; done
timeout 280 python3 -m pytest -q -p no:cacheprovider --tb=short tests/train/test_run_variants.py -k amazon_beauty 2>&1 \
  | grep -E "^E |passed|failed" | head -6
