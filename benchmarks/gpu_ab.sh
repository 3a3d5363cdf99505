#!/usr/bin/env bash
# One device call (issue 5, sixteenth session): the sm90 kernel tests on the GPU, then per-kernel GPU
# time of the Gluon kernels, this checkout's against another copy of src (ab/old, e.g. the last
# commit's), alternated twice in the same call; then the stall profile. Files under $OUT.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py > $OUT/sm90_tests.log 2>&1
echo "sm90 tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/sm90_tests.log | tail -8
for r in 1 2; do
  for side in old new; do
    src=$([ $side = old ] && echo ab/old || echo src)
    GENREC_SRC=$src timeout 100 python3 benchmarks/probe_sm90_cost.py --gluon-only "$@" 2>&1 | grep -v -i warn > $OUT/ab_${side}_$r.log
    echo "== $side run $r"; tail -4 $OUT/ab_${side}_$r.log
  done
done
