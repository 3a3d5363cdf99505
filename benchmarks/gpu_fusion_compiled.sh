#!/usr/bin/env bash
# One device call (issue 5, twenty-third session; ~5 min): why the compiled PinGER step measured ~36 ms in
# gpu_fusion_kernel.sh (20.7-21.8 ms in the twenty-second session). The compiled step at 8 x 1,024 items with
# dynamo's recompile and graph-break logs, for each SID fusion path: the kernel, the attention in PyTorch,
# and the embedded path (code unchanged since the twenty-second session); then TIGER. Full logs in $OUT.
# Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
step_workdir
for f in codes codes-torch embedded; do
  echo "== $f"
  TORCH_LOGS=recompiles,graph_breaks timeout 100 $BT $WD --synthetic 8x1024 --steps 20 --warmup 10 --variants pinger \
    --fusion $f $D768 $COMMON train.compile=true > $OUT/diag-$f.log 2>&1
  grep -ciE "recompil|graph break" $OUT/diag-$f.log; grep -iE "recompil|graph break" $OUT/diag-$f.log | head -4 | cut -c1-300
  tail -2 $OUT/diag-$f.log
done
bench_step tiger 90 $WD --synthetic 8x1024 --steps 20 --warmup 10 --variants tiger $D768 $COMMON train.compile=true
