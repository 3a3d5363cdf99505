"""Leave-one-out retrieval quality of genrec's paths and baselines, trained in the same run.

    python benchmarks/run_quality.py WORKDIR --preset gpu-base --variants sasrec,pinger,tiger [overrides...]

WORKDIR must hold prepared tables, features and SIDs. Each variant trains in its own run
directory ``WORKDIR-<variant>`` (tables/features/sid linked from WORKDIR) with the same
split, then the test split is scored ONCE with the final model: full catalogue, history
items not excluded, Recall/NDCG@5/10/20 per path (ANN = dense user vector, SID =
constrained beam search). Popularity is scored on the same cases. Prints a Markdown table
last; JSON to $OUT/quality.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from genrec.data.join import BucketJoinReader
from genrec.data.splits import SplitSpec, train_events
from genrec.eval.baselines import Popularity
from genrec.eval.metrics import rank_of_targets, topk_metrics
from genrec.eval.retrieval import evaluate_retrieval, make_eval_set
from genrec.pipeline import load_catalog, open_store
from genrec.train.run import RunConfig, train_run


def variant_dir(base: Path, variant: str) -> Path:
    d = Path(f"{base}-{variant}")
    d.mkdir(parents=True, exist_ok=True)
    for part in ("tables", "features", "sid"):
        link = d / part
        if not link.exists():
            link.symlink_to((base / part).resolve())
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--preset", default="gpu-base")
    ap.add_argument("--variants", default="sasrec,pinger,tiger")
    ap.add_argument("--beam", type=int, default=20)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_intermixed_args()
    base = Path(a.workdir)
    store = open_store(base)
    catalog = load_catalog(base)
    split = SplitSpec("loo")
    test_recs = list(BucketJoinReader(store, split=split, role="test", context_len=10 ** 6))
    events = store.read_events()
    pop = Popularity(catalog.item_ids, train_events(events, split).column("item_id").to_numpy())
    test_all = make_eval_set(test_recs, catalog)
    results: dict[str, dict] = {"popularity": {"test": {"pop": topk_metrics(rank_of_targets(
        lambda idx: pop.score(len(idx)), len(test_all), test_all.target_rows), (5, 10, 20))}}}
    for v in a.variants.split(","):
        cfg = RunConfig.from_name(a.preset, ["train.compile=false", f"variant={v}", *a.overrides])  # eager unless asked
        wd = variant_dir(base, v)
        t0 = time.perf_counter()
        res = train_run(wd, cfg, resume=False)
        train_s = time.perf_counter() - t0
        # the final weights, with the trie and leaf map, exactly as serving loads them
        from genrec.retrieve.recommender import Recommender

        rec = Recommender.from_checkpoint(wd, "LATEST", device="cuda" if torch.cuda.is_available() else "cpu")
        t1 = time.perf_counter()
        test = evaluate_retrieval(rec.objective, test_all, beam_width=a.beam, context_len=cfg.data.context_len,
                                  trie=rec.trie, leaf_rows=rec.leaf_rows, batch_size=256)
        results[v] = {"test": test, "valid_final": res["valid"], "train_seconds": train_s, "steps": res["step"],
                      "eval_seconds": time.perf_counter() - t1}
        print(v, json.dumps(test), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "quality.json"), "w") as f:
            json.dump(results, f, indent=2)
    print("\n| model | path | Recall@5 | NDCG@5 | Recall@10 | NDCG@10 | Recall@20 |\n|---|---|---|---|---|---|---|")
    for v, r in results.items():
        for path, m in r["test"].items():
            print(f"| {v} | {path} | {m['recall@5']:.4f} | {m['ndcg@5']:.4f} | {m['recall@10']:.4f} | "
                  f"{m['ndcg@10']:.4f} | {m['recall@20']:.4f} |")


if __name__ == "__main__":
    main()
