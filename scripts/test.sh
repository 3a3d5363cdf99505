#!/usr/bin/env bash
# Set up .venv and run the test suite on the CPU (GPU tests are skipped without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export GENREC_DATA_DIR="${GENREC_DATA_DIR:-$(cd .. && pwd)/shared/datasets}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
