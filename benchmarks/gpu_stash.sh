#!/usr/bin/env bash
# One device call (issue 5, twenty-first session): the backward's stash path (dense dk/dv writes dS, dq reads
# it) -- its GPU tests against the fp32 reference, then benchmarks/ab_stash.py (per-launch times and fwd+bwd
# against the tuned configuration, both shapes). No wheels needed (Triton 3.6, the image's).
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py -k "stash or delta" \
  > $OUT/stash_tests.log 2>&1
echo "stash tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" $OUT/stash_tests.log | tail -12
timeout 330 python3 benchmarks/ab_stash.py "$@" 2>&1 | grep -v -i warn | tee $OUT/ab_stash.log | tail -40
