#!/usr/bin/env bash
# One device call, one Beauty quality round: `tune_quality.py` over GRID on the 64-code SIDs
# (runs/beauty-cb64, tables and features from runs/beauty), PARALLEL training processes sharing the
# GPU with THREADS CPU threads each; SID beam (100) and L0+L1 chosen on 5,000 validation users;
# test once. GPU_TESTS=1 also runs the item-block kernel's GPU tests in the background.
# Used by gpu_round8.sh ... gpu_round11.sh. Carry .whl, runs/beauty, runs/beauty-cb64/sid.
# Built beforehand on any machine (GENREC_DATA_DIR=../shared/datasets):
#   genrec data prepare amazon-beauty-2014 runs/beauty && genrec features build runs/beauty && genrec sid build runs/beauty
#   mkdir -p runs/beauty-cb64 && ln -sfn $PWD/runs/beauty/tables runs/beauty-cb64/tables \
#     && ln -sfn $PWD/runs/beauty/features runs/beauty-cb64/features && genrec sid build runs/beauty-cb64 --codebook-size 64
: "${GRID:?GRID=benchmarks/grids/....json}" "${PARALLEL:?PARALLEL=processes}" "${THREADS:?THREADS=per process}"
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
if [ "${GPU_TESTS:-0}" = 1 ]; then
  (TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/kernels/test_item_block.py \
    > $OUT/item_block_gpu_tests.log 2>&1) &
fi
d=runs/beauty-cb64; ln -sfn $PWD/runs/beauty/tables $d/tables; ln -sfn $PWD/runs/beauty/features $d/features
timeout ${TUNE_TIMEOUT:-575} python3 benchmarks/tune_quality.py $d --grid $GRID \
  --parallel $PARALLEL --sid-beams 100 --l0l1-beam 50 --no-token-sweep --valid-cases 5000 --threads $THREADS 2>&1 \
  | grep -v "Warn\|^\s*$" | grep -v "started" | tail -40
if [ "${GPU_TESTS:-0}" = 1 ]; then wait $(jobs -p); tail -3 $OUT/item_block_gpu_tests.log; fi
