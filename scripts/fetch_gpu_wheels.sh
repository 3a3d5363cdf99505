#!/usr/bin/env bash
# Download into .whl/ (git-ignored) the wheels that the lent GPU machine's image lacks, at the versions
# this checkout's .venv holds, for benchmarks/gpu_env.sh to install there (it has no network).
# The image's own list: ../.library/device/KINDS.md. Run here (pip reaches the package index).
# It also builds this checkout's own wheel into .whl-genrec/ (git-ignored) for GENREC_INSTALLED=1 (gpu_env.sh:
# the tests run the installed package, not src/); `bash scripts/fetch_gpu_wheels.sh genrec` builds only that one,
# e.g. again after a change.
set -euo pipefail
cd "$(dirname "$0")/.."
build_genrec() {  # a clean build: setuptools' build/ keeps files deleted from src/ and would ship them
  local iso=--no-build-isolation  # the .venv's setuptools when it is recent enough, else pip fetches one
  .venv/bin/python -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null || iso=
  rm -rf build .whl-genrec
  .venv/bin/python -m pip wheel -q --no-deps $iso -w .whl-genrec .
  rm -rf build
  ls .whl-genrec
}
if [ "${1:-}" = genrec ]; then build_genrec; exit; fi
PKGS="faiss-cpu pyiceberg fastapi starlette pydantic pydantic_core annotated-types typing-inspection uvicorn httptools
      mmh3 strictyaml zstandard tenacity pyroaring cachetools SQLAlchemy opentelemetry-api typing_extensions"
mkdir -p .whl
for p in $PKGS; do
  v=$(.venv/bin/python -m pip show "$p" 2>/dev/null | awk '/^Version:/{print $2}')
  [ -n "$v" ] || { echo "fetch_gpu_wheels: $p is not in .venv (run scripts/setup.sh first)" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 -d .whl "$p==$v"
done
ls .whl
build_genrec
