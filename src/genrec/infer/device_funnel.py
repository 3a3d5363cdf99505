"""The funnel after the encode with its lists left on the model's device (issue 39): the SID stage's and the ANN
search's rows, their union, the ranking, the fused score and the top k as tensor operations of static shapes, and
ONE device->host copy per batch, of the answers. The host path of :mod:`genrec.infer.funnel` copies the beams'
rows and the ANN's lists to the host, builds the union in NumPy and copies the candidates back, the GPU idle
meanwhile; here the host only queues work and waits once.

Same answers as the host path, which stays the rule each function here is the twin of (``union`` ->
:func:`union_t`, ``_sid_lp_matrix`` -> :func:`sid_lp_t`, ``top_k`` -> :func:`top_k_t`; tests/infer/
test_device_funnel.py compares them on random lists and whole batches). The candidates' width is static, the most
the lists can give (``min(S, n) + min(A, n)``) rather than the batch's largest union: padding columns are invalid,
and a candidate's ranking score does not depend on the others. It serves every online request (:func:`serves`:
excluded history, the transition source and term, the history term; a device-side ANN search or none); the host path
serves the score parts of the offline fusion tuning and a faiss search. ``$GENREC_DEVICE_FUNNEL`` chooses: auto (the
default: a CUDA device and batches of :data:`AUTO_MIN_ROWS` rows or more), on or off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from genrec.decode.beam import check_nan_flags, deferred_nan_checks
from genrec.errors import ConfigError
from genrec.infer.ann import DeviceFlatSearch
from genrec.infer.profile import stage
from genrec.infer.results import BatchResult
from genrec.model.kv_cache import KVCache

if TYPE_CHECKING:  # the funnel runs over a Recommender's stages; recommender.py imports the funnel
    from genrec.infer.fusion import FusionWeights
    from genrec.infer.recommender import Recommender
    from genrec.infer.transitions import TransitionTable

__all__ = ["AUTO_MIN_ROWS", "DEVICE_FUNNEL", "DeviceTransitions", "PlanMiss", "TCandidates", "append_transitions",
           "first_seen_t", "l1_score", "device_inputs", "padded_rows", "run_on_device", "serves", "sid_lp_t",
           "sid_width", "top_k_t", "union_t", "wanted"]

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


AUTO_MIN_ROWS = 8
""""auto" runs batches of at least this many rows on the device. On two H100s (docs/log/2026-12-07-device-funnel-
h100.md) batches of 32 (64 clients) gave 1.01-1.07x the QPS there with a lower p99, a batch of one (one client) was
0.3-1.0 ms slower; sizes between were not measured."""


def wanted(rec: Recommender, rows: int | None = None) -> bool:
    """Whether ``rec`` runs the funnel on its device for a batch of ``rows`` rows where it can: ``rec.device_funnel``
    (else ``$GENREC_DEVICE_FUNNEL``, else "auto": a CUDA device and at least :data:`AUTO_MIN_ROWS` rows; None:
    any batch)."""
    raw = rec.device_funnel or os.environ.get("GENREC_DEVICE_FUNNEL") or "auto"
    m = str(raw).strip().lower()
    if m not in DEVICE_FUNNEL:
        raise ConfigError(f"the device funnel must be one of {', '.join(DEVICE_FUNNEL)} (GENREC_DEVICE_FUNNEL), "
                          f"got {raw!r}")
    return m == "on" or (m == "auto" and rec.device.type == "cuda" and (rows is None or rows >= AUTO_MIN_ROWS))


def serves(rec: Recommender, srcs: Sequence[str], *, keep_parts: bool, rows: int | None = None) -> bool:
    """Whether this call (a batch of ``rows`` rows) runs on the device (:func:`wanted`, and a request this path
    serves: every online one -- excluded history, the transition source and term, the history term included -- but
    the score parts of the offline fusion tuning, with the ANN searched on the device or not at all)."""
    return wanted(rec, rows) and not keep_parts and ("ann" not in srcs or isinstance(rec.ann, DeviceFlatSearch))


def padded_rows(per_request: Sequence[np.ndarray], device: torch.device) -> torch.Tensor:
    """int64 [B, H] on ``device``: each request's rows, -1 pad (H >= 1). Copied before the encode: a copy from
    pageable host memory waits for the device's queue, so none is made once the batch's work is queued."""
    h = max(1, max((len(x) for x in per_request), default=0))
    out = np.full((len(per_request), h), -1, np.int64)
    for i, x in enumerate(per_request):
        out[i, :len(x)] = x
    return torch.from_numpy(out).to(device)


@dataclass
class DeviceTransitions:
    """A :class:`genrec.infer.transitions.TransitionTable` on the device (the twin of its ``log_prob`` and
    ``successors``): sorted pair keys, counts, out-degrees, and each source's destinations by count."""

    keys: torch.Tensor
    counts: torch.Tensor
    out_degree: torch.Tensor
    ptr: torch.Tensor
    dst: torch.Tensor
    n_items: int

    @classmethod
    def of(cls, table: TransitionTable, device: torch.device) -> DeviceTransitions:
        ptr, dst = table._by_count
        keys, counts, deg, ptr_t, dst_t = (torch.as_tensor(np.asarray(x, np.int64), device=device)
                                           for x in (table.keys, table.counts, table.out_degree, ptr, dst))
        return cls(keys, counts, deg, ptr_t, dst_t, table.n_items)

    def log_prob(self, last: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """float32 [B, M]: ``log P(rows[b, j] | last[b])`` (add-one smoothed); 0 where either is missing."""
        n = self.n_items
        ok = (rows >= 0) & (rows < n) & ((last >= 0) & (last < n))[:, None]
        src = last.clamp(0, max(n - 1, 0))
        key = src[:, None] * n + rows.clamp(0, max(n - 1, 0))
        if len(self.keys):
            i = torch.searchsorted(self.keys, key).clamp(max=len(self.keys) - 1)
            c = torch.where(self.keys[i] == key, self.counts[i], 0)
        else:
            c = torch.zeros_like(key)
        lp = torch.log((c.double() + 1.0) / (self.out_degree[src][:, None].double() + n))
        return torch.where(ok, lp, 0.0).float()

    def successors(self, last: torch.Tensor, n: int) -> torch.Tensor:
        """int64 [B, n]: each ``last[b]``'s (up to) ``n`` most frequent successors, most first, -1 past them."""
        if n <= 0 or not len(self.keys):
            return torch.full((len(last), max(n, 0)), -1, dtype=torch.int64, device=last.device)
        ok = (last >= 0) & (last < self.n_items)
        at = last.clamp(0, self.n_items - 1)
        start = torch.where(ok, self.ptr[at], 0)
        count = torch.where(ok, self.ptr[at + 1] - start, 0)
        j = torch.arange(n, device=last.device)[None, :]
        return torch.where(j < count[:, None], self.dst[(start[:, None] + j).clamp(max=len(self.dst) - 1)], -1)


def first_seen_t(a: torch.Tensor) -> torch.Tensor:
    """bool [B, W]: ``a[i, j] >= 0`` and no earlier ``a[i, j'] == a[i, j]`` (j' < j): the twin of
    :func:`genrec.decode.rows.first_seen`, by all pairs of a row (W is a list's length: tens; with excluded history
    tens plus the longest history's length, W² booleans a request)."""
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


def _kept(rows: torch.Tensor, n: int, exclude: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` distinct rows (>= 0) of each list not in its request's ``exclude`` [B, E] (-1 pad), and
    each entry's place among the kept (the host union's ``kept``)."""
    keep = first_seen_t(rows)
    if exclude is not None:
        keep = keep & ~_match(rows, exclude, exclude >= 0)[0]
    return _first_n(keep, n)


def union_t(sid_rows: torch.Tensor, sid_lp: torch.Tensor, ann_rows: torch.Tensor, ann_score: torch.Tensor,
            n: int, exclude: torch.Tensor | None = None, trans_rows: torch.Tensor | None = None) -> TCandidates:
    """The union of :func:`genrec.infer.funnel.union` on the device: the first ``n`` distinct rows of each list
    (rows < 0 and a request's ``exclude`` rows [B, E] skipped), the SID ones in beam order, then the ANN ones the
    SID list lacks in ANN order; a row both found carries both scores; then the transition source's ``trans_rows``
    (:func:`append_transitions`). Entries not placed are scattered to a column past the end, then cut."""
    b, s = sid_rows.shape
    a = ann_rows.shape[1]
    dev = sid_rows.device
    m = max(1, min(s, n) + min(a, n))
    ks, ps = _kept(sid_rows, n, exclude)
    ka, pa = _kept(ann_rows, n, exclude)
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
    c = TCandidates(rows[:, :m], valid, src[:, :m], lp[:, :m], sc[:, :m], ann_at[:, :m], merged)
    return c if trans_rows is None or not trans_rows.shape[1] else append_transitions(c, trans_rows, n, exclude)


def _grown(x: torch.Tensor, w: int, fill: float | int) -> torch.Tensor:
    """``x`` [B, M] widened to [B, w] with ``fill``."""
    out = torch.full((x.shape[0], w), fill, dtype=x.dtype, device=x.device)
    out[:, :x.shape[1]] = x
    return out


def append_transitions(c: TCandidates, trans_rows: torch.Tensor, n: int, exclude: torch.Tensor | None
                       ) -> TCandidates:
    """The union with the transition source's first ``n`` kept rows (the twin of funnel's ``_append_transitions``):
    a row already there gains bit 4, a new one goes after the request's other rows, in successor order, with no
    SID or ANN score, its merged place its column."""
    b, m = c.rows.shape
    kt, _ = _kept(trans_rows, n, exclude)
    found, at = _match(trans_rows, c.rows, c.valid)
    old, new = kt & found, kt & ~found
    w = m + min(trans_rows.shape[1], n)
    mark = torch.zeros(b, w + 1, dtype=torch.bool, device=c.rows.device).scatter_(1, torch.where(old, at, w), True)
    counts = c.valid.sum(1)
    col = torch.where(new, counts[:, None] + new.long().cumsum(1) - 1, w)
    rows, src = _grown(c.rows, w + 1, 0), _grown(c.src, w + 1, 0)
    src = torch.where(mark, src | 4, src)
    merged = _grown(c.merged, w + 1, 0)
    rows.scatter_(1, col, trans_rows.long())
    src.scatter_(1, col, torch.full_like(col, 4, dtype=torch.int8))
    merged.scatter_(1, col, col)
    counts = counts + new.sum(1)
    valid = torch.arange(w, device=c.rows.device)[None, :] < counts[:, None]
    return TCandidates(rows[:, :w], valid, src[:, :w], _grown(c.sid_lp, w, float("nan")),
                       _grown(c.ann_score, w, float("nan")), _grown(c.ann_at, w, -1), merged[:, :w])


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


def device_inputs(rec: Recommender, *, exclude_rows: Sequence[np.ndarray] | None,
                  history_rows: Sequence[np.ndarray] | None, trans: tuple[TransitionTable, np.ndarray] | None
                  ) -> DeviceInputs:
    """A batch's :class:`DeviceInputs` on ``rec``'s device, made before its encode (the table copied once per
    table: ``rec.device_table`` keeps the last one)."""
    dev = rec.device
    ex = None if exclude_rows is None else padded_rows(exclude_rows, dev)
    hist = ex if history_rows is exclude_rows else None if history_rows is None else padded_rows(history_rows, dev)
    if trans is None:
        return DeviceInputs(ex, hist)
    table, last = trans
    if rec.device_table is None or rec.device_table[0] is not table:
        rec.device_table = (table, DeviceTransitions.of(table, dev))
    return DeviceInputs(ex, hist, (rec.device_table[1], torch.from_numpy(np.asarray(last, np.int64)).to(dev)))


class PlanMiss(Exception):
    """The encoder graph's plans, taken as holding (``cache.plans["assumed"]``), did not: the batch's answers were
    computed by cascade attention where it is not the same function. :func:`genrec.infer.funnel.run_funnel` redoes
    the batch with the plans decided (one sync) and stops speculating for the recommender."""


def sid_width(beam_width: int, extra: int, srcs: Sequence[str]) -> int:
    """The SID stage's beam width for a call excluding up to ``extra`` rows a request: where the beams are the
    only candidates, an excluded item empties at most one beam (one SID each), so ``beam_width + extra`` beams keep
    >= ``beam_width`` live ones -- a power of two, so graphed beam searches capture a few widths, not one per
    history length; else ``beam_width``."""
    if extra and "ann" not in srcs:
        return 1 << (beam_width + extra - 1).bit_length()
    return beam_width


@dataclass
class DeviceInputs:
    """What a batch's device funnel reads beside the encoding, copied before the encode (:func:`padded_rows`):
    each request's excluded rows and history rows [B, H] (-1 pad; None: not asked -- the history only where its term
    ranks), the transition table with each request's last row [B] (None: no transition source or term)."""

    exclude: torch.Tensor | None = None
    history: torch.Tensor | None = None
    transitions: tuple[DeviceTransitions, torch.Tensor] | None = None


def run_on_device(rec: Recommender, cache: KVCache, user: torch.Tensor | None, srcs: Sequence[str], *, b: int,
                  n: int, extra: int, k: int, beam_width: int, diversity_lambda: float, t: dict[str, float],
                  reach: int | None, do_rank: bool, fw: FusionWeights, u: torch.Tensor, inputs: DeviceInputs,
                  request_surface: torch.Tensor | None, request_ts: torch.Tensor | None,
                  scorer: Callable[..., torch.Tensor] | None) -> BatchResult:
    """L0 -> union -> L1 -> top k for one encoded batch, on the device, one copy back (see the module's
    docstring; :func:`genrec.infer.funnel.run_funnel` calls it where :func:`serves`): each list over-retrieves
    by ``extra`` (the most rows a request excludes). ``reach``: the most rows a coarse-prefix SID stage reaches
    (``funnel.sid_reach_limit``), whose whole reach is then L1's SID term; None: no reach kept. The stages'
    timings into ``t`` are the host's: work is queued, not waited for, so the device's time lands in "topk" (the
    one copy back)."""
    dev = rec.device
    beams, reach_t = None, None
    sid_rows = torch.full((b, 0), -1, dtype=torch.int64, device=dev)
    sid_lp = torch.zeros((b, 0), dtype=torch.float32, device=dev)
    nan: list[torch.Tensor] = []  # the SID searches' NaN flags, read back with the answers
    if "sid" in srcs:
        with stage("sid", t), deferred_nan_checks() as nan:
            whole = reach is not None and rec.served_sid_mode != "full"
            lim = max(n + extra, reach) if whole and reach is not None else n + extra
            beams, sid_rows, sid_lp = rec.retrieve_sids_t(cache, sid_width(beam_width, extra, srcs), diversity_lambda,
                                                          lim, user)
            if whole:
                reach_t = (sid_rows, sid_lp)
                sid_rows, sid_lp = sid_rows[:, :n + extra], sid_lp[:, :n + extra]
    ann_rows = torch.full((b, 0), -1, dtype=torch.int64, device=dev)
    ann_score = torch.zeros((b, 0), dtype=torch.float32, device=dev)
    ann_vecs = None
    if "ann" in srcs:
        with stage("ann", t):
            if rec.ann is None or user is None:
                raise ConfigError("the ANN stage needs an index and a user vector")
            ann = rec.ann
            assert isinstance(ann, DeviceFlatSearch)  # serves(): a device-side search
            ann_score, at, ann_vecs = ann.search_t(user.float(), min(n + extra, len(ann)))
            table = ann.position_rows(rec.catalog)
            ann_rows = torch.where(at >= 0, table[at.clamp(min=0)], -1)
    trans = inputs.transitions  # the transition source and term (given where the term ranks)
    with stage("union", t):
        tr = None if trans is None else trans[0].successors(trans[1], n + extra)
        c = union_t(sid_rows, sid_lp, ann_rows, ann_score, n, inputs.exclude, tr)
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
            live = torch.where(c.valid, c.rows, -1)
            lp_m = sid_lp_t(c, reach_t) if fw.sid_weight > 0 else None
            trans_m = None if trans is None else trans[0].log_prob(trans[1], live)
            hist_m = None if inputs.history is None else _match(live, inputs.history, inputs.history >= 0)[0].float()
            score = l1_score(util, dot, lp_m, trans_m, hist_m, action_weight=fw.action_weight,
                             retrieval_weight=fw.retrieval_weight, sid_weight=fw.sid_weight,
                             transition_weight=fw.transition_weight, history_weight=fw.history_weight)
    else:
        score = merged_order_t(c, srcs)
    assumed = cache.plans.get("assumed")  # the encoder graph's plan verdict, not yet read (speculation)
    checks = ([assumed.reshape(1)] if assumed is not None else []) + nan
    with stage("topk", t):
        packed = top_k_t(c, score, probs, k)
        # the batch's one device->host copy: the answers and, after them, the plan verdict and the SID searches'
        # NaN flags
        flat = torch.cat([packed.flatten(), *(f.to(packed.dtype) for f in checks)]).cpu().numpy()
    flags, i = flat[packed.numel():] != 0, 0
    if assumed is not None:
        if not flags[0]:
            raise PlanMiss("the encoder's plans did not hold for this batch")
        i = 1
    for f in nan:
        check_nan_flags(flags[i:i + f.numel()])
        i += f.numel()
    return unpack(flat[:packed.numel()].reshape(packed.shape), None if probs is None else probs.shape[-1], beams)
