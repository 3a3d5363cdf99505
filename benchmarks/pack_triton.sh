#!/usr/bin/env bash
# Pack a Triton wheel for the GPU machine's Python 3.12 into .t39/triton39.tar.xz (~45 MB, under a device
# call's 64 MiB): the `triton` package without the AMD backend, CUPTI, proton, cuobjdump, nvdisasm and the
# ptxas for GPUs before sm_90 (Triton 3.9 compiles sm_90 with `ptxas-blackwell`, CUDA 13.4's), its
# libtriton.so stripped of symbols that nothing links against. Usage: bash benchmarks/pack_triton.sh [VERSION]
set -euo pipefail
v=${1:-3.9.0}
cd "$(dirname "$0")/.."
grep -qx '/.t39/' .git/info/exclude || echo /.t39/ >> .git/info/exclude
w=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 -d "$w" "triton==$v"
(cd "$w" && unzip -q ./*.whl 'triton/*' && cd triton && rm -rf backends/amd backends/nvidia/lib/cupti \
  backends/nvidia/lib/cupti-blackwell backends/nvidia/bin/ptxas backends/nvidia/bin/nvdisasm \
  backends/nvidia/bin/cuobjdump _C/libproton.so \
  && strip --strip-unneeded _C/libtriton.so && find . -name __pycache__ -prune -exec rm -rf {} +)
mkdir -p .t39
tar -C "$w" -cf - triton | xz -9 -T0 > .t39/triton39.tar.xz
rm -rf "$w"
ls -la .t39/triton39.tar.xz
