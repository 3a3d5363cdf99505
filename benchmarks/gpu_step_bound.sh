#!/usr/bin/env bash
# One device call (issue 5, twenty-ninth session; ~8 min): can ANY attention kernel bring the full training step
# to >= 1.9x the TIGER layout at the shape? The full step (d 768, 12 x 64, 4 layers, SID loss only, bf16
# autocast, compiled with CUDA graphs: mode reduce-overhead) at 8 x 1,024 items, PinGER, TIGER and PinGER's
# attention-free bound (pinger+noattn: every attention returns V, every other kernel kept), in one process:
#   1) 5 tokens per item (4 SID levels + dense on PinGER's side, 4 levels + disambiguation on TIGER's): the issue's
#      "1,024 history items x 5 input tokens"; MovieLens 100K with 4-level SIDs, built here;
#   2) 4 tokens per item (3 levels), the shape of the earlier sessions' step rows.
# Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
for L in 4 3; do
  WD=runs/step-ml100k-l$L
  timeout 90 python3 -c "from genrec import pipeline as p; p.prepare('$WD', 'movielens-100k'); \
p.build_item_features('$WD'); p.build_semantic_ids('$WD', levels=$L)" > /tmp/wd$L.log 2>&1 || tail -3 /tmp/wd$L.log
  bench_step bound-8x1024-levels$L ${STEP_TIMEOUT:-250} $WD --synthetic 8x1024 --steps 20 --warmup 10 \
    --variants pinger,tiger,pinger+noattn --compile-mode reduce-overhead $D768 $COMMON train.compile=true
done
