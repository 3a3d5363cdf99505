#!/usr/bin/env bash
# Set up .venv and run the whole pipeline on the default data (MovieLens 100K) into runs/quickstart.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/genrec quickstart runs/quickstart "$@"
