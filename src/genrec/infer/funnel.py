"""The L0 -> L1 funnel on ONE history encode (UniPinRec §3.3; PinGER decoding), as named steps.

:func:`run_funnel` encodes the batch once, then: :func:`retrieve` (L0: SID beams over the cache and / or
the ANN search with the user vector, each over-retrieving ``k * overretrieve`` rows), :func:`union`
(deduplicated :class:`Candidates`, remembering which stage found each row and its stage score),
:func:`rank` (L1: the action heads score every candidate over the cached history, fused with the
dense and SID scores) or, without ranking, :func:`merged_order`, and :func:`top_k`.

Every model call goes through the Recommender's stage methods (``encode``, ``retrieve_sids`` -- full-code
beams through ``decode_sids`` and ``beam_rows``, or the coarse-prefix retrieval -- and ``score_candidates``,
or the :data:`Scorer` a call hands in: the service's remote ranker), so every caller runs the same funnel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from genrec.decode.beam import BeamResult
from genrec.decode.rows import compact, first_seen
from genrec.errors import ConfigError
from genrec.infer.device_funnel import PlanMiss, device_inputs, l1_score, run_on_device, serves, sid_width
from genrec.infer.profile import stage
from genrec.infer.results import BatchResult
from genrec.infer.transitions import TransitionTable
from genrec.model.genrec_model import ModelBatch
from genrec.model.kv_cache import KVCache

if TYPE_CHECKING:  # the funnel runs over a Recommender's stages; recommender.py imports this module
    from genrec.infer.recommender import Recommender

__all__ = ["Candidates", "Retrieved", "Scorer", "in_history", "l1_score", "merged_order", "rank", "rank_given", "retrieve",
           "run_funnel", "top_k", "union"]

Scorer = Callable[[KVCache, torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None], torch.Tensor]
"""The ranking stage: (cache, candidate rows [B, M], their vectors [B, M, D], request surface [B], request
time [B]) -> action logits [B, M, C] -- ``Recommender.score_candidates``, or what replaces it (the service's
remote ranker)."""
Transitions = tuple[TransitionTable, np.ndarray]  # the L1 transition term: the table, each row's last item


@dataclass
class Retrieved:
    """L0's lists per request: SID rows in beam order with their beam log-probabilities, ANN rows with
    their inner products and the vectors the index holds for them (empty for a stage not run); with a
    coarse-prefix SID stage, ``sid_reach``: every row it scored (under a kept prefix) and its score (None: a
    full-code stage, or no L1 SID term to read it)."""

    beams: BeamResult | None
    sid_rows: np.ndarray  # int64 [B, n_sid] (-1 pad)
    sid_lp: np.ndarray  # float32 [B, n_sid]
    ann_rows: np.ndarray  # int64 [B, n_ann] (-1: not in the catalogue)
    ann_score: np.ndarray  # float32 [B, n_ann]
    ann_vecs: np.ndarray | None  # [B, n_ann, D]
    sid_reach: tuple[np.ndarray, np.ndarray] | None = None  # (rows int64 [B, R] (-1 pad), scores float32 [B, R])
    trans_rows: np.ndarray | None = None  # int64 [B, n_t] (-1 pad): the last item's most frequent successors


@dataclass
class Candidates:
    """The union of the L0 lists, one row per request in union order -- the SID stage's rows in beam order,
    then the ANN rows it did not find, in ANN order -- as arrays [B, M]: ``rows`` int64 (0 pad), ``valid``
    bool, ``src`` int8 bitmask of the stages that found the row (1 = sid, 2 = ann, 4 = transition: rows only
    the transition source found come last, so leaving them out leaves the two-source union), ``sid_lp`` /
    ``ann_score`` float32 (nan: that stage did not find it), ``ann_at`` int64 (the column of ``Retrieved.ann_vecs`` holding
    the vector the index returned for it, -1: none) and ``merged`` int64 (its position in the round-robin
    merge of the two lists)."""

    rows: np.ndarray
    valid: np.ndarray
    src: np.ndarray
    sid_lp: np.ndarray
    ann_score: np.ndarray
    ann_at: np.ndarray
    merged: np.ndarray

    @property
    def width(self) -> int:
        return int(self.rows.shape[1])


def _lookup(table: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The index in ``table`` (distinct int64 keys) of each ``query`` key, -1 where absent."""
    if len(table) == 0 or len(query) == 0:
        return np.full(len(query), -1, np.int64)
    order = np.argsort(table, kind="stable")
    at = np.minimum(np.searchsorted(table[order], query), len(table) - 1)
    return np.where(table[order][at] == query, order[at], -1)


def _scores_of(rows: np.ndarray, got_rows: np.ndarray, got_lp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The SID term's rule, per request b: the score ``got_lp[b, j]`` of each of ``rows[b]`` that ``got_rows[b]``
    holds (nan where it does not), float32 like ``rows``, and the lowest score ``got_rows[b]`` holds (0 if none),
    float32 [B]. ``got_rows`` int [B, R] (-1 pad, distinct otherwise), ``got_lp`` [B, R]."""
    ok = got_rows >= 0
    req = np.arange(got_rows.shape[0], dtype=np.int64)[:, None]
    stride = np.int64(1) << 40  # key = request * stride + row
    vals = got_lp[ok].astype(np.float32)
    at = _lookup(np.broadcast_to(req, got_rows.shape)[ok] * stride + got_rows[ok], (req * stride + rows).reshape(-1))
    lp = vals[np.maximum(at, 0)] if len(vals) else np.zeros(len(at), np.float32)
    lp = np.where(at >= 0, lp, np.nan).astype(np.float32).reshape(rows.shape)
    return lp, _row_floor(got_lp, ok)


def _row_floor(scores: np.ndarray, has: np.ndarray) -> np.ndarray:
    """float32 [B]: the lowest of ``scores[b]`` where ``has[b]`` (0 where it holds none)."""
    return np.where(has.any(1), np.where(has, scores, np.inf).min(1, initial=np.inf), 0.0).astype(np.float32)


def _sid_lp_matrix(cands: Candidates, reach: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """float32 [B, M]: each union candidate's log P(SID) under the beams; for a candidate the SID
    stage did not retrieve, the lowest retrieved beam log-probability of its request (0 if none; 0 pad).
    With a coarse-prefix stage's ``reach`` (:class:`Retrieved`): a candidate the stage scored takes that score,
    any other the lowest score of the reach -- what :func:`rank_given` gives it, whatever the funnel kept."""
    if reach is None:
        lp = cands.sid_lp
        floor = _row_floor(lp, ~np.isnan(lp))
    else:
        lp, floor = _scores_of(cands.rows, *reach)
    has = ~np.isnan(lp)
    return np.where(cands.valid, np.where(has, lp, floor[:, None]), 0.0).astype(np.float32)


def sid_reach_limit(rec: Recommender, beam_width: int) -> int:
    """The most rows a coarse-prefix SID stage scores at ``beam_width`` (each beam's prefix times the most items
    under one prefix): asked for that many, it returns its whole reach, best first."""
    assert rec.trie is not None
    return beam_width * max(1, int(rec.trie.last_level()[2]))


def retrieve(rec: Recommender, cache: KVCache, user: torch.Tensor | None, srcs: Sequence[str], b: int, n: int,
             extra: int, beam_width: int, diversity_lambda: float, t: dict[str, float],
             n_real: int | None = None, reach: bool = True, trans: Transitions | None = None) -> Retrieved:
    """L0: up to ``n + extra`` rows per request from each stage in ``srcs`` (``extra``: the most rows a
    request excludes); stage times into ``t``. ``n_real``: rows past it are copies of row 0 (bucket
    padding): the ANN index is searched for the first ``n_real`` only and row 0's answer copied. ``trans``
    (the transition table, each request's last row): also the last item's most frequent successors."""
    beams, got_reach = None, None
    sid_rows = np.full((b, 0), -1, np.int64)
    sid_lp = np.zeros((b, 0), np.float32)
    if "sid" in srcs:
        with stage("sid", t):
            width = sid_width(beam_width, extra, srcs)
            whole = reach and rec.served_sid_mode != "full"  # a coarse-prefix stage's whole reach: L1's SID term
            lim = max(n + extra, sid_reach_limit(rec, width)) if whole else n + extra
            beams, sid_rows, sid_lp = rec.retrieve_sids(cache, width, diversity_lambda, lim, user)
            if whole:
                got_reach = (sid_rows, sid_lp)
                sid_rows, sid_lp = sid_rows[:, :n + extra], sid_lp[:, :n + extra]
    ann_rows: np.ndarray = np.full((b, 0), -1, np.int64)
    ann_sc = np.zeros((b, 0), np.float32)
    ann_vecs = None
    if "ann" in srcs:
        with stage("ann", t):
            assert rec.ann is not None and user is not None
            kk = min(n + extra, len(rec.ann))
            real = b if n_real is None else n_real
            ann_ids, ann_sc, ann_vecs = rec.ann.search_and_reconstruct(user[:real].float(), kk)
            if real < b:
                ann_ids, ann_sc, ann_vecs = (np.concatenate([x, np.repeat(x[:1], b - real, 0)])
                                             for x in (ann_ids, ann_sc, ann_vecs))
            ann_rows = rec.catalog.rows(ann_ids.reshape(-1), strict=False).reshape(ann_ids.shape)
    trans_rows = None
    if trans is not None:
        with stage("transition", t):
            trans_rows = trans[0].successors(trans[1], n + extra)
    return Retrieved(beams, sid_rows, sid_lp, ann_rows, ann_sc, ann_vecs, got_reach, trans_rows)


def union(got: Retrieved, b: int, n: int, exclude_rows: Sequence[np.ndarray] | None) -> Candidates:
    """Deduplicate the stages' lists (the first ``n`` not excluded of each; within a list the first
    occurrence of a row counts), remembering stages and scores. Array operations over the whole batch:
    no Python loop over requests or candidates (the item-by-item twin is in tests/infer/test_funnel_batch.py)."""
    tr = got.trans_rows if got.trans_rows is not None else np.full((b, 0), -1, np.int64)
    stride = 1 + max(int(got.sid_rows.max(initial=0)), int(got.ann_rows.max(initial=0)),
                     int(tr.max(initial=0)))  # key = request * stride + row
    ex = None if exclude_rows is None else _request_keys(exclude_rows, stride)

    def kept(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keep = first_seen(rows)
        if ex is not None and keep.any():
            keep &= ~np.isin(np.arange(b, dtype=np.int64)[:, None] * stride + rows, ex)
        return compact(keep, n)

    si, sj, sp = kept(got.sid_rows)
    ai, aj, ap = kept(got.ann_rows)
    n_s = np.bincount(si, minlength=b)
    s_rows, a_rows = got.sid_rows[si, sj], got.ann_rows[ai, aj]
    in_sid = _lookup(si * stride + s_rows, ai * stride + a_rows)  # each kept ANN row's index among the SID ones
    new = in_sid < 0
    # a new ANN row goes after its request's SID rows, in ANN order
    new_at = np.cumsum(np.bincount(ai[new], minlength=b)) - np.bincount(ai[new], minlength=b)
    col_new = n_s[ai[new]] + (np.arange(int(new.sum())) - new_at[ai[new]])
    counts = n_s + np.bincount(ai[new], minlength=b)
    m = max(1, int(counts.max(initial=0)))
    rows = np.zeros((b, m), np.int64)
    src = np.zeros((b, m), np.int8)
    sid_lp = np.full((b, m), np.nan, np.float32)
    ann_score = np.full((b, m), np.nan, np.float32)
    ann_at = np.full((b, m), -1, np.int64)
    rows[si, sp], src[si, sp], sid_lp[si, sp] = s_rows, 1, got.sid_lp[si, sj]
    hit = in_sid[~new]
    ci = np.concatenate([si[hit], ai[new]])
    cj = np.concatenate([sp[hit], col_new])
    rows[ai[new], col_new] = a_rows[new]
    src[ci, cj] |= 2
    ann_score[ci, cj] = np.concatenate([got.ann_score[ai[~new], aj[~new]], got.ann_score[ai[new], aj[new]]])
    ann_at[ci, cj] = np.concatenate([aj[~new], aj[new]])
    valid = np.arange(m)[None, :] < counts[:, None]
    # the round-robin merge (SID 0, ANN 0, SID 1, ANN 1, ...): a row's place is the rank of its first
    # appearance there, SID position p at 2p, ANN position q at 2q + 1
    first = np.full((b, m), 4 * m + 4, np.int64)
    first[si, sp] = 2 * sp
    first[si[hit], sp[hit]] = np.minimum(2 * sp[hit], 2 * ap[~new] + 1)
    first[ai[new], col_new] = 2 * ap[new] + 1
    merged = np.where(valid, np.argsort(np.argsort(first, axis=1, kind="stable"), axis=1, kind="stable"), 0)
    cands = Candidates(rows, valid, src, sid_lp, ann_score, ann_at, merged)
    return _append_transitions(cands, *kept(tr)[:2], tr, stride) if tr.shape[1] else cands


def _append_transitions(c: Candidates, ti: np.ndarray, tj: np.ndarray, tr: np.ndarray, stride: int) -> Candidates:
    """The union with the transition source's kept rows (``ti``, ``tj``: their places in ``tr``, in request then
    successor order): a row already there gains bit 4, a new one goes after the request's other rows, in
    successor order, with no SID or ANN score, last in the merged order."""
    b, m = c.rows.shape
    t_rows = tr[ti, tj]
    vi, vj = np.nonzero(c.valid)
    at = _lookup(vi * stride + c.rows[vi, vj], ti * stride + t_rows)  # each kept successor's place in the union
    old, new = at >= 0, at < 0
    counts = c.valid.sum(1)
    n_new = np.bincount(ti[new], minlength=b)
    col = counts[ti[new]] + (np.cumsum(new) - 1)[new] - (np.cumsum(n_new) - n_new)[ti[new]]
    w = max(m, int((counts + n_new).max(initial=0)))

    def grown(x: np.ndarray, fill: float | int) -> np.ndarray:
        out = np.full((b, w), fill, x.dtype)
        out[:, :m] = x
        return out

    rows, src, sid_lp, ann_score = grown(c.rows, 0), grown(c.src, 0), grown(c.sid_lp, np.nan), grown(c.ann_score, np.nan)
    ann_at, merged = grown(c.ann_at, -1), grown(c.merged, 0)
    src[vi[at[old]], vj[at[old]]] |= 4
    rows[ti[new], col], src[ti[new], col], merged[ti[new], col] = t_rows[new], 4, col
    return Candidates(rows, np.arange(w)[None, :] < (counts + n_new)[:, None], src, sid_lp, ann_score, ann_at, merged)


def rank(rec: Recommender, cache: KVCache, user: torch.Tensor | None, cands: Candidates, got: Retrieved,
         u: torch.Tensor, *, action_weight: float, retrieval_weight: float, sid_weight: float,
         request_surface: torch.Tensor | None, request_ts: torch.Tensor | None, keep_parts: bool,
         scorer: Scorer | None = None, transition_weight: float = 0.0, trans: Transitions | None = None,
         history_weight: float = 0.0, history_rows: Sequence[np.ndarray] | None = None
         ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray] | None]:
    """L1: (fused score [B, M], action probabilities [B, M, C], the score's parts or None); see
    :meth:`genrec.infer.recommender.Recommender.run_batch` for the fusion. ``scorer``: the ranking
    stage (default ``rec.score_candidates``). ``trans``: (the transition table, each row's last history item).
    ``history_rows``: each request's history rows (the history term's)."""
    b, m = cands.rows.shape
    with stage("rank.gather"):
        rows_t = torch.from_numpy(cands.rows).to(rec.device)
        vecs = rec.item_vecs[rows_t].clone()  # [B, M, D]
        if got.ann_vecs is not None:  # the ANN candidates' vectors are the ones the index returned
            ii, jj = np.nonzero(cands.ann_at >= 0)
            if len(ii):  # one host-to-device copy for all of them
                vecs[torch.from_numpy(ii).to(rec.device), torch.from_numpy(jj).to(rec.device)] = \
                    torch.from_numpy(got.ann_vecs[ii, cands.ann_at[ii, jj]]).to(vecs)
    with stage("rank.decode"):
        logits = (scorer or rec.score_candidates)(cache, rows_t, vecs, request_surface, request_ts)  # [B, M, C]
    with stage("rank.fuse"):
        p = torch.sigmoid(logits.float())
        util = (p * u).sum(-1)  # [B, M]
        dot = torch.zeros_like(util)  # [B, M] user . candidate vector, where wanted
        if (retrieval_weight > 0 or keep_parts) and user is not None:
            dot = (user.float()[:, None, :] * vecs.float()).sum(-1)
        sid_lp_m = _sid_lp_matrix(cands, got.sid_reach) if sid_weight > 0 or keep_parts else None
        sid_lp = None if sid_lp_m is None else torch.from_numpy(sid_lp_m).to(util)
        live = np.where(cands.valid, cands.rows, -1)  # [B, M], -1 pad
        trans_m = None
        if trans is not None and (transition_weight > 0 or keep_parts):
            trans_m = trans[0].log_prob(trans[1], live)  # [B, M]
        hist_m = in_history(live, history_rows) if history_rows is not None and (
            history_weight != 0 or keep_parts) else None
        score = l1_score(util, dot, sid_lp, None if trans_m is None else torch.from_numpy(trans_m).to(util),
                         None if hist_m is None else torch.from_numpy(hist_m).to(util),
                         action_weight=action_weight, retrieval_weight=retrieval_weight, sid_weight=sid_weight,
                         transition_weight=transition_weight, history_weight=history_weight).cpu().numpy()  # [B, M]
        l1_parts = None
        if keep_parts and sid_lp_m is not None:
            l1_parts = {"rows": live, "utility": util.cpu().numpy(),
                        "dot": dot.cpu().numpy(), "sid_lp": sid_lp_m, "src": cands.src,
                        "trans": np.zeros_like(sid_lp_m) if trans_m is None else trans_m,
                        "hist": np.zeros_like(sid_lp_m) if hist_m is None else hist_m}
        return score, p.cpu().numpy(), l1_parts


def _request_keys(per_request: Sequence[np.ndarray], stride: int) -> np.ndarray:
    """int64 keys ``request * stride + row`` of every row in ``0 .. stride - 1`` of each request's list: one
    ``np.isin`` against ``b * stride + rows`` then asks "is this row in its request's list" for a whole batch."""
    lens = [len(x) for x in per_request]
    flat = np.concatenate([np.asarray(x, np.int64).reshape(-1) for x in per_request]) if sum(lens) else \
        np.zeros(0, np.int64)
    req = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    ok = (flat >= 0) & (flat < stride)
    return req[ok] * stride + flat[ok]


def in_history(rows: np.ndarray, history_rows: Sequence[np.ndarray]) -> np.ndarray:
    """float32 [B, M]: 1 where ``rows[b, j]`` (>= 0) is among ``history_rows[b]``, else 0 (the history term)."""
    rows = np.asarray(rows, dtype=np.int64)
    stride = 1 + int(rows.max(initial=0))  # a history row past every candidate row matches none
    keys = np.arange(rows.shape[0], dtype=np.int64)[:, None] * stride + rows
    return ((rows >= 0) & np.isin(keys, _request_keys(history_rows, stride))).astype(np.float32)


def rank_given(rec: Recommender, cache: KVCache, user: torch.Tensor | None, rows: torch.Tensor, u: torch.Tensor, *,
               action_weight: float, retrieval_weight: float, sid_weight: float, beam_width: int,
               diversity_lambda: float, request_surface: torch.Tensor | None,
               request_ts: torch.Tensor | None, transition_weight: float = 0.0,
               trans: Transitions | None = None, history_weight: float = 0.0,
               history_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """L1 for GIVEN candidate rows ``[1, m]`` of one encoded history: (fused score [m], action probabilities
    [m, C]), the score :func:`rank` gives the same row in the funnel. The SID term (``sid_weight`` > 0, a
    model with SIDs) runs the beam search at ``beam_width`` / ``diversity_lambda``: a candidate the beams
    reach takes its beam log-probability, any other the lowest one among the beams' items (:func:`rank`'s
    floor, which there is taken over the first ``k * overretrieve`` beam items the funnel kept, not
    excluded: the same when those are all the beams reach). A coarse-prefix SID stage (``rec.served_sid_mode``
    merged, prefix or dense) gives each candidate its score there if the stage reaches it, else the lowest
    score it gave: exactly the funnel's SID term in those modes."""
    vecs = rec.item_vecs[rows]  # [1, m, D] (what the ANN index stores: its kinds all keep the exact vectors)
    logits = rec.score_candidates(cache, rows, vecs, request_surface, request_ts)  # [1, m, C]
    p = torch.sigmoid(logits.float())
    util = (p * u).sum(-1)  # [1, m]
    dot = torch.zeros_like(util)
    if retrieval_weight > 0 and user is not None:
        dot = (user.float()[:, None, :] * vecs.float()).sum(-1)
    sid_lp = None
    if sid_weight > 0 and rec.trie is not None:
        if rec.served_sid_mode != "full":
            _, beam_row, beam_lp = rec.retrieve_sids(cache, beam_width, diversity_lambda,
                                                     sid_reach_limit(rec, beam_width), user)
        else:
            beam_row, beam_lp = rec.beam_rows(rec.decode_sids(cache, beam_width, diversity_lambda), beam_width)
        lps, floor = _scores_of(rows.cpu().numpy(), beam_row, beam_lp)  # float32, as rank's
        sid_lp = torch.from_numpy(np.where(np.isnan(lps), floor[:, None], lps)).to(util)
    tr = None
    if trans is not None and transition_weight > 0:
        tr = torch.from_numpy(trans[0].log_prob(trans[1], rows.cpu().numpy())).to(util)
    hist = None
    if history_rows is not None and history_weight != 0:
        hist = torch.from_numpy(in_history(rows.cpu().numpy(), [history_rows])).to(util)
    score = l1_score(util, dot, sid_lp, tr, hist, action_weight=action_weight, retrieval_weight=retrieval_weight,
                     sid_weight=sid_weight, transition_weight=transition_weight, history_weight=history_weight)
    return score[0].cpu().numpy(), p[0].cpu().numpy()


def merged_order(cands: Candidates, srcs: Sequence[str]) -> np.ndarray:
    """Scores without ranking [B, M]: a single source keeps its own (beam log-probability, or inner
    product); both sources: 1 / (1 + position in the round-robin merge). 0 pad."""
    if tuple(srcs) == ("sid",):
        score = cands.sid_lp.astype(np.float64)
    elif tuple(srcs) == ("ann",):
        score = cands.ann_score.astype(np.float64)
    else:
        score = 1.0 / (1.0 + cands.merged)
    return np.where(cands.valid, score, 0.0)


def top_k(cands: Candidates, score: np.ndarray, probs: np.ndarray | None, k: int,
          beams: BeamResult | None) -> BatchResult:
    """The ``k`` best valid candidates of each request by ``score`` (stable: ties keep the union's order)."""
    b, m = cands.rows.shape
    kk = min(k, m)
    out = BatchResult(rows=np.full((b, kk), -1, np.int64), scores=np.full((b, kk), np.nan),
                      src=np.zeros((b, kk), np.int8), sid_lp=np.full((b, kk), np.nan),
                      ann_score=np.full((b, kk), np.nan),
                      probs=None if probs is None else np.full((b, kk, probs.shape[-1]), np.nan), beams=beams)
    order = np.argsort(-np.where(cands.valid, score, -np.inf), axis=1, kind="stable")[:, :kk]  # [B, kk]
    i, c, pos = compact(np.take_along_axis(cands.valid, order, 1), kk)  # the valid ones, best first
    j = order[i, c]
    out.rows[i, pos], out.scores[i, pos], out.src[i, pos] = cands.rows[i, j], score[i, j], cands.src[i, j]
    out.sid_lp[i, pos], out.ann_score[i, pos] = cands.sid_lp[i, j], cands.ann_score[i, j]
    if probs is not None and out.probs is not None:
        out.probs[i, pos] = probs[i, j]
    return out


@torch.no_grad()
def run_funnel(rec: Recommender, mb: ModelBatch, *, k: int = 10, beam_width: int = 20,
               diversity_lambda: float = 0.0, sources: Sequence[str] | None = None, rank_stage: bool | None = None,
               overretrieve: int = 3, utility: Mapping[str, float] | None = None,
               exclude_rows: Sequence[np.ndarray] | None = None, request_surface: torch.Tensor | None = None,
               request_ts: torch.Tensor | None = None, retrieval_weight: float | None = None,
               sid_weight: float | None = None, action_weight: float | None = None,
               keep_parts: bool = False, n_real: int | None = None, scorer: Scorer | None = None,
               transition_weight: float | None = None, last_rows: np.ndarray | None = None,
               transitions: TransitionTable | None = None, history_rows: Sequence[np.ndarray] | None = None,
               history_weight: float | None = None) -> BatchResult:
    """The L0 -> L1 funnel for a batch of encoded-ready histories (arguments: see
    :meth:`genrec.infer.recommender.Recommender.run_batch`; ``rank_stage`` is its ``rank``)."""
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    if overretrieve < 1:
        raise ConfigError(f"overretrieve must be >= 1, got {overretrieve}")
    fw = rec.fusion.resolve(action_weight, retrieval_weight, sid_weight, transition_weight, history_weight)
    srcs, do_rank = rec.check_sources(sources, rank_stage)
    if do_rank and fw.history_weight != 0 and history_rows is None:
        raise ConfigError("history_weight != 0: the histories' rows were not given")
    trans = transition_input(rec, transitions, last_rows, fw.transition_weight if do_rank else 0.0)
    u = rec.utility_vector(utility)
    t: dict[str, float] = {}
    # the transition source runs where its term ranks (or parts are kept: choosing t, its rows are marked)
    t_src = trans if do_rank and (fw.transition_weight > 0 or keep_parts) else None
    b = mb.actions.shape[0]
    on_dev = serves(rec, srcs, keep_parts=keep_parts, rows=b)  # the lists stay on the device: one copy back
    if on_dev:  # what the device funnel reads beside the encoding, copied before it
        d_in = device_inputs(rec, exclude_rows=exclude_rows, history_rows=history_rows if do_rank and
                             fw.history_weight != 0 else None, trans=t_src)
    with stage("encode", t):  # the device path reads the encoder's plan verdicts with its answers
        cache, user = rec.encode(mb, speculate=on_dev)
    n = k * overretrieve
    # each stage over-retrieves by the most rows a request excludes: k * r remain after excluding
    extra = 0 if exclude_rows is None else max((len(x) for x in exclude_rows), default=0)
    reach = do_rank and (fw.sid_weight > 0 or keep_parts)  # the coarse-prefix SID stage's reach: L1's SID term
    if on_dev:
        width = sid_width(beam_width, extra, srcs)
        on_device = functools.partial(
            run_on_device, rec, cache, user, srcs, b=b, n=n, extra=extra, k=k, beam_width=beam_width,
            diversity_lambda=diversity_lambda, t=t, reach=sid_reach_limit(rec, width) if reach and "sid" in srcs
            else None, do_rank=do_rank, fw=fw, u=u, inputs=d_in, request_surface=request_surface,
            request_ts=request_ts, scorer=scorer)
        try:
            out = on_device()
        except PlanMiss:  # the plans taken as holding did not: decided now (one sync), and from now on
            rec.speculate_plans = False
            cache.plans.clear()  # every memo made under the assumption
            out = on_device()
        t["total"] = sum(t.values())
        out.timings_ms = t
        return out
    got = retrieve(rec, cache, user, srcs, b, n, extra, beam_width, diversity_lambda, t, n_real, reach=reach,
                   trans=t_src)
    with stage("union", t):
        cands = union(got, b, n, exclude_rows)
    probs = l1_parts = None
    if do_rank:
        with stage("rank", t):
            score, probs, l1_parts = rank(rec, cache, user, cands, got, u, action_weight=fw.action_weight,
                                          retrieval_weight=fw.retrieval_weight, sid_weight=fw.sid_weight,
                                          request_surface=request_surface, request_ts=request_ts,
                                          keep_parts=keep_parts, scorer=scorer,
                                          transition_weight=fw.transition_weight, trans=trans,
                                          history_weight=fw.history_weight, history_rows=history_rows)
    else:
        score = merged_order(cands, srcs)
    with stage("topk", t):
        out = top_k(cands, score, probs, k, got.beams)
    t["total"] = sum(t.values())
    out.timings_ms = t
    out.l1_parts = l1_parts
    return out


def transition_input(rec: Recommender, table: TransitionTable | None, last_rows: np.ndarray | None,
                     weight: float) -> Transitions | None:
    """(table, last rows) for the L1 transition term: ``table`` (else the run's, ``rec.transitions``) with the
    histories' last catalogue rows; None where either is missing -- an error when ``weight`` > 0 needs it (a
    validated transition term is never silently left out)."""
    table = table if table is not None else rec.transitions
    if table is not None and last_rows is not None:
        return table, np.asarray(last_rows, dtype=np.int64)
    if weight > 0:
        raise ConfigError("transition_weight > 0: " + ("this run has no transition table (`genrec fusion tune` "
                                                       "writes it)" if table is None else
                                                       "the histories' last items were not given"))
    return None
