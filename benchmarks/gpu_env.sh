# Source on the lent GPU machine (its image has torch/triton but not faiss/pyiceberg):
# installs the carried wheels from .whl into /tmp/site and puts genrec's src on the path.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 GENREC_DATA_DIR=$PWD/.gpudata
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
