"""Engagement vectors: item embeddings from the item-item co-interaction graph.

PinGER's dense history token concatenates a content vector with an OmniSage graph
embedding (OmniSage is Pinterest's graph+sequence
representation). We have no OmniSage, so this is the classical count-based stand-in
(Levy & Goldberg 2014; Levy, Goldberg & Dagan 2015):

1. co-occurrence counts ``C[a, b]`` = number of position pairs ``(i, j)`` in one user's
   history, ordered by ``seq``, with ``0 < |i - j| <= window`` and items ``a != b``
   (``window=None``: all pairs of the history, computed as ``B^T B`` from the
   user x item count matrix ``B`` -- cost grows with the square of history length);
   symmetric, self-pairs dropped, entries below ``min_count`` dropped;
2. PPMI: ``max(0, log P(a, b) - log P(a) - log P_alpha(b))`` from the counts, with optional
   context-distribution smoothing ``alpha`` (``smoothing``; 1.0 = plain PPMI);
3. truncated SVD ``PPMI ~= U S V^T`` (exact when small, seeded ``randomized_svd``
   otherwise); item vector = ``U sqrt(S)``, L2-normalised.

Everything stays sparse: nothing of size items x items is ever dense.

Items with no co-interaction (never in ``events``, or only alone in their users'
windows, or with every PPMI entry <= 0) get an **all-zero vector**. Callers can tell
them apart by their zero norm; the store records how many there are.

Leakage: this is a pure function of ``events``. The caller must pass the TRAINING
split's events only -- no validation or test interaction may reach it, or held-out
targets leak into the features every model sees.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from genrec.errors import ConfigError, DataError
from genrec.features.content import l2_normalize, truncated_svd


def _column(events: pa.Table, name: str) -> np.ndarray:
    if name not in events.column_names:
        raise DataError(f"events table has no {name!r} column", field=name)
    col = events.column(name)
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"null {name} in events table (row {row + 1})", line=row + 1, field=name)
    return col.to_numpy()


def item_rows(events_item_ids: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
    """Map event item ids to rows of ``item_ids`` (any order). Unknown ids -> DataError."""
    item_ids = np.asarray(item_ids, dtype=np.int64)
    sorter = np.argsort(item_ids, kind="stable")
    sorted_ids = item_ids[sorter]
    if sorted_ids.size > 1 and (sorted_ids[1:] == sorted_ids[:-1]).any():
        dup = int(sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]][0])
        raise DataError(f"item_ids has duplicate item_id {dup}", field="item_id")
    pos = np.searchsorted(sorted_ids, events_item_ids)  # [E]
    pos_c = np.minimum(pos, max(len(sorted_ids) - 1, 0))
    ok = (len(sorted_ids) > 0) & (sorted_ids[pos_c] == events_item_ids) if len(events_item_ids) else \
        np.ones(0, dtype=bool)
    if not np.all(ok):
        row = int(np.flatnonzero(~ok)[0])
        raise DataError(f"event item_id {int(events_item_ids[row])} is not in the item catalogue "
                        f"(events row {row + 1})", line=row + 1, field="item_id")
    return sorter[pos_c] if len(sorted_ids) else pos_c  # [E]


def cooccurrence(events: pa.Table, item_ids: np.ndarray, *, window: int | None = 5, min_count: float = 1,
                 actions: Sequence[str] | None = None) -> sp.csr_matrix:
    """Symmetric item-item co-occurrence counts [n_items, n_items] (float64 CSR, zero diagonal).

    Rows/columns follow ``item_ids``. ``actions`` keeps only events with those actions.
    """
    if window is not None and window < 1:
        raise ConfigError(f"window must be >= 1 or None (whole history), got {window}")
    if min_count < 1:
        raise ConfigError(f"min_count must be >= 1, got {min_count}")
    if actions is not None:
        if "action" not in events.column_names:
            raise DataError("events table has no 'action' column to filter on", field="action")
        events = events.filter(pc.is_in(events.column("action"), value_set=pa.array(list(actions), pa.string())))
    n = len(item_ids)
    users = _column(events, "user_id").astype(np.int64)  # [E]
    seq = _column(events, "seq").astype(np.int64)  # [E]
    rows = item_rows(_column(events, "item_id").astype(np.int64), item_ids)  # [E]
    order = np.lexsort((seq, users))  # by user, then seq
    users, rows = users[order], rows[order].astype(np.int32)

    if window is None:
        # user x item counts B; B^T B counts position pairs (a != b) over whole histories
        uniq, u_idx = np.unique(users, return_inverse=True)
        b = sp.csr_matrix((np.ones(len(rows)), (u_idx, rows)), shape=(len(uniq), n))  # [U, n]
        c = (b.T @ b).tocsr()  # [n, n]
        c.setdiag(0)
    else:
        upper = sp.csr_matrix((n, n), dtype=np.float64)
        for d in range(1, window + 1):
            if d >= len(users):
                break
            same = users[:-d] == users[d:]  # [E - d]
            if not same.any():
                break
            a, bb = rows[:-d][same], rows[d:][same]
            keep = a != bb
            a, bb = a[keep], bb[keep]
            lo, hi = np.minimum(a, bb), np.maximum(a, bb)
            upper = upper + sp.csr_matrix((np.ones(len(lo)), (lo, hi)), shape=(n, n))
        c = (upper + upper.T).tocsr()
    c.eliminate_zeros()
    if min_count > 1:
        c.data[c.data < min_count] = 0
        c.eliminate_zeros()
    c.sort_indices()
    return c


def ppmi(counts: sp.spmatrix, *, smoothing: float = 1.0) -> sp.csr_matrix:
    """Positive PMI of a co-occurrence matrix, computed on its non-zeros only.

    ``PMI[a, b] = log(C_ab / |C|) - log(P(a)) - log(P_alpha(b))`` with ``P(a) = C_a / |C|`` and
    ``P_alpha(b) = C_b^alpha / sum_c C_c^alpha`` (``alpha = smoothing``). Negative values -> 0.
    """
    if not 0 < smoothing <= 1:
        raise ConfigError(f"smoothing must be in (0, 1], got {smoothing}")
    c = sp.coo_matrix(counts, dtype=np.float64)
    total = c.data.sum()
    if total <= 0:
        return sp.csr_matrix(c.shape, dtype=np.float64)
    row_sum = np.asarray(c.sum(axis=1)).ravel()  # [n]
    col_sum = np.asarray(c.sum(axis=0)).ravel()  # [m]
    ctx = np.power(col_sum, smoothing)  # [m]
    p_ctx = ctx / ctx.sum()
    p_row = row_sum / total
    pmi = np.log(c.data / total) - np.log(p_row[c.row]) - np.log(p_ctx[c.col])  # [nnz]
    keep = pmi > 0
    out = sp.csr_matrix((pmi[keep], (c.row[keep], c.col[keep])), shape=c.shape)
    out.sort_indices()
    return out


def svd_embed(m: sp.spmatrix, dim: int, *, seed: int = 0) -> np.ndarray:
    """``U sqrt(S)`` of the top-``dim`` SVD of ``m`` [n, n'] -> [n, dim] float32, NOT normalised.

    Only rows and columns with a non-zero take part; other rows are zero. Columns beyond the
    rank of the active block are zero.
    """
    m = sp.csr_matrix(m)
    out = np.zeros((m.shape[0], dim), dtype=np.float32)
    active_r = np.flatnonzero(np.diff(m.indptr) > 0)
    active_c = np.flatnonzero(np.bincount(m.indices, minlength=m.shape[1]) > 0)
    if active_r.size == 0:
        return out
    sub = m[active_r][:, active_c].astype(np.float32)  # [r, c]; float32 halves the randomized SVD's cost
    k = min(dim, min(sub.shape))
    u, s, _ = truncated_svd(sub, k, seed=seed)  # [r, k], [k]
    out[active_r, :k] = u * np.sqrt(s)
    return out


def engagement_vectors(events: pa.Table, item_ids: np.ndarray, *, dim: int = 64, window: int | None = 5,
                       min_count: float = 1, smoothing: float = 1.0, actions: Sequence[str] | None = None,
                       seed: int = 0) -> np.ndarray:
    """Engagement vectors [n_items, dim] float32, rows aligned to ``item_ids``, L2-normalised.

    ``events`` must be the TRAINING split only (see module docstring); items with no
    co-interactions get all-zero rows.
    """
    if dim < 1:
        raise ConfigError(f"engagement dim must be >= 1, got {dim}")
    item_ids = np.asarray(item_ids, dtype=np.int64)
    c = cooccurrence(events, item_ids, window=window, min_count=min_count, actions=actions)  # [n, n]
    return l2_normalize(svd_embed(ppmi(c, smoothing=smoothing), dim, seed=seed))  # [n, dim]
