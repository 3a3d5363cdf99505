#!/usr/bin/env bash
# Create .venv (if missing) and install genrec into it: `bash scripts/setup.sh` with the [serve] extra (the HTTP
# stack: the README's step by step ends with `genrec serve`), `bash scripts/setup.sh test` with the test extras
# (they include [serve]; sentence-transformers, ray, mypy, hypothesis: ~3 GB more).
# Torch is pinned to 2.13.0 here because this build machine serves that CPU wheel from
# local disk; the package itself accepts any torch >= 2.11 (the GPU image has 2.11).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${1:-serve}
say() { echo "[setup] $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  say "installing torch ${GENREC_TORCH_VERSION:-2.13.0} (CPU build) ..."
  .venv/bin/python -m pip install -q "torch==${GENREC_TORCH_VERSION:-2.13.0}"
fi
say "installing genrec${EXTRAS:+ with the [$EXTRAS] extras} and its dependencies ..."
.venv/bin/python -m pip install -q -e ".${EXTRAS:+[$EXTRAS]}"
say "ready: .venv/bin/genrec"
