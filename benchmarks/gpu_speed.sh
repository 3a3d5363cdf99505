#!/usr/bin/env bash
# One device call: cascade-attention kernel + H200 ceilings; serving decode speed (beam search
# shared vs copied cache, device trie vs CPU trie, ranking decode vs prefill); then an HTTP load
# run on the GPU at a 1,000-item history, beam 60, ranking on. Needs runs/beauty carried.
source benchmarks/gpu_env.sh || exit 1
if [ -z "$SKIP_BENCH" ]; then
timeout ${KT:-140} python3 benchmarks/bench_kernels.py --only cascade,ceilings --iters 20 --warmup 5 > "$OUT/bench_kernels.log" 2>&1; tail -9 "$OUT/bench_kernels.log"
timeout ${DT:-200} python3 benchmarks/bench_decode.py --iters 10 --warmup 3 2>&1 | grep -v Warn | tee "$OUT/bench_decode.log"
fi
WD=runs/beauty-serve; mkdir -p $WD; for p in tables features sid; do ln -sfn $PWD/runs/beauty/$p $WD/$p; done
python3 -m genrec.cli train $WD --preset gpu-base --no-resume variant=pinger data.context_len=1000 train.total_steps=30 \
  train.eval_every=0 train.ckpt_every=0 train.progress=off train.tensorboard=false data.valid_cases=200 > "$OUT/serve_train.log" 2>&1 || tail -5 "$OUT/serve_train.log"
if [ -z "$SKIP_HTTP32" ]; then
timeout ${ST:-150} python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
  --duration ${DUR:-30} --concurrency 4 --modes ${MODES:-one} > "$OUT/bench_serve_full.log" 2>&1
grep -v "INFO\|Warn" "$OUT/bench_serve_full.log" | tail -${TAILN:-8}
fi
# stage-by-stage in-process latency (batch 1), float32 and bf16; then HTTP again in bf16
timeout ${RT:-120} python3 benchmarks/bench_recommend.py $WD --device cuda --history-len 1000 --beam-width 60 --n 50 2>&1 | grep -v Warn | tail -3 | tee "$OUT/bench_recommend.log"
if [ -n "$SERVE_BF16" ]; then
  GENREC_PRECISION=bf16 timeout ${ST:-150} python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
    --duration ${DUR:-30} --concurrency 4 --modes one > "$OUT/bench_serve_bf16.log" 2>&1
  grep -v "INFO\|Warn" "$OUT/bench_serve_bf16.log" | tail -3
fi
