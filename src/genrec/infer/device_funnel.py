"""The funnel after the encode with its lists left on the model's device (issue 39): the SID stage's and the ANN
search's rows, their union, the ranking, the fused score and the top k as tensor operations of static shapes, and
ONE device->host copy per batch, of the answers. The host path of :mod:`genrec.infer.funnel` copies the beams'
rows and the ANN's lists to the host, builds the union in NumPy and copies the candidates back, the GPU idle
meanwhile; here the host only queues work and waits once.

Same answers as the host path, which stays the rule each function here is the twin of (``union`` ->
:func:`union_t`, ``_sid_lp_matrix`` -> :func:`sid_lp_t`, ``top_k`` -> :func:`top_k_t`; tests/infer/
test_device_funnel.py compares them on random lists and whole batches). The candidates' width is static, the most
the lists can give (``min(S, n) + min(A, n)``) rather than the batch's largest union: padding columns are invalid,
and a candidate's ranking score does not depend on the others. It serves the request the service gets
(:func:`serves`: no excluded history, no transition or history term, no score parts, a device-side ANN search or
none); the host path serves the rest. ``$GENREC_DEVICE_FUNNEL`` (auto: on a CUDA device; on; off) chooses.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from genrec.errors import ConfigError
from genrec.infer.profile import stage
from genrec.infer.results import BatchResult
from genrec.model.kv_cache import KVCache

if TYPE_CHECKING:  # the funnel runs over a Recommender's stages; recommender.py imports the funnel
    from genrec.infer.fusion import FusionWeights
    from genrec.infer.recommender import Recommender

__all__ = ["DEVICE_FUNNEL", "TCandidates", "first_seen_t", "l1_score", "run_on_device", "serves", "sid_lp_t",
           "top_k_t", "union_t"]

DEVICE_FUNNEL = ("auto", "on", "off")


def l1_score(util: torch.Tensor, dot: torch.Tensor, sid_lp: torch.Tensor | None, trans: torch.Tensor | None = None,
             hist: torch.Tensor | None = None, *, action_weight: float, retrieval_weight: float, sid_weight: float,
             transition_weight: float = 0.0, history_weight: float = 0.0) -> torch.Tensor:
    """The fused L1 score, written once for every ranking path: ``a * utility + w * dot + v * sid_lp + t * trans +
    h * hist`` (a term whose weight is 0 is left out; ``sid_lp`` / ``trans`` / ``hist`` None: no such term)."""
    fused = action_weight * util
    if retrieval_weight > 0:
        fused = fused + retrieval_weight * dot
    if sid_lp is not None and sid_weight > 0:
        fused = fused + sid_weight * sid_lp
    if trans is not None and transition_weight > 0:
        fused = fused + transition_weight * trans
    if hist is not None and history_weight != 0:
        fused = fused + history_weight * hist
    return fused


def wanted(rec: Recommender) -> bool:
    """Whether ``rec`` runs the funnel on its device where it can: ``rec.device_funnel`` (else
    ``$GENREC_DEVICE_FUNNEL``, else "auto": on a CUDA device)."""
    raw = rec.device_funnel or os.environ.get("GENREC_DEVICE_FUNNEL") or "auto"
    m = str(raw).strip().lower()
    if m not in DEVICE_FUNNEL:
        raise ConfigError(f"the device funnel must be one of {', '.join(DEVICE_FUNNEL)} (GENREC_DEVICE_FUNNEL), "
                          f"got {raw!r}")
    return m == "on" or (m == "auto" and rec.device.type == "cuda")


def serves(rec: Recommender, srcs: Sequence[str], *, exclude_rows: Any, transitions: Any, keep_parts: bool,
           history_weight: float, do_rank: bool) -> bool:
    """Whether this call runs on the device (:func:`wanted`, and a request this path serves: nothing excluded,
    no transition source, no score parts, no history term, the ANN searched on the device or not at all)."""
    if not wanted(rec) or exclude_rows is not None or transitions is not None or keep_parts:
        return False
    if do_rank and history_weight != 0:
        return False
    return "ann" not in srcs or hasattr(rec.ann, "search_t")


def first_seen_t(a: torch.Tensor) -> torch.Tensor:
    """bool [B, W]: ``a[i, j] >= 0`` and no earlier ``a[i, j'] == a[i, j]`` (j' < j): the twin of
    :func:`genrec.decode.rows.first_seen`, by all pairs of a row (W is a list's length: tens)."""
    w = a.shape[1]
    earlier = torch.ones(w, w, dtype=torch.bool, device=a.device).tril(-1)  # [j, j']: j' < j
    return (a >= 0) & ~((a[:, :, None] == a[:, None, :]) & earlier).any(2)


def _first_n(keep: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the first ``n`` True of each row of ``keep``, each entry's place among the kept)."""
    pos = keep.long().cumsum(1) - 1
    return keep & (pos < n), pos


def _match(x: torch.Tensor, table: torch.Tensor, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each ``x[b, i]``: whether some ``table[b, j]`` with ``ok[b, j]`` equals it, and the first such j
    (0 where none). ``table`` [B, T] may be empty."""
    if table.shape[1] == 0:
        z = torch.zeros(x.shape, dtype=torch.int64, device=x.device)
        return z.bool(), z
    eq = (x[:, :, None] == table[:, None, :]) & ok[:, None, :]  # [B, X, T]
    return eq.any(2), eq.to(torch.uint8).argmax(2)


@dataclass
class TCandidates:
    """:class:`genrec.infer.funnel.Candidates` as tensors on the device, [B, M] with M static (the most the lists
    give): ``rows`` int64 (0 pad), ``valid``, ``src`` int8 (1 sid, 2 ann), ``sid_lp`` / ``ann_score`` float32
    (nan: not found by that stage), ``ann_at`` int64 (-1: none), ``merged`` int64."""

    rows: torch.Tensor
    valid: torch.Tensor
    src: torch.Tensor
    sid_lp: torch.Tensor
    ann_score: torch.Tensor
    ann_at: torch.Tensor
    merged: torch.Tensor


def union_t(sid_rows: torch.Tensor, sid_lp: torch.Tensor, ann_rows: torch.Tensor, ann_score: torch.Tensor,
            n: int) -> TCandidates:
    """The union of :func:`genrec.infer.funnel.union` (no exclusion, no transition source) on the device: the
    first ``n`` distinct rows of each list (rows < 0 skipped), the SID ones in beam order, then the ANN ones the
    SID list lacks in ANN order; a row both found carries both scores. Entries not placed are scattered to a
    column past the end, then cut."""
    b, s = sid_rows.shape
    a = ann_rows.shape[1]
    dev = sid_rows.device
    m = max(1, min(s, n) + min(a, n))
    ks, ps = _first_n(first_seen_t(sid_rows), n)
    ka, pa = _first_n(first_seen_t(ann_rows), n)
    n_s = ks.sum(1)
    found, at_s = _match(ann_rows, sid_rows, ks)
    hit = ka & found  # a kept ANN row among the kept SID rows
    new = ka & ~found
    new_col = n_s[:, None] + new.long().cumsum(1) - 1
    col_s = torch.where(ks, ps, m)  # column m: the entries not placed
    col_new = torch.where(new, new_col, m)
    col_a = torch.where(hit, ps.gather(1, at_s) if s else col_new, col_new)
    rows = torch.zeros(b, m + 1, dtype=torch.int64, device=dev)
    rows.scatter_(1, col_s, sid_rows.long()).scatter_(1, col_new, ann_rows.long())
    src = torch.zeros(b, m + 1, dtype=torch.int8, device=dev)
    src.scatter_(1, col_s, torch.ones_like(sid_rows, dtype=torch.int8))
    src.scatter_(1, col_a, torch.where(hit, 3, 2).to(torch.int8))
    nan = float("nan")
    lp = torch.full((b, m + 1), nan, dtype=torch.float32, device=dev).scatter_(1, col_s, sid_lp.float())
    sc = torch.full((b, m + 1), nan, dtype=torch.float32, device=dev).scatter_(1, col_a, ann_score.float())
    ann_at = torch.full((b, m + 1), -1, dtype=torch.int64, device=dev)
    ann_at.scatter_(1, col_a, torch.arange(a, device=dev).expand(b, a))
    # the round-robin merge (SID 0, ANN 0, SID 1, ...): a row's place is the rank of its first appearance
    first = torch.full((b, m + 1), 4 * m + 4, dtype=torch.int64, device=dev).scatter_(1, col_s, 2 * ps)
    first.scatter_reduce_(1, col_a, 2 * pa + 1, reduce="amin")
    counts = n_s + new.sum(1)
    valid = torch.arange(m, device=dev)[None, :] < counts[:, None]
    order = torch.argsort(first[:, :m], dim=1, stable=True)
    merged = torch.where(valid, torch.argsort(order, dim=1, stable=True), 0)
    return TCandidates(rows[:, :m], valid, src[:, :m], lp[:, :m], sc[:, :m], ann_at[:, :m], merged)


def _row_floor_t(scores: torch.Tensor, has: torch.Tensor) -> torch.Tensor:
    """float32 [B]: the lowest of ``scores[b]`` where ``has[b]`` (0 where none): the twin of funnel's."""
    low = torch.where(has, scores, float("inf")).amin(1) if scores.shape[1] else scores.new_zeros(scores.shape[0])
    return torch.where(has.any(1), low, 0.0).float()


def sid_lp_t(c: TCandidates, reach: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """float32 [B, M]: each candidate's log P(SID) (the twin of funnel's ``_sid_lp_matrix``): found by the SID
    stage, its score; else the request's lowest (0 if none); 0 pad. With a coarse-prefix stage's ``reach`` (rows
    [B, R] -1 pad, scores [B, R]): a candidate it scored takes that score, any other the lowest of the reach."""
    if reach is None:
        lp = c.sid_lp
        floor = _row_floor_t(lp, ~torch.isnan(lp))
    else:
        r_rows, r_lp = reach
        ok = r_rows >= 0
        found, at = _match(c.rows, r_rows, ok)
        lp = torch.where(found, r_lp.float().gather(1, at), float("nan")) if r_rows.shape[1] else \
            torch.full_like(c.sid_lp, float("nan"))
        floor = _row_floor_t(r_lp.float(), ok)
    has = ~torch.isnan(lp)
    return torch.where(c.valid, torch.where(has, lp, floor[:, None]), 0.0).float()


def top_k_t(c: TCandidates, score: torch.Tensor, probs: torch.Tensor | None, k: int) -> torch.Tensor:
    """The ``k`` best valid candidates of each request by ``score`` (stable: ties keep the union's order), packed
    as float64 [B, kk, 5 + C] -- row (-1 pad), score, src, sid_lp, ann_score, then the C action probabilities
    (nan pad) -- for one device->host copy (:func:`unpack`). The twin of :func:`genrec.infer.funnel.top_k`."""
    b, m = c.rows.shape
    kk = min(k, m)
    order = torch.argsort(-torch.where(c.valid, score, float("-inf")), dim=1, stable=True)[:, :kk]
    ok = c.valid.gather(1, order)
    col = torch.where(ok, ok.long().cumsum(1) - 1, kk)  # the valid ones, best first; the rest past the end
    parts = [c.rows, score, c.src, c.sid_lp, c.ann_score]
    cols = torch.stack([x.double() for x in parts], -1)  # [B, M, 5]
    if probs is not None:
        cols = torch.cat([cols, probs.double()], -1)
    out = torch.full((b, kk + 1, cols.shape[-1]), float("nan"), dtype=torch.float64, device=cols.device)
    out[..., 0], out[..., 2] = -1.0, 0.0  # row, src (filled on the device: a host tensor's copy would wait)
    got = cols.gather(1, order[..., None].expand(-1, -1, cols.shape[-1]))
    out.scatter_(1, col[..., None].expand(-1, -1, cols.shape[-1]), got)
    return out[:, :kk]


def unpack(packed: np.ndarray, n_actions: int | None, beams: Any) -> BatchResult:
    """:func:`top_k_t`'s array, on the host, as a :class:`BatchResult`."""
    return BatchResult(rows=packed[..., 0].astype(np.int64), scores=packed[..., 1].copy(),
                       src=packed[..., 2].astype(np.int8), sid_lp=packed[..., 3].copy(),
                       ann_score=packed[..., 4].copy(),
                       probs=None if n_actions is None else np.ascontiguousarray(packed[..., 5:5 + n_actions]),
                       beams=beams)


def merged_order_t(c: TCandidates, srcs: Sequence[str]) -> torch.Tensor:
    """Scores without ranking [B, M] (the twin of funnel's ``merged_order``): one source keeps its own score,
    both rank by the round-robin merge, 1 / (1 + place). 0 pad."""
    if tuple(srcs) == ("sid",):
        score = c.sid_lp.double()
    elif tuple(srcs) == ("ann",):
        score = c.ann_score.double()
    else:
        score = 1.0 / (1.0 + c.merged.double())
    return torch.where(c.valid, score, 0.0)


def run_on_device(rec: Recommender, cache: KVCache, user: torch.Tensor | None, srcs: Sequence[str], *, b: int,
                  n: int, k: int, beam_width: int, diversity_lambda: float, t: dict[str, float], reach: int | None,
                  do_rank: bool, fw: FusionWeights, u: torch.Tensor, request_surface: torch.Tensor | None,
                  request_ts: torch.Tensor | None, scorer: Callable[..., torch.Tensor] | None) -> BatchResult:
    """L0 -> union -> L1 -> top k for one encoded batch, on the device, one copy back (see the module's
    docstring; :func:`genrec.infer.funnel.run_funnel` calls it where :func:`serves`). ``reach``: the most rows a
    coarse-prefix SID stage reaches (``funnel.sid_reach_limit``), whose whole reach is then L1's SID term; None:
    no reach kept."""
    dev = rec.device
    beams, reach_t = None, None
    sid_rows = torch.full((b, 0), -1, dtype=torch.int64, device=dev)
    sid_lp = torch.zeros((b, 0), dtype=torch.float32, device=dev)
    if "sid" in srcs:
        with stage("sid", t):
            whole = reach is not None and rec.served_sid_mode != "full"
            lim = max(n, reach) if whole and reach is not None else n
            beams, sid_rows, sid_lp = rec.retrieve_sids_t(cache, beam_width, diversity_lambda, lim, user)
            if whole:
                reach_t = (sid_rows, sid_lp)
                sid_rows, sid_lp = sid_rows[:, :n], sid_lp[:, :n]
    ann_rows = torch.full((b, 0), -1, dtype=torch.int64, device=dev)
    ann_score = torch.zeros((b, 0), dtype=torch.float32, device=dev)
    ann_vecs = None
    if "ann" in srcs:
        with stage("ann", t):
            if rec.ann is None or user is None:
                raise ConfigError("the ANN stage needs an index and a user vector")
            ann_score, at, ann_vecs = rec.ann.search_t(user.float(), min(n, len(rec.ann)))  # type: ignore[union-attr]
            table = rec.ann.position_rows(rec.catalog)  # type: ignore[union-attr]
            ann_rows = torch.where(at >= 0, table[at.clamp(min=0)], -1)
    with stage("union", t):
        c = union_t(sid_rows, sid_lp, ann_rows, ann_score, n)
    probs = None
    if do_rank:
        with stage("rank", t):
            vecs = rec.item_vecs[c.rows]  # [B, M, D]
            if ann_vecs is not None and ann_vecs.shape[1]:  # the ANN candidates' vectors: the ones the index holds
                d = vecs.shape[-1]
                got = ann_vecs.gather(1, c.ann_at.clamp(min=0)[..., None].expand(-1, -1, d)).to(vecs.dtype)
                vecs = torch.where((c.ann_at >= 0)[..., None], got, vecs)
            score_fn = scorer or (lambda *x: rec.score_candidates(*x, trusted=True))
            logits = score_fn(cache, c.rows, vecs, request_surface, request_ts)  # [B, M, C]
            probs = torch.sigmoid(logits.float())
            util = (probs * u).sum(-1)
            dot = torch.zeros_like(util)
            if fw.retrieval_weight > 0 and user is not None:
                dot = (user.float()[:, None, :] * vecs.float()).sum(-1)
            lp_m = sid_lp_t(c, reach_t) if fw.sid_weight > 0 else None
            score = l1_score(util, dot, lp_m, action_weight=fw.action_weight, retrieval_weight=fw.retrieval_weight,
                             sid_weight=fw.sid_weight)
    else:
        score = merged_order_t(c, srcs)
    with stage("topk", t):
        packed = top_k_t(c, score, probs, k).cpu().numpy()  # the batch's one device->host copy
    return unpack(packed, None if probs is None else probs.shape[-1], beams)
