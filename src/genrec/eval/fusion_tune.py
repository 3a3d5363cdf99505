"""Choosing the L1 fusion weights on validation (``genrec fusion tune``): the L0 -> L1 pass records every
candidate's score parts once, every weighting of the grid is scored from them, the best is stored beside the
checkpoint (:mod:`genrec.infer.fusion`) with, for a transition term, the table it is served with."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from genrec.catalog import open_store
from genrec.errors import ConfigError
from genrec.eval.evaluate import EvalConfig, l0l1_pass, load_eval_data
from genrec.eval.metrics import rank_in_list, topk_metrics
from genrec.eval.retrieval import EvalSet
from genrec.infer.fusion import FUSION_GRID, HISTORY_GRID, TRANSITION_GRID, FusionWeights
from genrec.infer.recommender import Recommender
from genrec.infer.transitions import TransitionTable

__all__ = ["choose_fusion", "fusion_metrics", "tune_fusion"]


def fusion_metrics(parts: Sequence[dict[str, np.ndarray]], ks: Sequence[int], action_weight: float,
                   retrieval_weight: float, sid_weight: float, transition_weight: float = 0.0,
                   history_weight: float = 0.0) -> dict[str, float]:
    """The L0+L1 metrics that :func:`l0l1_pass` would give with these fusion weights, recomputed from
    the score parts it recorded (one pass, then any number of weightings: for choosing them on
    validation). Ties keep the union's order, as the Recommender's stable sort does."""
    ranks = []
    kmax = max(ks)
    for pt in parts:
        score = action_weight * pt["utility"].astype(np.float32)  # float32, in the Recommender's order
        if retrieval_weight > 0:
            score = score + retrieval_weight * pt["dot"].astype(np.float32)
        if sid_weight > 0:
            score = score + sid_weight * pt["sid_lp"].astype(np.float32)
        rows = pt["rows"]
        if transition_weight > 0:
            score = score + transition_weight * pt["trans"].astype(np.float32)
        elif "src" in pt:  # without the term its source does not run: the rows only it found are not candidates
            rows = np.where(pt["src"] == 4, -1, rows)
        if history_weight != 0:
            score = score + history_weight * pt["hist"].astype(np.float32)
        score = np.where(rows >= 0, score, -np.inf)
        order = np.argsort(-score, axis=1, kind="stable")[:, :kmax]
        top = np.take_along_axis(rows, order, axis=1)
        ranks.append(rank_in_list(top, pt["target_rows"]))
    return topk_metrics(np.concatenate(ranks) if ranks else np.zeros(0, np.int64), ks)


def choose_fusion(parts: Sequence[dict[str, np.ndarray]], ks: Sequence[int],
                  grid: Sequence[tuple[float, ...]], metric: str = "recall@10",
                  prefer: tuple[float, ...] | None = None
                  ) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Every weighting of ``grid`` -- (a, w, v), (a, w, v, t) or (a, w, v, t, h) -- scored from recorded score parts
    (:func:`fusion_metrics`), and the best by ``metric``; ties go to ``prefer`` (the weights in use without
    tuning) when it ties for the best, else to the earlier (simpler) weighting. Returns (best, all rows)."""
    if not grid:
        raise ConfigError("fusion grid is empty")
    full = [tuple(g) + (0.0,) * (5 - len(g)) for g in grid]
    rows = [{"a": a, "w": w, "v": v, "t": t, "h": h, **fusion_metrics(parts, ks, a, w, v, t, h)}
            for a, w, v, t, h in full]
    best = max(rows, key=lambda r: r[metric])  # max keeps the first of equals
    pref = None if prefer is None else tuple(prefer) + (0.0,) * (5 - len(prefer))
    kept = next((r for r in rows if tuple(r[x] for x in "awvth") == pref and r[metric] == best[metric]), None)
    return kept or best, rows


def tune_fusion(workdir: str | Path, *, checkpoint: str | None = None, max_users: int = 0, beam_width: int = 20,
                overretrieve: int = 3, batch_size: int = 128, metric: str = "recall@10",
                grid: Sequence[tuple[float, float, float]] | None = None, save: bool = True,
                rec: Recommender | None = None, utility: Mapping[str, float] | None = None,
                eval_set: EvalSet | None = None, transitions: TransitionTable | None = None) -> dict[str, Any]:
    """Choose the L1 fusion weights (a, w, v) on the VALIDATION split and store them for the
    checkpoint (``genrec.infer.fusion``): the L0 -> L1 path runs once on ``max_users``
    validation cases recording every candidate's score parts, every weighting of ``grid`` (default
    ``FUSION_GRID``) is scored offline by :func:`fusion_metrics`, and the best by ``metric``
    (ties: the earlier, simpler weighting) is written to ``WORKDIR/fusion/``. ``utility``: the action
    utility the heads' term ranks by, stored with the weights and served with them; None: every action
    weighs 1 (the leave-one-out target is the next interaction of any kind), as ``genrec eval``. Give
    e.g. ``{"like": 1, "view": 1, "dislike": -1}`` to choose the weights a service that demotes predicted
    dislikes will run (the recall is still of the next interaction of any kind).
    ``beam_width``: the SID beam inside L0, by default ``genrec eval``'s (the weights are recorded with it,
    and an evaluation at another width says so). ``eval_set``: the validation cases to choose on, instead of
    ``max_users`` sampled ones (e.g. one part of the validation users, the other kept for reporting).
    The transition term's weight t is chosen beside (a, w, v) from ``TRANSITION_GRID`` on ``transitions``
    (default: the pairs of the events before each user's validation target); a chosen t > 0 is stored with the
    table of every event, which the server loads with the weights. The history term's weight h (``HISTORY_GRID``,
    either sign) by coordinate ascent: every h beside the best (a, w, v, t) without it, then, when some h != 0 is
    better, the whole (a, w, v, t) grid again beside that h (a grid of 5-tuples is scored as it is)."""
    t0 = time.perf_counter()
    rec = rec or Recommender.from_checkpoint(workdir, checkpoint)
    if rec.model.action_head is None or rec.ann is None:
        raise ConfigError("fusion tune: this model has no L0 -> L1 path (needs ranking heads and a dense stage)")
    ks = (5, 10, 20)
    if metric not in {f"{m}@{k}" for m in ("recall", "ndcg") for k in ks}:
        raise ConfigError(f"metric must be recall@K or ndcg@K with K in {ks}, got {metric!r}")
    cfg = EvalConfig(split="valid", max_users=max_users, beam_width=beam_width, overretrieve=overretrieve,
                     batch_size=batch_size)
    cfg.validate()
    data = load_eval_data(rec, workdir, cfg) if eval_set is None or transitions is None else None
    es = eval_set if eval_set is not None else data.es  # type: ignore[union-attr]
    trans = transitions if transitions is not None else data.transitions  # type: ignore[union-attr]
    if len(es) == 0:
        raise ConfigError(f"split 'valid' has no evaluation cases in {workdir}")
    parts: list[dict[str, np.ndarray]] = []
    if utility is None:
        utility = {a: 1.0 for a in rec.actions}
    else:
        rec.utility_vector(utility)  # unknown action names: a ConfigError naming the model's actions
        utility = {a: float(utility.get(a, 0.0)) for a in rec.actions}
    l0l1_pass(rec, es, ks=ks, beam_width=beam_width, diversity_lambda=0.0, overretrieve=overretrieve,
              utility=utility, batch_size=batch_size, parts=parts, transitions=trans)
    d = FusionWeights()  # a tie with the untuned weights keeps them: nothing measured says to change
    # each (a, w, v) beside every transition weight; a given (a, w, v, t[, h]) as it is
    full = [tuple(g) if len(g) >= 4 else (*g, t) for g in (grid or FUSION_GRID)
            for t in ((None,) if len(g) >= 4 else TRANSITION_GRID)]
    pref = (d.action_weight, d.retrieval_weight, d.sid_weight, d.transition_weight, d.history_weight)
    best, rows = choose_fusion(parts, ks, full, metric, prefer=pref)
    if not any(len(g) == 5 for g in full):  # the history weight beside the best, then the grid again beside it
        at = tuple(best[x] for x in "awvt")
        best_h, rows_h = choose_fusion(parts, ks, [(*at, h) for h in HISTORY_GRID], metric, prefer=(*at, 0.0))
        rows += [r for r in rows_h if r["h"] != 0]
        if best_h["h"] != 0:
            best, again = choose_fusion(parts, ks, [(*g, best_h["h"]) for g in full], metric, prefer=pref)
            rows += again
    heads = next((r for r in rows if tuple(r[x] for x in "awvth") == (1.0, 0.0, 0.0, 0.0, 0.0)), None)
    chosen = FusionWeights(best["a"], best["w"], best["v"], best["t"], best["h"])
    wk = ("a", "w", "v", "t", "h")
    out: dict[str, Any] = {
        "chosen": asdict(chosen), "metric": metric, "valid": {k: v for k, v in best.items() if k not in wk},
        "heads_only_valid": None if heads is None else {k: v for k, v in heads.items() if k not in wk},
        "chosen_on": {"split": "valid", "cases": len(es), "beam_width": beam_width, "overretrieve": overretrieve,
                      "utility": utility, "sid_mode": rec.served_sid_mode},
        "checkpoint": str(rec.checkpoint), "step": rec.step, "grid": rows, "seconds": time.perf_counter() - t0}
    if save:
        served = None  # with t > 0 the table of every event (the served model has seen them all), beside the weights
        if chosen.transition_weight > 0:
            events = open_store(workdir).read_events(columns=["user_id", "item_id", "seq"])
            served = TransitionTable.from_events_table(events, rec.catalog)
        out["path"] = str(rec.store_fusion(chosen, utility, {k: out[k] for k in ("metric", "valid", "chosen_on")},
                                           transitions=served))
    return out
