#!/usr/bin/env bash
# One device call (twenty-fifth session; ~8 min): issue 5's kernel and serving rows again at one commit.
# 1) genrec bench kernels: the correctness checks, training attention at both shapes (12 x 64 and 8 x 128)
#    with every peer in the same run and each row sustained for 2 s with its clock, cascade attention at
#    W = 10 / 60 / 100 / 400 against per-beam attention, and the H200's ceilings (bf16 matmul, device copy);
# 2) bench_decode's beam search over a cached 1,000-item history and the whole SID decode (B 16, W 200,
#    2,048-item histories; B 1, W 60, 1,000 items), CUDA graph against eager.
# Carry .whl (bench_decode imports genrec's serving code) and .gpudata.
source benchmarks/gpu_env.sh || exit 1
exec > >(tee "$OUT/run.log") 2>&1
export TRITON_INTERPRET=0
timeout 360 python3 benchmarks/bench_kernels.py --only correctness,train,cascade,ceilings --quick --all-shapes \
  --sustain 2 --iters 20 --warmup 5 2>&1 | grep -v -i 'warn' > $OUT/bench_kernels.log
echo "bench_kernels rc=${PIPESTATUS[0]}"; grep -E "check .*FAIL" $OUT/bench_kernels.log | head -5; tail -42 $OUT/bench_kernels.log
timeout 200 python3 benchmarks/bench_decode.py --only beam,sid --iters 10 --warmup 3 2>&1 | grep -v -i warn | tail -24
