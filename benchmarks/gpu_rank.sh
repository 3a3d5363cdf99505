#!/usr/bin/env bash
# One device call (prepared in the twenty-fourth session, not yet run; ~4 min): the trie step graph-replayed
# (its GPU time per step; the issue aims at <= 0.05 ms), then the ranking levers at the
# issue's 12 layers (bench_decode --only rank: float32/bf16, CUDA graphs on both sides, the masked decode
# against the cascade decode, torch.compile with and without CUDA graphs), after the two fixes that followed
# the session's last call (the cascade decode's range-check syncs, 0bdadff; the cascade kernel as a custom op
# under torch.compile, cc0f5c6; kernels only at the head dims they take, 833ed83); then the ranking, cascade,
# head-dim and serving tests (two-process serving ranks through the new path) on the GPU. Carry .whl and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
timeout 260 python3 benchmarks/bench_decode.py --only trie,rank --iters 20 --warmup 5 2>&1 | grep -v -i warn | tail -34
TRITON_INTERPRET=0 timeout 240 python3 -m pytest -v -p no:cacheprovider --tb=short tests/model/test_rank_cascade.py \
  tests/model/test_graphs_static.py tests/kernels/test_cascade.py tests/kernels/test_model_triton.py \
  tests/serve/test_two_process.py tests/serve/test_kv_pool.py > $OUT/rank_tests.log 2>&1
echo "rank tests rc=$? passed=$(grep -c ' PASSED' $OUT/rank_tests.log) failed=$(grep -c ' FAILED\| ERROR' $OUT/rank_tests.log)"
grep -E " (FAILED|ERROR)|^E " $OUT/rank_tests.log | head -10
