"""Choose the L1 score-fusion weights on validation, then score the test split once.

    python benchmarks/tune_fusion.py WORKDIR [--beam 50] [--max-users 0] [--out F]

L1 score = a * action-head utility + w * (user . candidate vector) + v * log P(candidate's SID)
(see ``Recommender._run_batch``). The L0 -> L1 path runs ONCE on the validation cases and records
every candidate's score parts; every (a, w, v) of the grid (``genrec.retrieve.fusion.FUSION_GRID``) is then
scored offline (``genrec.eval.evaluate.choose_fusion``, tested equal to re-running the path).
The weighting with the best validation Recall@10 (ties: the earlier, simpler one) runs once on
the test cases, beside the ANN-only and SID-only paths and the heads alone on the same cases.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from genrec.eval.evaluate import EvalConfig, choose_fusion, l0l1_pass, load_eval_data
from genrec.eval.retrieval import evaluate_retrieval
from genrec.retrieve.recommender import Recommender

from genrec.retrieve.fusion import FUSION_GRID


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir")
    ap.add_argument("--beam", type=int, default=50, help="SID beam width inside L0")
    ap.add_argument("--overretrieve", type=int, default=3)
    ap.add_argument("--max-users", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rec = Recommender.from_checkpoint(a.workdir)
    utility = {x: 1.0 for x in rec.actions}  # genrec eval's default: P(any action)
    ks = (5, 10, 20)
    t0 = time.perf_counter()
    kw: dict[str, Any] = dict(ks=ks, beam_width=a.beam, diversity_lambda=0.0, overretrieve=a.overretrieve,
                              utility=utility)
    es = {s: load_eval_data(rec, a.workdir, EvalConfig(split=s, max_users=a.max_users)).es for s in ("valid", "test")}
    parts: list[dict[str, Any]] = []
    l0l1_pass(rec, es["valid"], parts=parts, **kw)
    best, grid = choose_fusion(parts, ks, FUSION_GRID)
    out: dict[str, Any] = {"workdir": a.workdir, "step": rec.step, "beam": a.beam, "grid_valid": grid,
                           "chosen": {k: best[k] for k in ("a", "w", "v")}, "valid": {}, "test": {}}
    for split in ("valid", "test"):
        paths = evaluate_retrieval(rec.objective, es[split], paths=("ann", "sid"), ks=ks, beam_width=a.beam,
                                   context_len=rec.context_len, trie=rec.trie, leaf_rows=rec.leaf_rows)
        out[split]["ann"], out[split]["sid"] = paths["ann"], paths["sid"]
        out[split]["heads alone (a=1, w=v=0)"] = l0l1_pass(rec, es[split], action_weight=1.0, retrieval_weight=0.0,
                                                           sid_weight=0.0, **kw)  # named: not the stored weights
    out["test"]["l0l1 fused"] = l0l1_pass(rec, es["test"], action_weight=best["a"], retrieval_weight=best["w"],
                                          sid_weight=best["v"], **kw)
    out["valid"]["l0l1 fused"] = {k: best[k] for k in best if k not in ("a", "w", "v")}
    out["seconds"] = time.perf_counter() - t0
    print(f"chosen on validation: a={best['a']:g} w={best['w']:g} v={best['v']:g}")
    print("\n| split | path | R@5 | R@10 | R@20 | NDCG@10 |\n|---|---|---|---|---|---|")
    for split in ("valid", "test"):
        for name, m in out[split].items():
            print(f"| {split} | {name} | {m['recall@5']:.4f} | {m['recall@10']:.4f} | {m['recall@20']:.4f} | "
                  f"{m['ndcg@10']:.4f} |")
    t = out["test"]
    print(f"test R@10 ratio, fused L0+L1 / ANN: {t['l0l1 fused']['recall@10'] / max(t['ann']['recall@10'], 1e-12):.3f}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
