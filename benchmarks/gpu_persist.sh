#!/usr/bin/env bash
# One device call (issue 5, nineteenth session): the persistent Gluon forward. The sm90 kernel tests
# on the GPU (persistent variants included), then in-process A/Bs against the previous module
# (old_sm90.py: `git show REV:src/genrec/kernels/item_block_sm90.py > old_sm90.py`, untracked):
# the tuned tiles (one program per block, as before), and the forward on a persistent grid of 2
# programs per SM, at both head dims. Files under $OUT. No wheels needed.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py > $OUT/sm90_tests.log 2>&1
echo "sm90 tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" $OUT/sm90_tests.log | tail -12
ab() { timeout 120 python3 benchmarks/ab_sm90.py old_sm90.py --rounds 7 --full "$@" 2>&1 | grep -v -i warn | tail -8; }
echo "== 128, tuned"; ab --head-dim 128 | tee $OUT/ab128.log
echo "== 128, persistent x2"; ab --head-dim 128 --new-set sm90_fwd=64,64,4,2,0,2 | tee $OUT/ab128p.log
echo "== 64, persistent x2"; ab --head-dim 64 --new-set sm90_fwd=64,64,4,2,1,2 | tee $OUT/ab64p.log
