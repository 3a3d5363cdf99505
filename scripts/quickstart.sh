#!/usr/bin/env bash
# Set up .venv and run the whole pipeline on the default data (MovieLens 100K) into runs/quickstart.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# default data root: $GENREC_DATA_DIR, else ../shared/datasets beside the checkout if present
if [ -z "${GENREC_DATA_DIR:-}" ] && [ -d ../shared/datasets ]; then
  export GENREC_DATA_DIR="$(cd ../shared/datasets && pwd)"
fi
exec .venv/bin/genrec quickstart runs/quickstart "$@"
