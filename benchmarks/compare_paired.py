"""Compare trained runs on the SAME evaluation users, with paired bootstrap intervals.

    python benchmarks/compare_paired.py RUN_A RUN_B [RUN_C ...] [--split valid] [--paths sid,ann,l0l1,heads,ranking]
                                        [--beam 20] [--max-users 0] [--n-boot 2000] [--across]

Each run directory is scored on its split's leave-one-out cases (the runs must share tables, so
the cases are the same: checked). Per path, every run's per-user rank of the target is recorded
once; Recall@10 / NDCG@10 of every resample of users are then recomputed for every run
(``genrec.eval.significance.paired_topk``). A difference too small to see against either
run's own standard error can still be decided this way. ``l0l1`` is the L0 -> L1 funnel with the run's
stored fusion weights (``genrec fusion tune``: chosen on validation), ``heads`` the same union ranked by the
action heads alone (UniPinRec's L1: a = 1, w = v = 0). ``--across`` also compares paths across
runs (one run's SID path against another's ANN path: genrec against SASRec on the same users).
``sid-dense`` is the SID path with the item inside each code chosen by the dense head (`genrec.eval.retrieval`).
``ranking`` compares the action heads on the split's held-out feedview slates (AUC per action and Hit@3, as
``genrec eval`` reports them; UniPinRec's ordering), resampling slates (:func:`genrec.eval.ranking.paired_slates`),
with ``counts`` beside the runs: the heads' floor from counts alone (:class:`genrec.eval.baselines.ActionPrior`).
``--calibrate`` (with ``--split test``) adds a ``<run>+cal`` row per run: its heads' reading among the engaged items,
calibrated on the validation slates with the counts beside them (:class:`genrec.eval.baselines.ClassCalibration`).
Choose on ``valid``; touch ``test`` once.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from genrec.eval.baselines import ActionPrior, ClassCalibration
from genrec.eval.evaluate import EvalConfig, action_prior, l0l1_pass, load_eval_data, prior_probs
from genrec.eval.metrics import topk_metrics
from genrec.eval.ranking import Slate, collect_slates, paired_slates, score_slates, slate_metrics
from genrec.eval.retrieval import evaluate_retrieval
from genrec.eval.significance import PairedDiff, paired_topk
from genrec.infer.load import trained_temperature
from genrec.infer.recommender import Recommender


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--split", default="valid")
    ap.add_argument("--paths", default="sid,ann")
    ap.add_argument("--beam", type=int, default=20)
    ap.add_argument("--max-users", type=int, default=0)
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--across", action="store_true",
                    help="also compare every run's every path against every other (run, path), e.g. SID vs ANN")
    ap.add_argument("--checkpoint", default=None, help="BEST, LATEST or none (BEST if marked, else LATEST)")
    ap.add_argument("--calibrate", action="store_true",
                    help="ranking: also each run's heads calibrated among the engaged on the validation slates")
    a = ap.parse_args()
    if a.calibrate and a.split == "valid":
        raise SystemExit("--calibrate fits on the validation slates: score it on another split (--split test)")
    if len(a.runs) < 2 and not a.across:
        raise SystemExit("give at least two run directories (or one with --across: its paths against each other)")
    names = [Path(r).name for r in a.runs]
    ranks: dict[str, dict[str, np.ndarray]] = {}
    targets = None
    slates: list[Slate] | None = None
    slate_probs: dict[str, list[np.ndarray]] = {}
    prior: list[np.ndarray] = []
    utilities: dict[str, np.ndarray] = {}
    actions: tuple[list[str], list[str]] | None = None
    for name, run in zip(names, a.runs):
        rec = Recommender.from_checkpoint(run, a.checkpoint)
        data = load_eval_data(rec, run, EvalConfig(split=a.split, max_users=a.max_users,
                                                   ranking="ranking" in a.paths.split(",")))
        es = data.es
        if targets is None:
            targets = np.asarray(es.target_rows)
        elif not np.array_equal(targets, np.asarray(es.target_rows)):
            raise SystemExit(f"{run}: its {a.split} cases differ from {a.runs[0]}'s (other tables or sampling?)")
        ro: dict[str, np.ndarray] = {}
        paths = a.paths.split(",")
        evaluate_retrieval(rec.catalog_model, es, paths=tuple(p for p in paths if p in ("sid", "ann", "sid-dense")),
                           beam_width=a.beam, context_len=rec.context_len, trie=rec.trie, leaf_rows=rec.leaf_rows,
                           ranks_out=ro, dense_temperature=trained_temperature(rec.run_config))
        for p in ("l0l1", "heads"):  # the funnel: the stored (validated) fusion, or the heads alone
            if p in paths and rec.model.action_head is not None and rec.ann is not None:
                got: dict[str, np.ndarray] = {}
                l0l1_pass(rec, es, ks=(10,), beam_width=a.beam, diversity_lambda=0.0, overretrieve=3,
                          utility={x: 1.0 for x in rec.actions},
                          ranks_out=got, transitions=data.transitions,
                          **({"action_weight": 1.0, "retrieval_weight": 0.0, "sid_weight": 0.0, "transition_weight": 0.0}
                             if p == "heads" else {}))
                ro[p] = got["l0l1"]
        if "ranking" in paths and rec.model.action_head is not None:  # the heads on the held-out slates
            mine, _ = collect_slates(data.records, data.feedviews, rec.catalog, context_len=rec.context_len,
                                     negatives=EvalConfig().slate_negatives)
            if slates is None:
                slates, actions = mine, (rec.actions, rec.positive_actions)
                prior = prior_probs(action_prior(rec, data), mine)  # the counts floor, a reference row
            elif not same_slates(slates, mine) or actions != (rec.actions, rec.positive_actions):
                raise SystemExit(f"{run}: its {a.split} slates or actions differ from the first ranking run's")
            slate_probs[name] = score_slates(rec, mine)
            utilities[name] = rec.utility_vector(rec.action_utility()).cpu().numpy()
            if a.calibrate:
                slate_probs[f"{name}+cal"] = calibrated(rec, run, a, slate_probs[name], mine, action_prior(rec, data))
                utilities[f"{name}+cal"] = utilities[name]
        ranks[name] = ro
        print(f"{name}: step {rec.step}, {len(es)} cases, paths {sorted(ro)}", flush=True)
    assert targets is not None
    report: dict[str, object] = {"split": a.split, "cases": len(targets), "beam": a.beam, "paths": {}}
    for path in a.paths.split(","):
        entries = {n: ranks[n][path] for n in names if path in ranks[n]}
        if len(entries) >= 2:
            report["paths"][path] = section(f"{path} path", entries, len(targets), a)  # type: ignore[index]
    if a.across:  # every (run, path) against every other: e.g. one run's SID path against another's ANN path
        entries = {f"{n}/{p}": ranks[n][p] for n in names for p in a.paths.split(",") if p in ranks[n]}
        if len(entries) >= 2:
            report["across"] = section("runs and paths", entries, len(targets), a)
    if slate_probs and slates is not None and actions is not None:
        slate_probs["counts"], utilities["counts"] = prior, next(iter(utilities.values()))
        report["ranking"] = ranking_section(slate_probs, slates, actions, utilities, a)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "compare_paired.json").write_text(json.dumps(report, indent=1))


def calibrated(rec: Recommender, run: str, a: argparse.Namespace, probs: list[np.ndarray], slates: list[Slate],
               prior: ActionPrior) -> list[np.ndarray]:
    """The run's heads on ``slates`` calibrated among the engaged (:class:`ClassCalibration`), fitted on the
    run's validation slates."""
    data = load_eval_data(rec, run, EvalConfig(split="valid", max_users=a.max_users, ranking=True))
    valid, _ = collect_slates(data.records, data.feedviews, rec.catalog, context_len=rec.context_len,
                              negatives=EvalConfig().slate_negatives)
    cal = ClassCalibration.fit(score_slates(rec, valid), valid, action_prior(rec, data))
    return cal.apply(probs, slates, prior)


def section(title: str, entries: dict[str, np.ndarray], n_cases: int, a: argparse.Namespace) -> dict[str, object]:
    """Print Recall@10 / NDCG@10 of each entry (per-case target ranks) and every pair's paired
    bootstrap difference; returns the differences by name."""
    names = list(entries)
    print(f"\n## {title}, {n_cases} {a.split} cases\n")
    print("| run | Recall@10 | NDCG@10 |\n|---|---|---|")
    for n in names:
        m = topk_metrics(entries[n], (10,))
        print(f"| {n} | {m['recall@10']:.4f} | {m['ndcg@10']:.4f} |")
    return print_differences({m: paired_topk(entries, m, n_boot=a.n_boot) for m in ("recall@10", "ndcg@10")}, names)


def print_differences(res: dict[str, dict[tuple[str, str], PairedDiff]], names: list[str]) -> dict[str, object]:
    """One table per metric: every pair's paired difference (in ``names``' order); returns them by name."""
    rows: dict[str, object] = {}
    for metric, diffs in res.items():
        print(f"\n| {metric} | difference | 95% interval (paired) | P(> 0) |\n|---|---|---|---|")
        for (x, y), d in diffs.items():
            if names.index(x) < names.index(y):
                print(f"| {x} − {y} | {d.cells()} |")
                rows[f"{metric}: {x} - {y}"] = vars(d)
    return rows


def same_slates(x: list[Slate], y: list[Slate]) -> bool:
    """The same requests, candidates and labels (two runs on the same tables and split)."""
    return len(x) == len(y) and all(np.array_equal(p.cand_rows, q.cand_rows) and np.array_equal(p.labels, q.labels)
                                    and np.array_equal(p.rows, q.rows) for p, q in zip(x, y))


def ranking_section(probs: dict[str, list[np.ndarray]], slates: list[Slate], actions: tuple[list[str], list[str]],
                    utilities: dict[str, np.ndarray], a: argparse.Namespace) -> dict[str, object]:
    """Print every run's AUC per action and Hit@3 on the same slates and every pair's paired bootstrap
    difference; returns the differences by name."""
    res = paired_slates(probs, slates, actions[0], actions[1], utilities, n_boot=a.n_boot)
    names = list(probs)
    print(f"\n## the action heads on {len(slates)} held-out {a.split} slates\n")
    print("| run | " + " | ".join(res) + " |\n|---|" + "---|" * len(res))
    for n in names:
        m = slate_metrics(probs[n], slates, actions[0], actions[1], utilities[n])
        vals = [m["auc"][x] for x in actions[0]] + [m["hit@3"]]
        print(f"| {n} | " + " | ".join(f"{v:.4f}" for v in vals) + " |")
    return print_differences(res, names)


if __name__ == "__main__":
    main()
