"""What the Recommender returns: one :class:`Recommendation` per item, a :class:`RecommendationList` per
history (with what happened: stage timings, dropped and truncated history items) and the funnel's batched
core output, :class:`BatchResult` (catalogue rows, scores, stage bitmask; see :mod:`genrec.infer.funnel`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from genrec.catalog import ItemCatalog
from genrec.decode.beam import BeamResult

SOURCES = ("sid", "ann")  # the L0 stages a request may name; the transition source runs with its L1 term
SRC_BIT = {"sid": 1, "ann": 2, "transition": 4}  # BatchResult.src: bitmask of the L0 stages that retrieved a row


@dataclass
class Recommendation:
    """One recommended item. ``sources``: the L0 stages that retrieved it; ``sid``: its full code;
    ``action_probs``: sigmoid of each action head (None when not ranked); ``sid_logprob`` /
    ``ann_score``: the stage scores (None when that stage did not retrieve it)."""

    item_id: int
    title: str | None
    score: float
    sources: tuple[str, ...]
    sid: tuple[int, ...] | None
    action_probs: dict[str, float] | None = None
    sid_logprob: float | None = None
    ann_score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sources"] = list(self.sources)
        d["sid"] = None if self.sid is None else list(self.sid)
        return d


class RecommendationList(list):  # type: ignore[type-arg]
    """``list[Recommendation]`` plus what happened: per-stage ``timings_ms``, ``dropped_items``
    (unknown history ids), ``history_used`` (items fed to the model after truncation)."""

    def __init__(self, items: Sequence[Recommendation] = (), *, timings_ms: dict[str, float] | None = None,
                 dropped_items: list[int] | None = None, history_used: int = 0, history_truncated: int = 0) -> None:
        super().__init__(items)
        self.timings_ms = dict(timings_ms or {})
        self.dropped_items = list(dropped_items or [])
        self.history_used = history_used
        self.history_truncated = history_truncated

    def to_dict(self) -> dict[str, Any]:
        return {"items": [r.to_dict() for r in self], "timings_ms": self.timings_ms,
                "dropped_items": self.dropped_items, "history_used": self.history_used,
                "history_truncated": self.history_truncated}


class RankedList(RecommendationList):
    """Given candidates scored for one history (:meth:`genrec.infer.recommender.Recommender.rank_items`), best
    first (ties keep the given order): a :class:`RecommendationList` whose items have no ``sources``, plus
    ``unknown_items`` (the candidates the catalogue lacks, in the given order)."""

    def __init__(self, items: Sequence[Recommendation] = (), *, unknown_items: list[int] | None = None,
                 **kw: Any) -> None:
        super().__init__(items, **kw)
        self.unknown_items = list(unknown_items or [])

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "unknown_items": self.unknown_items}


@dataclass
class BatchResult:
    """Batched core output, rows sorted by final score. ``rows`` int64 [B, K] catalogue rows (-1 pad);
    ``scores`` [B, K]; ``src`` int8 [B, K] bitmask (1 = sid, 2 = ann, 4 = transition); ``sid_lp`` / ``ann_score``
    [B, K] (nan where the stage did not retrieve the item); ``probs`` [B, K, C] or None;
    ``beams``: the SID beam result (None without the SID stage)."""

    rows: np.ndarray
    scores: np.ndarray
    src: np.ndarray
    sid_lp: np.ndarray
    ann_score: np.ndarray
    probs: np.ndarray | None
    beams: BeamResult | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    l1_parts: dict[str, np.ndarray] | None = None
    """With ranking and ``keep_parts``: the L1 score's parts for every L0 candidate, [B, M] each (M = the largest
    union): ``rows`` (-1 pad), ``utility`` (Σ u_c p_c), ``dot`` (user · candidate vector),
    ``sid_lp`` (log P(SID) under the beams, the request's lowest beam log-probability for
    candidates the SID stage did not retrieve). For choosing fusion weights offline."""

    def head(self, b: int) -> "BatchResult":
        """The first ``b`` rows (a batch padded to a bucket, its padding dropped); itself when it has ``b``."""
        if b == self.rows.shape[0]:
            return self
        beams = None if self.beams is None else BeamResult(self.beams.codes[:b], self.beams.scores[:b],
                                                            self.beams.valid[:b])
        return BatchResult(self.rows[:b], self.scores[:b], self.src[:b], self.sid_lp[:b], self.ann_score[:b],
                           None if self.probs is None else self.probs[:b], beams, self.timings_ms,
                           None if self.l1_parts is None else {k: v[:b] for k, v in self.l1_parts.items()})



def recommendation_lists(res: BatchResult, parsed: Sequence[dict[str, Any]], catalog: ItemCatalog,
                         sids: np.ndarray | None, actions: Sequence[str]) -> list[RecommendationList]:
    """One :class:`RecommendationList` per parsed history (:mod:`genrec.infer.history`) from the batch's
    result; ``sids``: the full SID code of every result row [B, K, L] (None without SIDs)."""
    # whole arrays to Python objects once (no per-element numpy scalars); the same values as float(x[i, j])
    ok = res.rows >= 0
    ids = np.where(ok, catalog.item_ids[np.maximum(res.rows, 0)], -1).tolist()
    rows, scores, bits = res.rows.tolist(), res.scores.tolist(), res.src.tolist()
    sid_lp, ann = (_none_for_nan(res.sid_lp), _none_for_nan(res.ann_score))
    codes = None if sids is None else sids.tolist()
    probs = None if res.probs is None else res.probs.tolist()
    titles = catalog.titles
    names = {b: tuple(s for s in SRC_BIT if b & SRC_BIT[s]) for b in range(8)}
    acts = list(actions)
    outs = []
    for i, p in enumerate(parsed):
        recs = [Recommendation(item_id=ids[i][j], title=titles[r] if titles is not None else None, score=scores[i][j],
                               sources=names[bits[i][j]], sid=None if codes is None else tuple(codes[i][j]),
                               action_probs=None if probs is None else dict(zip(acts, probs[i][j])),
                               sid_logprob=sid_lp[i][j], ann_score=ann[i][j])
                for j, r in enumerate(rows[i]) if r >= 0]
        outs.append(RecommendationList(recs, timings_ms=res.timings_ms, dropped_items=p["dropped"],
                                       history_used=len(p["rows"]), history_truncated=p["truncated"]))
    return outs


def _none_for_nan(a: np.ndarray) -> list[Any]:
    """``a.tolist()`` with None where ``a`` is nan."""
    o = a.astype(object)
    o[np.isnan(a)] = None
    return o.tolist()
