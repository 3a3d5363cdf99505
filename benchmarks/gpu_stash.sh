#!/usr/bin/env bash
# One device call (issue 5, twenty-first session): the backward's stash path (dense dk/dv writes dS, dq reads
# it) -- each launch against torch (debug_stash.py), its GPU tests against the fp32 reference, then
# benchmarks/ab_stash.py (per-launch times and fwd+bwd against the tuned configuration, both shapes).
# No wheels needed (Triton 3.6, the image's).
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 120 python3 benchmarks/debug_stash.py 2>&1 | tee $OUT/debug.log | grep -v Traceback | tail -12
grep -q "illegal\|rc 1" $OUT/debug.log && { echo "stash launches failed: stopping"; exit 1; }
timeout 110 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py -k "stash or delta" \
  > $OUT/stash_tests.log 2>&1
echo "stash tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^E  " $OUT/stash_tests.log | head -12
timeout 240 python3 benchmarks/ab_stash.py --rounds 3 --iters 10 "$@" 2>&1 | grep -v -i warn | grep -v capture_end | tee $OUT/ab_stash.log | tail -30
