#!/usr/bin/env bash
# One device call (~9 min) for what the third session could not measure: GPU tests of the graphed
# serving paths; the training kernel (tuned vs original vs FlexAttention vs causal SDPA, eager and
# graph-replayed) and the cascade kernel; the sync-free CSR trie step; the training step (one host
# sync instead of ~40) PinGER vs TIGER; serving at a 1,000-item history, beam 60, with CUDA graphs
# all / sid / off in process, then over HTTP with one client. Carry .whl and runs/beauty.
source benchmarks/gpu_env.sh || exit 1
TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/decode/test_graphs.py \
  tests/model/test_graphs_static.py tests/kernels/test_beam_select.py 2>&1 | tail -4 | tee "$OUT/gpu_tests.log"
timeout 170 python3 benchmarks/bench_kernels.py --only train,cascade,ceilings --quick --iters 10 --warmup 3 \
  > "$OUT/bench_kernels.log" 2>&1; tail -24 "$OUT/bench_kernels.log"
timeout 60 python3 benchmarks/bench_decode.py --only trie --iters 20 --warmup 5 2>&1 | grep "trie beams" | tee "$OUT/trie.log"
timeout 80 python3 benchmarks/bench_train.py runs/beauty --preset gpu-base --steps 20 --warmup 5 --variants pinger,tiger \
  model.attn_impl=triton 2>&1 | tail -3 | tee "$OUT/bench_train.log"
WD=runs/beauty-serve; train_serve_model
for g in all sid off; do
  echo "== GENREC_CUDA_GRAPHS=$g"
  GENREC_CUDA_GRAPHS=$g timeout 70 python3 benchmarks/bench_recommend.py $WD --device cuda --history-len 1000 --beam-width 60 --n 50 2>&1 | grep -v Warn | tail -2 | tee "$OUT/bench_recommend_$g.log"
done
GENREC_CUDA_GRAPHS=all timeout 90 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
  --duration 20 --concurrency 1 --modes one > "$OUT/bench_serve.log" 2>&1; grep -v "INFO\|Warn" "$OUT/bench_serve.log" | tail -4
