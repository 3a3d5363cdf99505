#!/usr/bin/env bash
# One device call, Beauty round 7: two tune_quality processes at once (3 training processes, 7 min
# each): runs/beauty (SASRec-CE, the same-run baseline, and PinGER with SID loss weight 8) and
# runs/beauty-cb64 (PinGER with SID loss weight 4 on 64-code SIDs, `genrec sid build --codebook-size
# 64`, built on the CPU box and carried). Carry .whl, runs/beauty, runs/beauty-cb64/sid.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
d=runs/beauty-cb64; ln -sfn $PWD/runs/beauty/tables $d/tables; ln -sfn $PWD/runs/beauty/features $d/features
ARGS="--sid-beams 100 --l0l1-beam 50 --no-token-sweep --valid-cases 5000 --threads 4"
T=${TUNE_TIMEOUT:-570}
OUT=$OUT/base timeout $T python3 benchmarks/tune_quality.py runs/beauty --grid benchmarks/grids/beauty-sidpath2.json \
  --parallel 2 $ARGS > /tmp/tune_base.log 2>&1 &
OUT=$OUT/cb64 timeout $T python3 benchmarks/tune_quality.py runs/beauty-cb64 --grid benchmarks/grids/beauty-cb64.json \
  --parallel 1 $ARGS > /tmp/tune_cb64.log 2>&1 &
wait $(jobs -p)  # not a bare wait: that also waits for the tee of the process substitution above
for f in base cb64; do
  echo "=== $f"; grep -v "Warn\|^\s*$" /tmp/tune_$f.log | grep -v "started\|exited" | tail -16
  cp /tmp/tune_$f.log $OUT/tune_$f.log
done
