#!/usr/bin/env bash
# One device call (issue 5, sixteenth session): the sm90 kernel tests on the GPU, then
# benchmarks/ab_sm90.py -- this checkout's Gluon kernels against another version of their module, in
# one process, alternated -- at both head dims. Files under $OUT. No wheels needed.
#   git show HEAD~1:src/genrec/kernels/item_block_sm90.py > old_sm90.py   # untracked: it travels
#   bash benchmarks/gpu_ab.sh old_sm90.py [ab_sm90.py options, e.g. --new-set sm90_dq=64,64,4,2,1]
OLD=${1:?usage: bash benchmarks/gpu_ab.sh OLD_item_block_sm90.py [options]}; shift
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py > $OUT/sm90_tests.log 2>&1
echo "sm90 tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/sm90_tests.log | tail -8
for D in 128 64; do
  timeout 150 python3 benchmarks/ab_sm90.py "$OLD" --head-dim $D --rounds 9 "$@" 2>&1 | grep -v -i warn | tee $OUT/ab_$D.log | tail -9
done
