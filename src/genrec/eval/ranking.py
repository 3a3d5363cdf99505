"""Ranking metrics on held-out feedview slates: AUC per action and UniPinRec's Hit@3.

UniPinRec §4 (ranking evaluation): each slate is scored by the action heads as a decode step
over the cached history that precedes the request (``Recommender.score_candidates`` = the
model's ``rank``), exactly what serving does in L1. Non-standard details:

* A slate's history is the user's events before the request (``Feedview.history_len``), the
  newest ``context_len`` of them; slate items unknown to the catalogue are dropped; slates with
  no history or no known item are skipped (counted in ``skipped``).
* AUC per action ``c`` pools every scored slate item: score ``sigmoid(logit_c)``, label = bit
  ``c`` of the item's label mask (NaN when one class is absent).
* Hit@3 ranks each slate by the utility ``sum_c u_c * sigmoid(logit_c)`` (the L0+L1 utility)
  and counts positives = items with any positive-action bit
  (:func:`genrec.eval.metrics.hit_at_k_slates`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from genrec.eval.metrics import auc, hit_at_k_slates

if TYPE_CHECKING:
    from genrec.data.join import UserExample
    from genrec.retrieve.recommender import Recommender


@dataclass
class Slate:
    """One scorable request: history rows/actions/surfaces/ts, candidate rows, label masks."""

    rows: np.ndarray  # int64 [n]
    actions: np.ndarray  # int64 [n]
    surfaces: np.ndarray  # int64 [n]
    ts: np.ndarray  # int64 [n]
    cand_rows: np.ndarray  # int64 [k]
    labels: np.ndarray  # int64 [k] bitmask over actions
    surface: int
    request_ts: int


def collect_slates(records: Sequence["UserExample"], feedviews: Sequence[Sequence[Any]], rec: "Recommender",
                   *, context_len: int) -> tuple[list[Slate], int]:
    """Slates from eval records (``feedviews[i]`` are record i's slates). Returns (slates, skipped)."""
    out: list[Slate] = []
    skipped = 0
    for r, fvs in zip(records, feedviews):
        for fv in fvs:
            hl = int(fv.history_len)
            cand = rec.catalog.rows(np.asarray(fv.item_ids, dtype=np.int64), strict=False)
            keep = cand >= 0
            if hl < 1 or not keep.any():
                skipped += 1
                continue
            hrows = rec.catalog.rows(np.asarray(r.items[:hl], dtype=np.int64), strict=False)
            ok = hrows >= 0
            sel = np.flatnonzero(ok)[-context_len:]
            if len(sel) == 0:
                skipped += 1
                continue
            out.append(Slate(hrows[sel], np.asarray(r.actions[:hl], np.int64)[sel],
                             np.asarray(r.surfaces[:hl], np.int64)[sel], np.asarray(r.timestamps[:hl], np.int64)[sel],
                             cand[keep], np.asarray(fv.labels, np.int64)[keep], int(fv.surface), int(fv.request_ts)))
    return out, skipped


@torch.no_grad()
def score_slates(rec: "Recommender", slates: Sequence[Slate], *, batch_size: int = 128) -> list[np.ndarray]:
    """Per slate: action probabilities ``[k, C]`` from one history encode + one rank step."""
    out: list[np.ndarray] = []
    dev = rec.device
    for lo in range(0, len(slates), batch_size):
        chunk = slates[lo:lo + batch_size]
        parsed = [{"rows": s.rows, "actions": s.actions, "surfaces": s.surfaces, "ts": s.ts} for s in chunk]
        mb = rec.model_batch(parsed)
        cache, _ = rec.encode(mb)
        k = max(len(s.cand_rows) for s in chunk)
        rows = np.zeros((len(chunk), k), np.int64)  # pad with row 0: candidates never see each other
        for i, s in enumerate(chunk):
            rows[i, :len(s.cand_rows)] = s.cand_rows
        surf = torch.tensor([s.surface for s in chunk], dtype=torch.int64, device=dev)
        rts = torch.tensor([s.request_ts for s in chunk], dtype=torch.int64, device=dev)
        logits = rec.score_candidates(cache, torch.from_numpy(rows).to(dev), None, surf, rts)  # [B, k, C]
        p = torch.sigmoid(logits.float()).cpu().numpy()
        out.extend(p[i, :len(s.cand_rows)] for i, s in enumerate(chunk))
    return out


def ranking_metrics(rec: "Recommender", slates: Sequence[Slate], *, utility: Mapping[str, float] | None = None,
                    k: int = 3, batch_size: int = 128) -> dict[str, Any]:
    """``{"auc": {action: value}, "hit@3": value, "n_slates", "n_items"}`` over ``slates``."""
    if rec.model.action_head is None:
        return {"auc": {}, f"hit@{k}": float("nan"), "n_slates": 0, "n_items": 0,
                "note": f"layout {rec.config.layout!r} has no action heads"}
    probs = score_slates(rec, slates, batch_size=batch_size)
    u = rec.utility_vector(utility).cpu().numpy()
    return slate_metrics(probs, slates, rec.actions, rec.positive_actions, u, k)


def slate_metrics(probs: Sequence[np.ndarray], slates: Sequence[Slate], actions: Sequence[str],
                  positive_actions: Sequence[str], u: np.ndarray, k: int = 3) -> dict[str, Any]:
    """The metrics of :func:`ranking_metrics` from already scored slates (``probs[i]``: slate i's
    ``[k_i, C]`` action probabilities; ``u``: the utility vector ``[C]``)."""
    n_act = len(actions)
    bits = 1 << np.arange(n_act)
    if len(probs):
        p_all = np.concatenate(list(probs))  # [M, C]
        y_all = (np.concatenate([s.labels for s in slates])[:, None] & bits[None, :]) > 0  # [M, C]
    else:
        p_all = np.zeros((0, n_act))
        y_all = np.zeros((0, n_act), bool)
    pos_mask = sum(1 << list(actions).index(a) for a in positive_actions if a in actions)
    hit = hit_at_k_slates([p @ u for p in probs], [(s.labels & pos_mask) > 0 for s in slates], k)
    return {"auc": {a: auc(p_all[:, c], y_all[:, c]) for c, a in enumerate(actions)}, f"hit@{k}": hit,
            "n_slates": len(slates), "n_items": int(len(p_all)),
            "positive_rate": {a: float(y_all[:, c].mean()) if len(y_all) else float("nan")
                              for c, a in enumerate(actions)}}
