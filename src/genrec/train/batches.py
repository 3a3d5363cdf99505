"""From joined user records to model batches (UniPinRec §3.2: past sequence + future feedview).

Each training example is one user's train history, optionally cut at one of the user's
feedviews: with probability ``p_rank`` (and when the user has a feedview with a non-empty
history before it), a feedview is drawn, the history is cut at its request (so no slate
item is visible to the candidates: their labels would leak), and the slate becomes the
candidates. Otherwise the whole train history (last ``context_len`` items) is used with no
candidates, which keeps most of the next-item / next-SID signal.

Batches are deterministic functions of ``(seed, epoch, index)``: the materialised example
list is shuffled per epoch with ``seed + epoch``, the feedview choice hashes ``(seed, epoch,
user)``. That is what lets :class:`genrec.train.trainer.Trainer` resume to the same loss
trajectory. Examples are materialised once (compact int arrays): fine up to tens of millions
of events; a streaming variant would shuffle within a bucket window instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from genrec.catalog import ItemCatalog
from genrec.data.join import UserExample
from genrec.errors import DataError


@dataclass
class TrainExample:
    rows: np.ndarray  # int64 [n] catalogue rows of the history
    actions: np.ndarray  # int64 [n]
    surfaces: np.ndarray  # int64 [n]
    timestamps: np.ndarray  # int64 [n]
    fv_rows: list[np.ndarray]  # per feedview: catalogue rows of the slate
    fv_labels: list[np.ndarray]  # per feedview: int32 label bitmasks
    fv_hist: np.ndarray  # int64 [F]: history items before each feedview
    fv_surface: np.ndarray  # int64 [F]
    fv_ts: np.ndarray  # int64 [F]
    user_id: int


def materialise(examples: Iterable[UserExample], catalog: ItemCatalog, *, min_len: int = 2) -> list[TrainExample]:
    """Turn joined records into compact examples (users with < ``min_len`` history items dropped)."""
    out: list[TrainExample] = []
    for ex in examples:
        if len(ex.items) < min_len:
            continue
        fvs = [f for f in ex.feedviews if f.history_len >= 1 and len(f.item_ids) > 0]
        # one catalogue look-up for the history and every slate (a look-up per slate dominated the time)
        lens = [len(ex.items), *(len(f.item_ids) for f in fvs)]
        rows = np.split(catalog.rows(np.concatenate([ex.items, *(f.item_ids for f in fvs)])), np.cumsum(lens[:-1]))
        out.append(TrainExample(
            rows=rows[0], actions=ex.actions.astype(np.int64),
            surfaces=ex.surfaces.astype(np.int64), timestamps=ex.timestamps.astype(np.int64),
            fv_rows=rows[1:], fv_labels=[f.labels for f in fvs],
            fv_hist=np.array([f.history_len for f in fvs], dtype=np.int64),
            fv_surface=np.array([f.surface for f in fvs], dtype=np.int64),
            fv_ts=np.array([f.request_ts for f in fvs], dtype=np.int64), user_id=int(ex.user_id)))
    return out


@dataclass
class TrainBatch:
    """Padded index tensors; features are gathered on the device inside the objective."""

    rows: torch.Tensor  # [B, n] catalogue rows (0 at padding)
    actions: torch.Tensor  # [B, n]
    surfaces: torch.Tensor  # [B, n]
    timestamps: torch.Tensor  # [B, n]
    lengths: torch.Tensor  # [B]
    cand_rows: torch.Tensor | None  # [B, k]
    cand_labels: torch.Tensor | None  # [B, k, C] float
    cand_valid: torch.Tensor | None  # [B, k] bool
    cand_surface: torch.Tensor | None  # [B]
    request_ts: torch.Tensor | None  # [B]

    def to(self, device: torch.device | str) -> "TrainBatch":
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return TrainBatch(*(mv(getattr(self, f)) for f in self.__dataclass_fields__))  # type: ignore[arg-type]

    @property
    def batch_size(self) -> int:
        return int(self.rows.shape[0])


def _hash_unit(seed: int, epoch: int, user: int) -> float:
    x = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + user * 0x94D049BB133111EB) & ((1 << 64) - 1)
    x ^= x >> 31
    x = (x * 0xD6E8FEB86659FD93) & ((1 << 64) - 1)
    x ^= x >> 32
    return (x & ((1 << 53) - 1)) / float(1 << 53)


NEIGHBOURS = 50
"""How many nearest items per item ``data.neg_sampling=neighbours`` draws from."""
NEG_SAMPLING = ("uniform", "popularity", "neighbours", "mixed")
"""``data.neg_sampling``: how ranking rows' impression-only candidates are drawn (``mixed``: half from the
neighbours, half uniformly)."""


def neighbour_table(vectors: np.ndarray, n: int, *, chunk: int = 4096) -> np.ndarray:
    """int64 [N, n]: each row's ``n`` nearest other rows by cosine (best first), rows with a zero vector (no
    engagement) left out; -1 fills a zero row and the columns past the number of other non-zero rows. Exact,
    in chunks of ``chunk`` rows (O(N^2 d): fine for catalogues up to ~10^5 items)."""
    x = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))
    norm = x.norm(dim=1, keepdim=True)
    ok = norm[:, 0] > 0
    x = torch.where(ok[:, None], x / norm.clamp_min(1e-12), torch.zeros_like(x))
    k = min(n, int(ok.sum()) - 1)
    out = np.full((len(x), n), -1, np.int64)
    if k < 1:
        return out
    for lo in range(0, len(x), chunk):
        sim = x[lo:lo + chunk] @ x.T  # [c, N]
        sim[:, ~ok] = -torch.inf
        sim[torch.arange(len(sim)), torch.arange(lo, lo + len(sim))] = -torch.inf  # not itself
        out[lo:lo + len(sim), :k] = sim.topk(k, dim=1).indices.numpy()
    out[~ok.numpy()] = -1
    return out


def neighbour_negatives(table: np.ndarray, slate: np.ndarray, seen: np.ndarray, n_neg: int, n_catalog: int,
                        g: np.random.Generator, n_near: int | None = None) -> np.ndarray:
    """``n_neg`` catalogue rows: the first ``n_near`` (None: all) near the ``slate``'s items (a slate item, then
    one of its ``table`` neighbours, drawn uniformly), none of them in ``seen`` (the user's own items) or the
    slate; the rest -- and rows the neighbours cannot supply (items without neighbours, too few left) -- drawn
    uniformly."""
    out = np.empty(0, np.int64)
    n_near = n_neg if n_near is None else min(n_near, n_neg)
    if len(slate) and n_near > 0:
        nb = table[slate[g.integers(0, len(slate), 4 * n_near)], g.integers(0, table.shape[1], 4 * n_near)]
        nb = nb[(nb >= 0) & ~np.isin(nb, seen) & ~np.isin(nb, slate)]
        out = nb[np.sort(np.unique(nb, return_index=True)[1])][:n_near]  # distinct, in draw order
    if len(out) < n_neg:
        out = np.concatenate([out, g.integers(0, n_catalog, n_neg - len(out))])
    return out


def collate(exs: list[TrainExample], *, epoch: int, seed: int, context_len: int, n_actions: int,
            p_rank: float, max_cands: int, neg_cands: int = 0, n_catalog: int = 0,
            neg_cdf: np.ndarray | None = None, pad_multiple: int = 1, fv_pick: str = "uniform",
            rank_rows: str = "cut", neg_table: np.ndarray | None = None, neg_near: int | None = None) -> TrainBatch:
    """Build one padded batch. Histories keep their newest ``context_len`` items.

    ``neg_cands`` > 0 appends that many catalogue items to every chosen slate as
    impression-only candidates (all labels 0): uniformly drawn, or by ``neg_cdf`` (the
    cumulative sampling distribution over catalogue rows, e.g. popularity^0.75 -- negatives
    that look like what retrieval returns). None of the bundled datasets logs impressions,
    so without them the action heads would only learn *which* action an engaged user takes,
    never *whether* they engage (an impressions file's slates carry logged label-0 items of their own);
    the draw hashes ``(seed, epoch, user)``. ``neg_table`` (int64 [n_catalog, n], -1 pad: each row's
    nearest items, :func:`neighbour_table`) draws them instead next to the slate's items -- what a
    retriever returns beside what the user took, the candidates the L1 stage must order -- leaving out
    every item of the user's own sequence (:func:`neighbour_negatives`); ``neg_near``: only that many of
    them, the rest uniform (None: all).

    ``pad_multiple`` > 1 rounds the item slots (up to ``context_len``) and the candidate slots up
    to a multiple of it: padding is invisible to every attention and loss, and a few repeating
    shapes let the GPU's kernels and attention plans be reused from step to step.

    ``fv_pick`` says which feedview a row cut for ranking takes: ``uniform`` (any of the user's, drawn),
    or ``last`` (the newest: the row keeps the most history, so the next-item and SID targets of the
    recent items -- the ones closest to what is predicted at serving -- stay in training).

    ``rank_rows`` says what a user drawn for ranking gives: ``cut`` (that user's one row is cut at the
    feedview: its retrieval targets after the cut are not trained that epoch) or ``extra`` (the user's
    whole-history row stays, and the cut row with its slate is appended after the batch's ``len(exs)``
    rows: the batch grows by the users drawn, retrieval sees every row it sees without ranking).
    """
    hist: list[slice] = []
    picks: list[int] = []
    extra: list[tuple[TrainExample, int]] = []
    for ex in exs:
        n = len(ex.rows)
        f = -1
        if p_rank > 0 and len(ex.fv_rows) > 0 and _hash_unit(seed, epoch, ex.user_id) < p_rank:
            f = len(ex.fv_rows) - 1 if fv_pick == "last" else int(_hash_unit(seed + 1, epoch, ex.user_id) * len(ex.fv_rows))
            if rank_rows == "extra":
                extra.append((ex, f))
                f = -1
            else:
                n = int(ex.fv_hist[f])
        picks.append(f)
        hist.append(slice(max(0, n - context_len), n))
    for ex, f in extra:
        n = int(ex.fv_hist[f])
        picks.append(f)
        hist.append(slice(max(0, n - context_len), n))
    exs = [*exs, *(ex for ex, _ in extra)]
    B = len(exs)
    n_max = max(s.stop - s.start for s in hist)
    if pad_multiple > 1:
        n_max = max(n_max, min(-(-n_max // pad_multiple) * pad_multiple, context_len))
    rows = np.zeros((B, n_max), np.int64)
    acts = np.zeros((B, n_max), np.int64)
    surf = np.zeros((B, n_max), np.int64)
    ts = np.zeros((B, n_max), np.int64)
    lengths = np.zeros(B, np.int64)
    for b, (ex, s) in enumerate(zip(exs, hist)):
        m = s.stop - s.start
        rows[b, :m], acts[b, :m], surf[b, :m], ts[b, :m] = ex.rows[s], ex.actions[s], ex.surfaces[s], ex.timestamps[s]
        lengths[b] = m
    batch = TrainBatch(torch.from_numpy(rows), torch.from_numpy(acts), torch.from_numpy(surf), torch.from_numpy(ts),
                       torch.from_numpy(lengths), None, None, None, None, None)
    if any(f >= 0 for f in picks):
        k_real = min(max_cands, max(len(ex.fv_rows[f]) for ex, f in zip(exs, picks) if f >= 0))  # slate items
        k = k_real + neg_cands
        k = -(-k // pad_multiple) * pad_multiple if pad_multiple > 1 else k  # padding slots: never valid
        crow = np.zeros((B, k), np.int64)
        clab = np.zeros((B, k, n_actions), np.float32)
        cval = np.zeros((B, k), bool)
        csurf = np.zeros(B, np.int64)
        rts = np.zeros(B, np.int64)
        bits = 1 << np.arange(n_actions)
        for b, (ex, f) in enumerate(zip(exs, picks)):
            if f < 0:
                continue
            r = ex.fv_rows[f][:k_real]
            if neg_cands and n_catalog:
                g = np.random.default_rng([seed, epoch, ex.user_id & 0x7FFFFFFF, 7])
                if neg_table is not None:
                    neg = neighbour_negatives(neg_table, r, ex.rows, neg_cands, n_catalog, g, neg_near)
                elif neg_cdf is None:
                    neg = g.integers(0, n_catalog, neg_cands)
                else:
                    neg = np.minimum(np.searchsorted(neg_cdf, g.random(neg_cands), side="right"), n_catalog - 1)
                r = np.concatenate([r, neg])
            crow[b, :len(r)] = r
            lab = ex.fv_labels[f][:k_real]
            clab[b, :len(lab)] = (lab[:, None] & bits[None, :]) > 0
            cval[b, :len(r)] = True
            csurf[b] = ex.fv_surface[f]
            rts[b] = ex.fv_ts[f]
        batch.cand_rows, batch.cand_labels = torch.from_numpy(crow), torch.from_numpy(clab)
        batch.cand_valid, batch.cand_surface = torch.from_numpy(cval), torch.from_numpy(csurf)
        batch.request_ts = torch.from_numpy(rts)
    return batch


@dataclass(frozen=True)
class CollateOptions:
    """:func:`collate`'s settings, checked once (``BatchStream`` and the streaming input share them)."""

    context_len: int
    n_actions: int
    p_rank: float = 0.5
    max_cands: int = 32
    neg_cands: int = 0
    n_catalog: int = 0
    neg_cdf: np.ndarray | None = None
    pad_multiple: int = 1
    fv_pick: str = "uniform"
    rank_rows: str = "cut"
    neg_table: np.ndarray | None = None
    neg_near: int | None = None

    def __post_init__(self) -> None:
        if self.pad_multiple < 1:
            raise DataError(f"pad_multiple must be >= 1, got {self.pad_multiple}", field="pad_multiple")
        if self.fv_pick not in ("uniform", "last"):
            raise DataError(f"fv_pick must be 'uniform' or 'last', got {self.fv_pick!r}", field="fv_pick")
        if self.rank_rows not in ("cut", "extra"):
            raise DataError(f"rank_rows must be 'cut' or 'extra', got {self.rank_rows!r}", field="rank_rows")
        if self.neg_table is not None and (self.neg_table.ndim != 2 or len(self.neg_table) != self.n_catalog
                                           or self.neg_table.max(initial=-1) >= self.n_catalog):
            raise DataError(f"neg_table: need int rows [{self.n_catalog}, n] of catalogue rows (-1 pad), "
                            f"got shape {self.neg_table.shape}", field="neg_sampling")

    @staticmethod
    def negative_cdf(neg_weights: np.ndarray, n_catalog: int) -> np.ndarray:
        """Sampling weights per catalogue row -> the normalised CDF ``collate`` draws negatives from."""
        w = np.asarray(neg_weights, dtype=np.float64)
        if w.shape != (n_catalog,) or not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
            raise DataError(f"neg_weights: need {n_catalog} finite non-negative weights with a positive sum",
                            field="neg_sampling")
        return np.cumsum(w) / w.sum()

    def collate(self, exs: list[TrainExample], *, epoch: int, seed: int) -> TrainBatch:
        return collate(exs, epoch=epoch, seed=seed, context_len=self.context_len, n_actions=self.n_actions,
                       p_rank=self.p_rank, max_cands=self.max_cands, neg_cands=self.neg_cands,
                       n_catalog=self.n_catalog, neg_cdf=self.neg_cdf, pad_multiple=self.pad_multiple,
                       fv_pick=self.fv_pick, rank_rows=self.rank_rows, neg_table=self.neg_table,
                       neg_near=self.neg_near)


class BatchStream:
    """Deterministic epochs of shuffled batches over materialised examples.

    ``iter_from(step)`` yields the batches of global steps ``step, step+1, ...`` (one rank's
    share when ``rank/world`` are given: a contiguous slice of each global batch).
    """

    def __init__(self, examples: list[TrainExample], *, batch_size: int, seed: int, context_len: int = 0,
                 n_actions: int = 0, p_rank: float = 0.5, max_cands: int = 32, rank: int = 0, world: int = 1,
                 neg_cands: int = 0, n_catalog: int = 0, neg_weights: np.ndarray | None = None,
                 pad_multiple: int = 1, fv_pick: str = "uniform", rank_rows: str = "cut",
                 neg_table: np.ndarray | None = None, neg_near: int | None = None,
                 options: CollateOptions | None = None) -> None:
        """``options``: the batches' settings as the streaming input takes them (then the settings given one by
        one are not read); else they are built from those."""
        if not examples:
            raise DataError("no training examples (every user has fewer than 2 train events?)")
        if batch_size % world:
            raise DataError(f"global batch size {batch_size} is not divisible by world size {world}",
                            field="batch_size")
        self.examples = examples
        self.batch_size = batch_size
        self.seed = seed
        self.rank, self.world = rank, world
        self.options = options or CollateOptions(
            context_len=context_len, n_actions=n_actions, p_rank=p_rank, max_cands=max_cands, neg_cands=neg_cands,
            n_catalog=n_catalog, pad_multiple=pad_multiple, fv_pick=fv_pick, rank_rows=rank_rows, neg_table=neg_table,
            neg_near=neg_near,
            neg_cdf=None if neg_weights is None else CollateOptions.negative_cdf(neg_weights, n_catalog))
        self.steps_per_epoch = max(1, len(examples) // batch_size)

    def batch_at(self, step: int) -> TrainBatch:
        epoch, i = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng(self.seed + epoch).permutation(len(self.examples))
        glob = order[i * self.batch_size:(i + 1) * self.batch_size]
        per = self.batch_size // self.world
        mine = glob[self.rank * per:(self.rank + 1) * per]
        return self.options.collate([self.examples[j] for j in mine], epoch=epoch, seed=self.seed)

    def iter_from(self, step: int) -> Iterator[TrainBatch]:
        while True:
            yield self.batch_at(step)
            step += 1
