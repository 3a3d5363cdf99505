"""The ranking ablation with paired bootstrap intervals: which variant ranks feedview slates better?

    python benchmarks/ablation_paired.py RUNS_DIR [--variants pinger,ranking-only,frozen-ft,dense]
                                                  [--split test] [--n-boot 2000]

RUNS_DIR is what ``benchmarks/run_ml_ablation.sh`` trained (one run directory per variant, the
same tables). Every variant scores the SAME slates (checked), so differences are judged by a
paired bootstrap over slates (``genrec.eval.significance``): each resample of slates is scored by
every variant, and the interval of the difference is far narrower than either metric's own. The
metrics are ``genrec eval``'s: the held-out part of each case's slate (never a training candidate)
with ``--negatives`` sampled impression-only items added, pooled AUC per action over the logged items and
Hit@3 by the action utility (+1 positive, -1 negative actions), beside Hit@3's chance level.
Prints each variant's metrics, then every pair's difference with its 95% interval.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from genrec.eval.evaluate import EvalConfig, load_eval_data
from genrec.eval.ranking import collect_slates, score_slates, slate_metrics
from genrec.eval.significance import PairedDiff, paired_bootstrap
from genrec.retrieve.recommender import Recommender


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs")
    ap.add_argument("--variants", default="pinger,ranking-only,frozen-ft,dense")
    ap.add_argument("--split", default="test")
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--negatives", type=int, default=8, help="sampled impression-only items per slate (genrec "
                                                             "eval's --slate-negatives)")
    a = ap.parse_args()
    names = [v for v in a.variants.split(",") if v]
    probs: dict[str, list[np.ndarray]] = {}
    slates = ref = None
    actions: list[str] = []
    positive: list[str] = []
    for v in names:
        rec = Recommender.from_checkpoint(Path(a.runs) / v, "LATEST")
        data = load_eval_data(rec, Path(a.runs) / v, EvalConfig(split=a.split))
        sl, _ = collect_slates(data.records, data.feedviews, rec, context_len=rec.context_len, negatives=a.negatives)
        key = [(tuple(s.cand_rows), tuple(s.labels), tuple(s.rows)) for s in sl]
        if ref is None:
            slates, ref, actions, positive = sl, key, list(rec.actions), list(rec.positive_actions)
            util = rec.action_utility()
        elif key != ref:
            raise SystemExit(f"variant {v}: its slates differ from {names[0]}'s (different tables or context?)")
        probs[v] = score_slates(rec, sl)
        print(f"{v}: step {rec.step}, {len(sl)} slates scored", flush=True)
    assert slates is not None
    u = np.array([util[x] for x in actions])
    from genrec.eval.ranking import hit_chance

    pos_mask = sum(1 << actions.index(x) for x in positive)
    chance = hit_chance([(s.labels & pos_mask) > 0 for s in slates])

    def metric(v: str, name: str):  # noqa: ANN202
        def f(idx: np.ndarray) -> float:
            m = slate_metrics([probs[v][i] for i in idx], [slates[i] for i in idx], actions, positive, u)
            return float(m["hit@3"] if name == "hit@3" else m["auc"][name])
        return f

    table: dict[str, dict[str, float]] = {}
    diffs: dict[str, dict[str, PairedDiff]] = {}
    for name in [*actions, "hit@3"]:
        res = paired_bootstrap({v: metric(v, name) for v in names}, len(slates), n_boot=a.n_boot, seed=0)
        for v in names:
            table.setdefault(v, {})[name] = metric(v, name)(np.arange(len(slates)))
        diffs[name] = {f"{x} - {y}": d for (x, y), d in res.items() if names.index(x) < names.index(y)}
    pairs = {name: {pair: {"diff": d.observed, "low": d.low, "high": d.high, "p_greater": d.p_greater}
                    for pair, d in ds.items()} for name, ds in diffs.items()}
    metrics = [*[f"AUC({x})" for x in actions], "Hit@3"]
    print(f"\n{len(slates)} slates ({a.split} split, {a.negatives} sampled negatives each), every variant on the "
          f"same slates; Hit@3 by chance: {chance:.4f}\n")
    print("| variant | " + " | ".join(metrics) + " |\n|---|" + "---|" * len(metrics))
    for v in names:
        print(f"| {v} | " + " | ".join(f"{table[v][n]:.4f}" for n in [*actions, "hit@3"]) + " |")
    print("\n| metric | pair | difference | 95% interval (paired bootstrap) | P(difference > 0) |\n|---|---|---|---|---|")
    for name, ds in diffs.items():
        label = "Hit@3" if name == "hit@3" else f"AUC({name})"
        for pair, d in ds.items():
            print(f"| {label} | {pair} | {d.cells()} |")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "ablation_paired.json").write_text(
            json.dumps({"slates": len(slates), "metrics": table, "pairs": pairs, "n_boot": a.n_boot,
                        "negatives": a.negatives, "hit@3_chance": chance, "utility": util}, indent=1))


if __name__ == "__main__":
    main()
