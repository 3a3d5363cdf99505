# Sourced on the lent GPU machine by gpu.sh and gpu_ladder.sh (its image has torch/triton but not faiss/pyiceberg):
# installs the carried wheels from .whl into /tmp/site and puts genrec's src on the path. Without .whl (the kernel
# benchmarks and probes need none of them) it says so and goes on.
# GENREC_INSTALLED=1: genrec is not taken from src/ but installed from the wheel carried in .whl-genrec (made here
# by `bash scripts/fetch_gpu_wheels.sh genrec`) into /tmp/genrec-site, and src/ stays off the path: the tests (and
# `python3 -m genrec.cli`) then run the installed package, as a user's `pip install` would. The benchmark scripts
# put src/ first themselves.
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
else
  echo "gpu_env: no .whl carried: faiss, pyiceberg and the serving packages are not installed"
fi
if [ "${GENREC_INSTALLED:-0}" = 1 ]; then
  compgen -G ".whl-genrec/genrec-*.whl" > /dev/null || {
    echo "gpu_env: GENREC_INSTALLED=1 but no .whl-genrec/genrec-*.whl carried (bash scripts/fetch_gpu_wheels.sh genrec)"
    return 1; }
  rm -rf /tmp/genrec-site
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/genrec-site .whl-genrec/genrec-*.whl || return 1
  export PYTHONPATH=/tmp/genrec-site:/tmp/site
else
  export PYTHONPATH=/tmp/site:$PWD/src
fi
export PYTHONUNBUFFERED=1 GENREC_DATA_DIR=$PWD/.gpudata
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
GENREC_FILE=$(python3 -c "import genrec; print(genrec.__file__)") || return 1
echo "genrec.__file__ $GENREC_FILE"   # the log shows which copy runs: src/ or the installed wheel
if [ "${GENREC_INSTALLED:-0}" = 1 ] && [[ $GENREC_FILE != /tmp/genrec-site/genrec/* ]]; then
  echo "gpu_env: GENREC_INSTALLED=1 but genrec is not imported from /tmp/genrec-site"; return 1
fi
# The serving benchmarks' model: gpu-base PinGER, 30 steps on Beauty with a 1,000-item context
# (weights do not change the timing), in runs/beauty-serve; prints the log's tail on failure.
train_serve_model() {
  local wd=runs/beauty-serve p
  mkdir -p $wd; for p in tables features sid; do ln -sfn $PWD/runs/beauty/$p $wd/$p; done
  timeout 100 python3 -m genrec.cli train $wd --preset gpu-base --no-resume variant=pinger data.context_len=1000 \
    train.compile=false train.total_steps=30 train.eval_every=0 train.ckpt_every=0 train.progress=off train.tensorboard=false \
    data.valid_cases=200 > /tmp/serve_train.log 2>&1 || tail -5 /tmp/serve_train.log
}
# The full training step benchmark as docs/RESULTS.md calls it: BT, the SID-loss-only step of equal-context
# comparisons (COMMON), the d 768 width (D768), and bench_step NAME TIMEOUT ARGS... (output under $OUT/NAME).
BT="python3 benchmarks/bench_train.py --preset gpu-base"
COMMON="model.dropout=0.0 model.attn_impl=triton objective.w_item=0 objective.w_action=0"
D768="model.d_model=768 model.n_heads=12 model.d_ff=3072"
bench_step() {
  local name=$1 t=$2; shift 2
  echo "== $name"; mkdir -p $OUT/$name
  OUT=$OUT/$name timeout $t $BT "$@" 2>&1 | grep -v "Warn\|warn" | tail -12
}
# The step benchmarks' workdir, built here from MovieLens 100K in .gpudata (carry it and .whl): sets WD.
# step_workdir [LEVELS]: SIDs of LEVELS residual levels (3 by default: 4 tokens per item; 4: the 5). A
# workdir's Iceberg catalogue records absolute paths, so a copied one does not open.
step_workdir() {
  local levels=${1:-3}
  WD=runs/step-ml100k-l$levels
  timeout 90 python3 -c "from genrec.recipes import pipeline as p; p.prepare('$WD', 'movielens-100k'); \
p.build_item_features('$WD'); p.build_semantic_ids('$WD', levels=$levels)" 2>&1 | tail -2
}
