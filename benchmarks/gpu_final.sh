#!/usr/bin/env bash
# One device call: GPU parity tests, kernel benchmark, training-throughput table (Beauty).
source benchmarks/gpu_env.sh || exit 1
python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_model_triton.py 2>&1 | tail -3 | tee "$OUT/gpu_tests.log"
WD=/tmp/beauty
(python3 -m genrec.cli data prepare amazon-beauty-2014 $WD > /dev/null && python3 -m genrec.cli features build $WD > /dev/null \
  && python3 -m genrec.cli sid build $WD > /dev/null) &
timeout 200 python3 benchmarks/bench_kernels.py --iters 10 --warmup 3 2>&1 > "$OUT/bench_kernels.log"; tail -32 "$OUT/bench_kernels.log"
wait
for args in "--variants pinger,tiger objective.w_action=0" \
            "--variants pinger,tiger objective.w_action=0 objective.w_item=0" \
            "--variants pinger objective.w_action=0 objective.w_item=0 model.attn_impl=triton" \
            "--variants pinger objective.w_action=0 model.attn_impl=triton"; do
  python3 benchmarks/bench_train.py $WD --preset gpu-base --steps 20 --warmup 5 $args 2>&1 | grep -v Warn | tail -3 | tee -a "$OUT/bench_train.log"
done
