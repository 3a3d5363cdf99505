#!/usr/bin/env bash
# One device call, Beauty round 4: content SIDs vs collaborative SIDs, same run. Three tune_quality
# processes at once on the one GPU (4 training processes, 5 min each): runs/beauty (SASRec-CE, the
# same-run baseline, and PinGER on content SIDs) and runs/beauty-cs1 / -cs2 (the same PinGER on
# collaborative SIDs, `genrec sid build --source content+engagement --engagement-weight 1 / 2`,
# built on the CPU box and carried). Carry .whl, runs/beauty, runs/beauty-cs1/sid, runs/beauty-cs2/sid.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
for w in 1 2; do
  d=runs/beauty-cs$w; ln -sfn $PWD/runs/beauty/tables $d/tables; ln -sfn $PWD/runs/beauty/features $d/features
done
ARGS="--sid-beams 50,100 --l0l1-beam 50 --no-token-sweep --valid-cases 5000 --threads 4"
T=${TUNE_TIMEOUT:-540}
OUT=$OUT/base timeout $T python3 benchmarks/tune_quality.py runs/beauty --grid benchmarks/grids/beauty-csid.json \
  --parallel 2 $ARGS > /tmp/tune_base.log 2>&1 &
for w in 1 2; do
  OUT=$OUT/cs$w timeout $T python3 benchmarks/tune_quality.py runs/beauty-cs$w --grid benchmarks/grids/beauty-csid-collab.json \
    --parallel 1 $ARGS > /tmp/tune_cs$w.log 2>&1 &
done
wait $(jobs -p)  # not a bare wait: that also waits for the tee of the process substitution above
for f in base cs1 cs2; do
  echo "=== $f"; grep -v "Warn\|^\s*$" /tmp/tune_$f.log | grep -v "started\|exited" | tail -16
  cp /tmp/tune_$f.log $OUT/tune_$f.log
done
