#!/usr/bin/env bash
# Create .venv (if missing) and install genrec with its test extras into it.
# Torch is pinned to 2.13.0 here because this build machine serves that CPU wheel from
# local disk; the package itself accepts any torch >= 2.11 (the GPU image has 2.11).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==${GENREC_TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e ".[test]"
