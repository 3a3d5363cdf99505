#!/usr/bin/env bash
# MovieLens-100K: retrieval paths and the ranking ablation (joint vs ranking-only vs frozen
# fine-tune), plus SASRec-CE and TIGER-layout baselines, all on the same split, trained in
# this run on the CPU. Usage: bash benchmarks/run_ml_ablation.sh RUNS_DIR [STEPS]
# (TRAIN_VARIANTS / EVAL_VARIANTS narrow the set, e.g. to the ranking ablation alone)
set -euo pipefail
R=${1:-runs/ml-ablation}; STEPS=${2:-200}
mkdir -p "$R"
[ -f "$R/base/tables/manifest.json" ] || genrec data prepare movielens-100k "$R/base" > /dev/null
[ -d "$R/base/features" ] || genrec features build "$R/base" > /dev/null
[ -f "$R/base/sid/CURRENT" ] || genrec sid build "$R/base" > /dev/null
fork() { mkdir -p "$R/$1"; for p in tables features sid; do [ -e "$R/$1/$p" ] || ln -s "$(cd "$R/base" && pwd)/$p" "$R/$1/$p"; done; }
common="train.total_steps=$STEPS train.eval_every=0 train.ckpt_every=0 train.progress=off data.valid_cases=300"
TRAIN_VARIANTS=${TRAIN_VARIANTS:-pinger ranking-only dense sasrec tiger}
for v in $TRAIN_VARIANTS; do
  fork $v; genrec train "$R/$v" --preset quickstart --no-resume variant=$v $common > "$R/$v.train.json"
done
fork frozen-ft
genrec train "$R/frozen-ft" --preset quickstart --no-resume variant=frozen-ft init_from="$(cd "$R/dense" && pwd)/checkpoints" \
  objective.w_item=0 $common > "$R/frozen-ft.train.json"
for v in ${EVAL_VARIANTS:-pinger ranking-only dense frozen-ft sasrec tiger}; do
  genrec eval "$R/$v" --split test > "$R/$v.eval.txt" 2>&1 || echo "eval $v failed"
done
python - "$R" <<'PY'
import json, sys, glob, os
R = sys.argv[1]
print("| variant | path | Recall@10 | NDCG@10 | Recall@20 | AUC(like) | AUC(view) | Hit@3 |")
print("|---|---|---|---|---|---|---|---|")
for v in ["pinger", "ranking-only", "dense", "frozen-ft", "sasrec", "tiger"]:
    files = sorted(glob.glob(f"{R}/{v}/reports/eval-test-step*.json"))
    if not files:
        print(f"| {v} | (no report) |"); continue
    r = json.load(open(files[-1]))
    rank = r.get("ranking") or {}
    auc = rank.get("auc", {}) if isinstance(rank, dict) else {}
    for path, m in r.get("paths", r.get("retrieval", {})).items():
        print(f"| {v} | {path} | {m.get('recall@10', float('nan')):.4f} | {m.get('ndcg@10', float('nan')):.4f} | "
              f"{m.get('recall@20', float('nan')):.4f} | {auc.get('like', float('nan')):.3f} | "
              f"{auc.get('view', float('nan')):.3f} | {rank.get('hit@3', float('nan')):.3f} |")
PY
