"""The Recommender's request-level calls on parsed histories: a batch of them through the funnel in static
shapes (:func:`run_parsed`), and given candidates scored for one history (:func:`rank_items`).

:func:`run_parsed` is where batches meet :mod:`genrec.infer.buckets`: with the Recommender's ``buckets`` a batch
runs in chunks of at most the largest bucket, each padded to its bucket with copies of its first row, and
only the real rows' answers are built (the copies' are dropped before any per-result work).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from genrec.errors import ConfigError, DataError
from genrec.infer.funnel import Scorer, rank_given, transition_input
from genrec.infer.history import vocab_index
from genrec.infer.profile import stage
from genrec.infer.results import RankedList, Recommendation, RecommendationList, recommendation_lists

if TYPE_CHECKING:  # these run over a Recommender; recommender.py imports this module
    from genrec.infer.recommender import Recommender

__all__ = ["pad_rows", "rank_items", "run_parsed", "start_parsed"]


def pad_rows(rec: Recommender, part: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``part`` padded to its batch bucket with copies of its first row (as it is without buckets)."""
    n = len(part)
    size = rec.buckets.batch(n) if rec.buckets is not None else n
    return list(part) + [part[0]] * (size - n)


def run_parsed(rec: Recommender, parsed: Sequence[dict[str, Any]], **kw: Any) -> list[RecommendationList]:
    """:meth:`Recommender.recommend <genrec.infer.recommender.Recommender.recommend>` (its arguments) for
    histories already parsed (``rec.parse_history``; the service parses each request once), one list each:
    :func:`start_parsed` and its answers at once."""
    return start_parsed(rec, parsed, **kw)()


def start_parsed(rec: Recommender, parsed: Sequence[dict[str, Any]], *, k: int = 10, beam_width: int = 20,
                 diversity_lambda: float = 0.0, sources: Sequence[str] | None = None, rank: bool | None = None,
                 overretrieve: int = 3, utility: Mapping[str, float] | None = None, exclude_history: bool = False,
                 surface: str | int | None = None, request_ts: int | None = None,
                 retrieval_weight: float | None = None, sid_weight: float | None = None,
                 action_weight: float | None = None, scorer: Scorer | None = None,
                 t_wall: float | None = None, transition_weight: float | None = None,
                 history_weight: float | None = None) -> Callable[[], list[RecommendationList]]:
    """The model's part of :func:`run_parsed` now (encode, beams, ANN, union, ranking, top-k), and a call that
    builds the answers' lists from it (host work only, no device or model state: the service builds them after
    it lets go of the model). With ``rec.buckets`` the batch runs in chunks of at most the largest bucket, each
    padded to its bucket with copies of its first row (:mod:`genrec.infer.buckets`; the copies' answers are
    dropped). ``scorer``: the ranking stage in place of ``rec.score_candidates`` (the service's remote ranker; no
    copy of ``rec``).
    ``t_wall``: when the call started (``perf_counter``; default now), for the ``wall`` and ``parse`` timings."""
    t_wall = time.perf_counter() if t_wall is None else t_wall
    b = len(parsed)
    if b == 0:
        raise DataError("empty batch of histories", field="history")
    s = None if surface is None else vocab_index(surface, rec.surfaces, "surface", "surface")
    done: list[tuple[Any, Sequence[dict[str, Any]], float]] = []  # each chunk's top-k, its requests, its parse ms
    for lo, hi in rec.buckets.chunks(b) if rec.buckets is not None else [(0, b)]:
        part = parsed[lo:hi]
        rows = pad_rows(rec, part)
        with stage("tensors"):
            mb, surf = rec.history_batch(rows)
            if s is not None:
                surf = torch.full((len(rows),), s, dtype=torch.int64, device=rec.device)
            rts = None
            if request_ts is not None:
                rts = torch.full((len(rows),), int(request_ts), dtype=torch.int64, device=rec.device)
        t_parse = _ms(t_wall)
        # the whole given history, not only the newest context_len items the model reads: for the exclusion and
        # the history term
        h = rec.fusion.resolve(None, None, None, history_weight=history_weight).history_weight
        hist = [given_rows(p) for p in rows] if exclude_history or h != 0 else None
        excl = hist if exclude_history else None
        res = rec.run_batch(mb, k=k, beam_width=beam_width, diversity_lambda=diversity_lambda, sources=sources,
                            rank=rank, overretrieve=overretrieve, utility=utility, exclude_rows=excl,
                            request_surface=surf, request_ts=rts, retrieval_weight=retrieval_weight,
                            sid_weight=sid_weight, action_weight=action_weight, n_real=len(part), scorer=scorer,
                            last_rows=last_rows(rows), transition_weight=transition_weight, history_rows=hist,
                            history_weight=history_weight)
        done.append((res.head(len(part)), part, t_parse))
    codes = rec.catalog.codes if rec.codes is not None else None  # the catalogue's SIDs (on the host)

    def answers() -> list[RecommendationList]:
        outs: list[RecommendationList] = []
        for res, part, t_parse in done:
            t0 = time.perf_counter()
            with stage("results"):
                # the SIDs of every result row [B, K, L] (the real codes, not the ones the model reads)
                sids = None if codes is None else codes[torch.from_numpy(np.maximum(res.rows, 0))].cpu().numpy()
                got = recommendation_lists(res, part, rec.catalog, sids, rec.actions)
            # outside the pipeline's "total": parsing + batching, building the results, the whole call
            extra = {"parse": t_parse, "respond": _ms(t0), "wall": _ms(t_wall)}
            for o in got:
                o.timings_ms.update(extra)
            outs.extend(got)
        return outs

    return answers


@torch.no_grad()
def rank_items(rec: Recommender, history: Sequence[Any], item_ids: Sequence[int], *, surface: str | int | None,
               request_ts: int | None, utility: Mapping[str, float] | None, action_weight: float | None,
               retrieval_weight: float | None, sid_weight: float | None, beam_width: int,
               diversity_lambda: float, transition_weight: float | None = None,
               history_weight: float | None = None) -> RankedList:
    """:meth:`genrec.infer.recommender.Recommender.rank_items` (its arguments)."""
    t_wall = time.perf_counter()
    if rec.model.action_head is None:
        raise ConfigError(f"rank: layout {rec.config.layout!r} has no action heads")
    fw = rec.fusion.resolve(action_weight, retrieval_weight, sid_weight, transition_weight, history_weight)
    u = rec.utility_vector(utility)
    p = rec.parse_history(history)
    trans = transition_input(rec, None, last_rows([p]), fw.transition_weight)
    s = vocab_index(surface, rec.surfaces, "surface", "surface") if surface is not None \
        else int(p["surfaces"][-1])
    ids = np.asarray(list(item_ids), dtype=np.int64)
    rows = rec.catalog.rows(ids, strict=False) if len(ids) else np.zeros(0, np.int64)
    ok = np.flatnonzero(rows >= 0)
    items: list[Recommendation] = []
    t: dict[str, float] = {}
    if len(ok):
        dev = rec.device
        rts = None if request_ts is None else torch.tensor([int(request_ts)], device=dev)
        with rec._amp():
            t0 = time.perf_counter()
            cache, user = rec.encode(rec.model_batch([p]))
            t["encode"] = _ms(t0)
            t0 = time.perf_counter()
            score, probs = rank_given(rec, cache, user, torch.as_tensor(rows[ok], device=dev)[None], u,
                                      action_weight=fw.action_weight, retrieval_weight=fw.retrieval_weight,
                                      sid_weight=fw.sid_weight, beam_width=beam_width,
                                      diversity_lambda=diversity_lambda,
                                      request_surface=torch.tensor([s], device=dev), request_ts=rts,
                                      transition_weight=fw.transition_weight, trans=trans,
                                      history_weight=fw.history_weight,
                                      history_rows=given_rows(p) if fw.history_weight else None)
            t["rank"] = _ms(t0)
        order = np.argsort(-score, kind="stable")
        sel = rows[ok][order]
        sids = None if rec.codes is None else rec.codes[torch.as_tensor(sel, device=rec.codes.device)].cpu().tolist()
        titles = rec.catalog.titles
        items = [Recommendation(item_id=int(ids[ok[j]]), title=None if titles is None else titles[int(r)],
                                score=float(score[j]), sources=(), sid=None if sids is None else tuple(sids[n]),
                                action_probs={a: float(probs[j, c]) for c, a in enumerate(rec.actions)})
                 for n, (j, r) in enumerate(zip(order, sel))]
    t["total"] = sum(t.values())
    t["wall"] = _ms(t_wall)
    return RankedList(items, unknown_items=[int(i) for i in ids[rows < 0]], timings_ms=t,
                      dropped_items=p["dropped"], history_used=len(p["rows"]), history_truncated=p["truncated"])


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def last_rows(parsed: Sequence[dict[str, Any]]) -> np.ndarray:
    """int64 [B]: each parsed history's last catalogue row (-1 for an empty one): the L1 transition term's source."""
    return np.array([int(p["rows"][-1]) if len(p["rows"]) else -1 for p in parsed], dtype=np.int64)


def given_rows(parsed: dict[str, Any]) -> np.ndarray:
    """The catalogue rows of the WHOLE given history (not only the newest context_len the model reads), each once:
    what ``exclude_history`` leaves out and the L1 history term marks."""
    return np.unique(parsed["given_rows"])
