#!/usr/bin/env bash
# One device call (~8 min): GPU tests of the Triton trie step and the graphed paths; the trie step
# (Triton vs torch ops vs CPU) and the whole SID decode; then serving at a 1,000-item history,
# beam 60, ranking on, every stage graphed: in process (float32, bf16), over HTTP with the raw
# client (float32 and bf16 servers, 1 client), the httpx client for comparison, and 4 clients
# with and without micro-batching (up to 8). Carry .whl and runs/beauty. Everything goes to $OUT/run.log.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
unset GENREC_CUDA_GRAPHS
python3 -c "import uvloop, httptools; print('uvloop', uvloop.__version__, 'httptools', httptools.__version__)"
echo "== GPU tests"
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/decode/test_decode_trie_torch.py \
  tests/decode/test_graphs.py tests/model/test_graphs_static.py tests/kernels/test_beam_select.py 2>&1 | tail -2
echo "== trie step and SID decode"
timeout 150 python3 -m genrec.bench.decode --only trie,sid --iters 20 --warmup 5 2>&1 | grep -v Warn | grep "trie\|SID\|same" | head -20
echo "== serving"
WD=runs/beauty-serve; train_serve_model
timeout 90 python3 benchmarks/bench_recommend.py $WD --device cuda --history-len 1000 --beam-width 60 --n 50 2>&1 | grep -v Warn | tail -2
serve() {  # label, then bench_serve arguments
  local label=$1; shift
  timeout 100 python3 benchmarks/bench_serve.py $WD --device cuda --history-len 1000 --exact-history --beam-width 60 \
    --duration 20 --modes one "$@" > /tmp/bench_serve.log 2>&1; echo "$label: $(grep -v 'INFO\|Warn' /tmp/bench_serve.log | tail -1)"
}
serve "float32, raw client, 1 client" --concurrency 1
GENREC_PRECISION=bf16 serve "bf16, raw client, 1 client" --concurrency 1
serve "float32, httpx client, 1 client" --concurrency 1 --client httpx
serve "float32, raw client, 4 clients" --concurrency 4
serve "float32, raw client, 4 clients, micro-batch 8" --concurrency 4 --modes batch8
