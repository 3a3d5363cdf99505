#!/usr/bin/env bash
# The one GPU launcher: on the lent GPU machine, from the repository root, source gpu_env.sh (the wheels
# carried in .whl installed, src/ on the path, datasets in .gpudata, $OUT made), then run the command given,
# its output also in $OUT/run.log. Carry .whl (made by `bash scripts/fetch_gpu_wheels.sh`) and, for anything
# that reads a dataset, .gpudata (`mkdir -p .gpudata && cp -r ../shared/datasets/* .gpudata/`).
#   bash benchmarks/gpu.sh python3 benchmarks/bench_kernels.py --quick          # a command and its arguments
#   bash benchmarks/gpu.sh 'step_workdir && $BT $WD --synthetic 8x1024 $D768'   # one quoted shell line: it may
#                                                                                # use gpu_env.sh's helpers
# With one argument the line is evaluated by this shell (so `&&`, `;`, $BT, step_workdir, train_serve_model and
# bench_step work); with several, they are run as one command. The exit status is the command's.
# GENREC_INSTALLED=1 bash benchmarks/gpu.sh ...: genrec from the wheel carried in .whl-genrec (`bash
# scripts/fetch_gpu_wheels.sh genrec`), installed there, src/ off the path (gpu_env.sh; benchmarks/README.md).
set -o pipefail
[ $# -gt 0 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 1
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1   # the machine and versions gpu_env.sh prints go to the log too
source benchmarks/gpu_env.sh || exit 1
export TRITON_INTERPRET=0   # the kernels compile for the GPU (CI's interpreter setting must not leak in)
if [ $# -eq 1 ]; then eval "$1"; else "$@"; fi
