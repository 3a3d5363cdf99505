"""The effect of the DPO stage (``genrec train --stage dpo``): SID-path recall and disliked items in the top 10.

    python benchmarks/dpo_effect.py RUN --base CKPT --dpo CKPT [--beam 100] [--out FILE]

RUN holds a dataset with a dislike action (MovieLens prepared with its ratings). Both checkpoints are scored on
every validation and every test user (full catalogue, history items not excluded) on the SID path: Recall@10,
NDCG@10, and the share of the top-10 slots that hold an item the user rated as disliked (at any time in their
log: the items DPO's pairs teach the head to put below the engaged ones), with paired bootstrap intervals (DPO
minus base, same users). Prints a Markdown table; JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from genrec.catalog import open_store
from genrec.eval.evaluate import EvalConfig, load_eval_data
from genrec.eval.metrics import topk_metrics
from genrec.eval.retrieval import evaluate_retrieval
from genrec.eval.significance import paired_bootstrap, paired_topk
from genrec.infer.recommender import Recommender


def disliked_rows(run: Path, rec: Recommender, action: str = "dislike") -> dict[int, set[int]]:
    """Per user, the catalogue rows of the items they rated with ``action``."""
    store = open_store(run)
    acts = list(store.info().actions)
    if action not in acts:
        raise SystemExit(f"{run}: no {action!r} action in this dataset (actions: {acts})")
    ev = store.read_events(columns=["user_id", "item_id", "action"])
    a = np.asarray(ev.column("action").to_numpy())
    code = acts.index(action) if a.dtype.kind in "iu" else action
    m = a == code
    users = np.asarray(ev.column("user_id").to_numpy())[m]
    rows = rec.catalog.rows(np.asarray(ev.column("item_id").to_numpy(), dtype=np.int64)[m], strict=False)
    out: dict[int, set[int]] = {}
    for u, r in zip(users.tolist(), rows.tolist()):
        if r >= 0:
            out.setdefault(int(u), set()).add(int(r))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--base", required=True)
    ap.add_argument("--dpo", required=True)
    ap.add_argument("--beam", type=int, default=100)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    res: dict[str, dict[str, object]] = {}
    table = ["| split | metric | base | dpo | dpo - base | 95% interval | P(dpo > base) |",
             "|---|---|---|---|---|---|---|"]
    per: dict[str, dict[str, dict[str, np.ndarray]]] = {"valid": {}, "test": {}}
    for name, ck in (("base", a.base), ("dpo", a.dpo)):
        rec = Recommender.from_checkpoint(a.run, ck)
        bad = disliked_rows(a.run, rec)
        for split in ("valid", "test"):
            es = load_eval_data(rec, a.run, EvalConfig(split=split, max_users=0)).es
            ranks: dict[str, np.ndarray] = {}
            lists: dict[str, np.ndarray] = {}
            with torch.no_grad():
                evaluate_retrieval(rec.catalog_model, es, paths=("sid",), beam_width=a.beam, ks=(10,),
                                   context_len=rec.context_len, trie=rec.trie, leaf_rows=rec.leaf_rows,
                                   ranks_out=ranks, lists_out=lists)
            top = lists["sid"][:, :10]
            share = np.array([np.mean([r in bad.get(ex.user_id, ()) for r in row[row >= 0]]) if (row >= 0).any()
                              else 0.0 for ex, row in zip(es.examples, top)])
            per[split][name] = {"rank": ranks["sid"], "disliked": share}
    for split in ("valid", "test"):
        b, d = per[split]["base"], per[split]["dpo"]
        res[split] = {}
        for metric in ("recall@10", "ndcg@10"):
            diff = paired_topk({"dpo": d["rank"], "base": b["rank"]}, metric)[("dpo", "base")]
            vb, vd = topk_metrics(b["rank"], (10,))[metric], topk_metrics(d["rank"], (10,))[metric]
            res[split][metric] = {"base": vb, "dpo": vd, "diff": diff.__dict__}
            table.append(f"| {split} | SID {metric} | {vb:.4f} | {vd:.4f} | {diff.cells()} |")
        sb, sd = b["disliked"], d["disliked"]
        diff = paired_bootstrap({"dpo": lambda i: float(sd[i].mean()), "base": lambda i: float(sb[i].mean())},
                                len(sb))[("dpo", "base")]
        res[split]["disliked@10"] = {"base": float(sb.mean()), "dpo": float(sd.mean()), "diff": diff.__dict__}
        table.append(f"| {split} | disliked share of top 10 | {sb.mean():.4f} | {sd.mean():.4f} | {diff.cells()} |")
    print("\n".join(table))
    if a.out:
        a.out.write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
