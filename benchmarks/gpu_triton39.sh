#!/usr/bin/env bash
# One device call (issue 5, twentieth session): the Gluon kernels compiled by Triton 3.9 (what CI
# installs) against Triton 3.6 (the GPU image's), on the same GPU. The GPU image has no Triton
# 3.9 and a wheel does not fit a call, so it travels packed (`bash benchmarks/pack_triton.sh` writes
# `.t39/triton39.tar.xz`, ~45 MB; name `.t39` in the call's carry). First the Gluon kernel tests under
# 3.9 on the GPU, then benchmarks/ab_triton.py at both head dims.
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
source benchmarks/t39_env.sh
run39() { PYTHONPATH=$T39:src TRITON_BACKENDS_IN_TREE=1 "$@"; }
run39 python3 -c "import torch, triton; print('triton', triton.__version__, triton.__file__, 'torch', torch.__version__)"
run39 timeout 170 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block_sm90.py \
  > $OUT/tests39.log 2>&1
echo "sm90 tests under 3.9 rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests39.log | tail -8
export PYTHONPATH=src
timeout 250 python3 benchmarks/ab_triton.py --full --rounds 3 --side "3.6=" --side "3.9=$T39" \
  --side "3.9-K-in-regs=$T39;sm90_dense_kv=64,32,4,3,1" 2>&1 | grep -v -i warn | tee $OUT/ab128.log
timeout 120 python3 benchmarks/ab_triton.py --full --rounds 2 --head-dim 64 --side "3.6=" --side "3.9=$T39" \
  2>&1 | grep -v -i warn | tee $OUT/ab64.log
