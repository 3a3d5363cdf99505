#!/usr/bin/env bash
# One device call, Beauty round 8: the levers of rounds 5-7 together (64-code SIDs, SID loss weight 4,
# item ID vectors for the L0+L1 model) beside the same-run SASRec-CE, 3 processes x 7 min; SID beam
# and L0+L1 chosen on 5,000 validation users; test once. Carry .whl, runs/beauty, runs/beauty-cb64/sid.
# Built beforehand on any machine (GENREC_DATA_DIR=../shared/datasets):
#   genrec data prepare amazon-beauty-2014 runs/beauty && genrec features build runs/beauty && genrec sid build runs/beauty
#   mkdir -p runs/beauty-cb64 && ln -sfn $PWD/runs/beauty/tables runs/beauty-cb64/tables \
#     && ln -sfn $PWD/runs/beauty/features runs/beauty-cb64/features && genrec sid build runs/beauty-cb64 --codebook-size 64
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
d=runs/beauty-cb64; ln -sfn $PWD/runs/beauty/tables $d/tables; ln -sfn $PWD/runs/beauty/features $d/features
timeout ${TUNE_TIMEOUT:-570} python3 benchmarks/tune_quality.py $d --grid benchmarks/grids/beauty-round8.json \
  --parallel 3 --sid-beams 100 --l0l1-beam 50 --no-token-sweep --valid-cases 5000 --threads 4 2>&1 \
  | grep -v "Warn\|^\s*$" | grep -v "started" | tail -30
