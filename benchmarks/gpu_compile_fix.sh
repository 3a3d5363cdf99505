#!/usr/bin/env bash
# One device call (~8 min): torch 2.11's compiled backward on variable-length batches. 1) The repro without
# genrec's compile options (plain model.compile(): mixed-order reduction on) -- it passed on torch 2.11 (the
# twenty-sixth session's call 3): these shapes do not trigger the failure, Beauty's gpu-base run (3) does;
# 2) the compile GPU tests, the variable-length one included, with the options; 3) Beauty under gpu-base's
# default compile mode (gpu_compile_mode_beauty.sh, MODES=default, 1,000 steps). Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
export TRITON_INTERPRET=0
timeout 150 python3 -c "
import sys; sys.path.insert(0, '.')
from tests.train.test_compile import compiled_varlen_steps
try:
    print('without the options:', compiled_varlen_steps({}))
except Exception as e:
    print('without the options: FAILED', type(e).__name__, str(e).splitlines()[0][:160])
" 2>&1 | grep -v -i "warn\|pow_by_natural" | tail -3
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/train/test_compile.py 2>&1 | grep -E "^E |passed|failed" | head -8
MODES=default STEPS=1000 TRAIN_TIMEOUT=200 OUT=$OUT bash benchmarks/gpu_compile_mode_beauty.sh
