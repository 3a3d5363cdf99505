#!/usr/bin/env bash
# One device call (issue 5, nineteenth session): the Gluon forward with the block's own K/V riding the
# dense ring as its last tiles (one loop, no separate in-block buffers: 80 KB instead of 112 at head
# dim 128, 128 registers instead of 186 at head dim 64). The sm90 kernel tests on the GPU, then
# in-process A/Bs against the previous module (old_sm90.py, untracked: `git show
# REV:src/genrec/kernels/item_block_sm90.py > old_sm90.py`) with the tuned tiles and with tiles that
# the smaller footprint lets 3-4 programs share an SM. Files under $OUT. No wheels needed.
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py > $OUT/sm90_tests.log 2>&1
echo "sm90 tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" $OUT/sm90_tests.log | tail -12
ab() { timeout 120 python3 benchmarks/ab_sm90.py old_sm90.py --rounds 7 --full "$@" 2>&1 | grep -v -i warn | grep -E "check|forward|sum|agree|DIFFER|new:"; }
echo "== 128 tuned (64,64,4,2)"; ab --head-dim 128 | tee $OUT/ab128.log
echo "== 128 (64,32,4,2)"; ab --head-dim 128 --new-set sm90_fwd=64,32,4,2 | tee $OUT/ab128_32_2.log
echo "== 128 (64,32,4,3)"; ab --head-dim 128 --new-set sm90_fwd=64,32,4,3 | tee $OUT/ab128_32_3.log
echo "== 64 tuned (64,64,4,2,1)"; ab --head-dim 64 | tee $OUT/ab64.log
echo "== 64 (64,64,4,3,1)"; ab --head-dim 64 --new-set sm90_fwd=64,64,4,3,1 | tee $OUT/ab64_3.log
