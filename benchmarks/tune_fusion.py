"""Choose the L1 score-fusion weights on validation, then score the test split once.

    python benchmarks/tune_fusion.py WORKDIR [--retrieval-weights 0,4,16] [--sid-weights 0,2,8,32]

L1 score = action-head utility + w * cos(user, candidate) + v * P(candidate's SID under the
beams) (see ``Recommender.run_batch``). Every (w, v) pair of the grid runs the L0 -> L1 path on
the validation cases; the pair with the best validation Recall@10 (ties: the smaller weights)
is then run once on the test cases, beside the ANN-only path on the same cases. Prints a
table; JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from genrec.eval.evaluate import EvalConfig, l0l1_pass, load_eval_data
from genrec.eval.retrieval import evaluate_retrieval
from genrec.retrieve.recommender import Recommender


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir")
    ap.add_argument("--retrieval-weights", default="0,4,16")
    ap.add_argument("--sid-weights", default="0,2,8,32")
    ap.add_argument("--beam", type=int, default=20)
    ap.add_argument("--overretrieve", type=int, default=3)
    ap.add_argument("--max-users", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rec = Recommender.from_checkpoint(a.workdir)
    utility = {x: 1.0 for x in rec.actions}  # genrec eval's default: P(any action)
    ks = (5, 10, 20)

    def run(split: str, w: float, v: float) -> dict[str, float]:
        data = load_eval_data(rec, a.workdir, EvalConfig(split=split, max_users=a.max_users))
        return l0l1_pass(rec, data.es, ks=ks, beam_width=a.beam, diversity_lambda=0.0, overretrieve=a.overretrieve,
                         utility=utility, retrieval_weight=w, sid_weight=v)

    def ann(split: str) -> dict[str, float]:
        data = load_eval_data(rec, a.workdir, EvalConfig(split=split, max_users=a.max_users))
        return evaluate_retrieval(rec.objective, data.es, paths=("ann",), ks=ks, beam_width=a.beam,
                                  diversity_lambda=0.0, context_len=rec.context_len)["ann"]

    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for w in _floats(a.retrieval_weights):
        for v in _floats(a.sid_weights):
            m = run("valid", w, v)
            rows.append({"split": "valid", "w": w, "v": v, **m})
            print(f"  valid w={w:g} v={v:g}: R@10 {m['recall@10']:.4f}  NDCG@10 {m['ndcg@10']:.4f}", flush=True)
    best = max(rows, key=lambda r: (r["recall@10"], -r["w"], -r["v"]))
    ann_valid = ann("valid")
    test = run("test", best["w"], best["v"])
    ann_test = ann("test")
    out = {"workdir": a.workdir, "step": rec.step, "grid": rows, "chosen": {"w": best["w"], "v": best["v"]},
           "valid": {"l0l1": best, "ann": ann_valid}, "test": {"l0l1": test, "ann": ann_test},
           "seconds": time.perf_counter() - t0}
    print("\n| split | path | R@5 | R@10 | R@20 | NDCG@10 |\n|---|---|---|---|---|---|")
    for split in ("valid", "test"):
        for name, m in (("ANN", out[split]["ann"]), (f"L0+L1 (w={best['w']:g}, v={best['v']:g})", out[split]["l0l1"])):
            print(f"| {split} | {name} | {m['recall@5']:.4f} | {m['recall@10']:.4f} | {m['recall@20']:.4f} | "
                  f"{m['ndcg@10']:.4f} |")
    print(f"test ratio L0+L1 / ANN (R@10): {test['recall@10'] / max(ann_test['recall@10'], 1e-12):.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
