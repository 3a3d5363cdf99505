#!/usr/bin/env bash
# Check the data, set up .venv (the package and its [serve] extra, not the test extras) and run the whole pipeline on the
# default data (MovieLens 100K) into runs/quickstart. Arguments go to `genrec quickstart` (e.g. --download).
set -euo pipefail
cd "$(dirname "$0")/.."
# default data root: $GENREC_DATA_DIR, else ../shared/datasets beside the checkout if present
if [ -z "${GENREC_DATA_DIR:-}" ] && [ -d ../shared/datasets ]; then
  export GENREC_DATA_DIR="$(cd ../shared/datasets && pwd)"
fi
# the data first (seconds), before minutes of installing: where `genrec quickstart` would look for it
dataset=movielens-100k; data_dir=""; download=0; prev=""
for a in "$@"; do
  case "$prev" in --dataset) dataset=$a;; --data-dir) data_dir=$a;; esac
  case "$a" in --download) download=1;; --dataset=*) dataset=${a#*=};; --data-dir=*) data_dir=${a#*=};; esac
  prev=$a
done
if [ "$download" = 0 ]; then
  roots=${data_dir:-${GENREC_DATA_DIR:-$HOME/.cache/genrec/datasets}}
  if [ ! -d "$roots/$dataset" ] || [ -z "$(ls -A "$roots/$dataset" 2>/dev/null)" ]; then
    echo "genrec quickstart: the dataset '$dataset' is not at $roots/$dataset. Put its files there, pass" \
         "--data-dir DIR (a folder holding $dataset/), set GENREC_DATA_DIR, or add --download to fetch it" \
         "from its official source: bash scripts/quickstart.sh --download" >&2
    exit 2
  fi
fi
bash scripts/setup.sh
exec .venv/bin/genrec quickstart runs/quickstart "$@"
