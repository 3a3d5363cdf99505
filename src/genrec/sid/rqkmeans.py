"""Residual k-means (RQ-KMeans): the quantiser that turns item content vectors into Semantic IDs.

PinGER (Semantic IDs from content vectors, following TIGER): level 1 is k-means on the
vectors; level l is k-means on what is left after subtracting the chosen centroids of
levels 1..l-1. The code of an item is the tuple of chosen centroid indices.

Non-standard here:
- A level whose codebook size K exceeds the number of training points is capped at n
  (faiss cannot train it); the cap is recorded in ``stats["warnings"]`` and a Python
  warning is raised, so :attr:`codebook_sizes` can be smaller than requested.
- Optional capacity-constrained ("balanced") assignment at fit time: with
  ``capacity=c``, of the n_p training items sharing a prefix at level l, no code takes
  more than ceil(c * n_p / K_l). Assignment is point-proposing deferred acceptance on
  distances (:func:`balanced_assign`), then ``balance_iters`` Lloyd steps (centroid =
  mean of its balanced cluster, re-assign); the next level's residuals follow it.
  Balancing per prefix (not per level) bounds the items per full semantic code: skewed
  content vectors otherwise pile hundreds of items onto codes like (5, 0, 0) whose deeper
  residuals all land on the near-zero centroid. :meth:`ResidualKMeans.encode` (new items)
  always takes the nearest centroid; :meth:`fit_encode` returns the balanced training codes.
- Training is deterministic for a fixed ``seed`` (faiss seed per level = seed + level).
- The state is plain numpy arrays (``codebook_0 .. codebook_{L-1}`` + ``meta``), saved
  with safetensors; no pickles.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from safetensors.numpy import load_file, save_file

from genrec.errors import ConfigError, DataError

__all__ = ["ResidualKMeans", "balanced_assign", "check_vectors"]


def check_vectors(x: Any, *, name: str = "vectors") -> np.ndarray:
    """Return ``x`` as C-contiguous float32 ``[n, d]``; raise DataError naming the bad row."""
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise DataError(f"expected a 2-D array [n, d], got shape {arr.shape}", field=name)
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise DataError(f"empty array of shape {arr.shape}", field=name)
    if not np.issubdtype(arr.dtype, np.number):
        raise DataError(f"expected numbers, got dtype {arr.dtype}", field=name)
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"row {row + 1} (counting from 1) has a NaN or infinite value ({int(bad.sum())} bad rows)",
                        field=name)
    return arr


def _nearest(centroids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index of the nearest centroid (squared L2) for each row of ``x``: int64[n]."""
    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(centroids)
    _dist, idx = index.search(x, 1)  # [n, 1]
    return idx[:, 0].astype(np.int64)


def balanced_assign(x: np.ndarray, centroids: np.ndarray, capacity: float,
                    groups: np.ndarray | None = None) -> np.ndarray:
    """Assign rows of ``x`` to centroids with a size cap per (group, centroid): int64[n].

    A group of n_g rows (all rows when ``groups`` is None) may put at most
    ``ceil(capacity * n_g / K)`` of them on one centroid. Point-proposing deferred
    acceptance (Gale-Shapley): every unplaced point proposes to its next-nearest
    centroid; each (group, centroid) keeps its nearest proposers up to the cap (ties:
    lower row index) and rejects the rest. Each round is vectorised over all points;
    the result is the unique point-optimal stable assignment, so it equals the
    one-point-at-a-time algorithm's. Memory O(n * K) (full preference lists).
    """
    n, k = x.shape[0], centroids.shape[0]
    if capacity < 1.0:
        raise ConfigError(f"capacity must be >= 1.0, got {capacity}")
    g = np.zeros(n, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    if g.shape != (n,):
        raise DataError(f"groups must have shape ({n},), got {g.shape}", field="groups")
    _, g_inv, g_size = np.unique(g, return_inverse=True, return_counts=True)
    g_inv = g_inv.reshape(-1)
    cap = np.ceil(capacity * g_size / k - 1e-9).astype(np.int64)[g_inv]  # [n] cap of each row's group
    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(centroids)
    dist, pref = index.search(x, k)  # [n, K] ascending distance
    # faiss breaks distance ties arbitrarily; make preference order (distance, centroid id)
    order = np.lexsort((pref, dist), axis=1)
    pref = np.take_along_axis(pref, order, axis=1).astype(np.int64)
    dist = np.take_along_axis(dist, order, axis=1)
    rank = np.zeros(n, dtype=np.int64)  # position in each point's preference list
    rows = np.arange(n)
    while True:
        target = pref[rows, rank]  # [n]
        slot = g_inv * k + target  # (group, centroid)
        srt = np.lexsort((rows, dist[rows, rank], slot))  # by slot, then distance, then row
        s_sorted = slot[srt]
        first = np.searchsorted(s_sorted, s_sorted, side="left")
        reject = srt[(np.arange(n) - first) >= cap[srt]]
        if reject.size == 0:
            return target
        rank[reject] += 1


def _cluster_means(x: np.ndarray, assign: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Mean of the rows assigned to each centroid (the old centroid where none are): f32[K, d]."""
    k = old.shape[0]
    sums = np.zeros((k, x.shape[1]), dtype=np.float64)
    np.add.at(sums, assign, x)
    counts = np.bincount(assign, minlength=k)[:, None]
    return np.where(counts > 0, sums / np.maximum(counts, 1), old).astype(np.float32)


def _prefix_ids(codes: np.ndarray) -> np.ndarray:
    """Dense id per distinct row of ``codes`` [n, l] (all zeros when l == 0): int64[n]."""
    if codes.shape[1] == 0:
        return np.zeros(codes.shape[0], dtype=np.int64)
    return np.unique(codes, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


class ResidualKMeans:
    """``levels`` rounds of k-means, each on the residuals of the previous ones.

    >>> rq = ResidualKMeans(levels=2, codebook_size=4).fit(np.random.rand(100, 8).astype("f4"))
    >>> rq.encode(np.zeros((3, 8), "f4")).shape
    (3, 2)
    """

    def __init__(self, levels: int, codebook_size: int | list[int], niter: int = 20, seed: int = 0,
                 capacity: float | None = None, balance_iters: int = 5) -> None:
        if not isinstance(levels, (int, np.integer)) or levels < 1:
            raise ConfigError(f"levels must be a positive integer, got {levels!r}")
        if isinstance(codebook_size, (int, np.integer)):
            sizes = [int(codebook_size)] * levels
        else:
            sizes = [int(k) for k in codebook_size]
        if len(sizes) != levels:
            raise ConfigError(f"codebook_size has {len(sizes)} entries but levels={levels}")
        if any(k < 1 for k in sizes):
            raise ConfigError(f"codebook_size entries must be >= 1, got {sizes}")
        if niter < 1:
            raise ConfigError(f"niter must be >= 1, got {niter}")
        if capacity is not None and capacity < 1.0:
            raise ConfigError(f"capacity must be >= 1.0 (or None), got {capacity}")
        self.capacity = None if capacity is None else float(capacity)
        self.balance_iters = int(balance_iters)
        self.levels = int(levels)
        self.requested_sizes = sizes
        self.niter = int(niter)
        self.seed = int(seed)
        self.codebooks: list[np.ndarray] = []  # each [K_l, d] float32
        self.stats: dict[str, Any] = {"warnings": []}

    # ------------------------------------------------------------------ fit / encode
    @property
    def fitted(self) -> bool:
        return len(self.codebooks) == self.levels

    @property
    def codebook_sizes(self) -> list[int]:
        """Effective K per level (after any capping); only valid once fitted."""
        self._require_fitted()
        return [int(c.shape[0]) for c in self.codebooks]

    @property
    def dim(self) -> int:
        self._require_fitted()
        return int(self.codebooks[0].shape[1])

    def _require_fitted(self) -> None:
        if not self.fitted:
            raise ConfigError("ResidualKMeans is not fitted: call .fit(x) or ResidualKMeans.from_state(...)")

    def fit(self, x: Any) -> "ResidualKMeans":
        """Train one k-means per level on the running residuals of ``x`` (f32[n, d])."""
        self.fit_encode(x)
        return self

    def fit_encode(self, x: Any) -> np.ndarray:
        """Fit, and return the training codes int32[n, levels] the residuals followed.

        Without ``capacity`` these equal :meth:`encode` of ``x``; with it they are the
        balanced assignment.
        """
        x = check_vectors(x, name="x")
        n, d = x.shape
        residual = x.copy()  # [n, d]
        self.codebooks = []
        self.stats = {"warnings": [], "n_train": n, "dim": d, "capacity": self.capacity}
        codes = np.empty((n, self.levels), dtype=np.int32)  # [n, L]
        for level, k in enumerate(self.requested_sizes):
            if k > n:
                msg = f"level {level}: codebook_size {k} > {n} training points; capped to {n}"
                warnings.warn(msg, stacklevel=2)
                self.stats["warnings"].append(msg)
                k = n
            if k == 1:
                centroids = residual.mean(axis=0, keepdims=True).astype(np.float32)
            else:
                km = faiss.Kmeans(d, k, niter=self.niter, seed=self.seed + level, spherical=False, verbose=False)
                km.train(residual)
                centroids = np.ascontiguousarray(km.centroids, dtype=np.float32)  # [k, d]
            if self.capacity is None:
                assign = _nearest(centroids, residual)
            else:
                prefix = _prefix_ids(codes[:, :level])  # [n] group = shared code prefix
                assign = balanced_assign(residual, centroids, self.capacity, prefix)
                for _ in range(self.balance_iters):  # Lloyd steps under the capacity constraint
                    centroids = _cluster_means(residual, assign, centroids)
                    assign = balanced_assign(residual, centroids, self.capacity, prefix)
            codes[:, level] = assign
            residual -= centroids[assign]
            self.codebooks.append(centroids)
        return codes

    def encode(self, x: Any) -> np.ndarray:
        """Codes int32[n, levels]: nearest centroid per level on the running residuals."""
        self._require_fitted()
        x = check_vectors(x, name="x")
        if x.shape[1] != self.dim:
            raise DataError(f"vectors have dimension {x.shape[1]}, the codebooks {self.dim}", field="x")
        residual = x.copy()
        codes = np.empty((x.shape[0], self.levels), dtype=np.int32)  # [n, L]
        for level, centroids in enumerate(self.codebooks):
            assign = _nearest(centroids, residual)
            codes[:, level] = assign
            residual -= centroids[assign]
        return codes

    def reconstruct(self, codes: Any, levels: int | None = None) -> np.ndarray:
        """Sum of the chosen centroids of the first ``levels`` levels (default all): f32[n, d]."""
        self._require_fitted()
        codes = np.asarray(codes)
        use = self.levels if levels is None else int(levels)
        if codes.ndim != 2 or codes.shape[1] < use:
            raise DataError(f"codes must be [n, >= {use}], got shape {codes.shape}", field="codes")
        out = np.zeros((codes.shape[0], self.dim), dtype=np.float32)  # [n, d]
        for level in range(use):
            col = codes[:, level].astype(np.int64)
            k = self.codebooks[level].shape[0]
            if col.size and (col.min() < 0 or col.max() >= k):
                row = int(np.flatnonzero((col < 0) | (col >= k))[0])
                raise DataError(f"row {row}: code {int(col[row])} outside codebook of size {k}",
                                field=f"codes[:, {level}]")
            out += self.codebooks[level][col]
        return out

    def level_errors(self, x: Any, codes: Any | None = None) -> list[dict[str, float]]:
        """Reconstruction error after 1..L levels: ``[{"mse", "relative"}]``.

        ``mse`` is the mean over items of the squared L2 error; ``relative`` divides the
        summed squared error by the summed squared norm of ``x``.
        """
        x = check_vectors(x, name="x")
        codes = self.encode(x) if codes is None else np.asarray(codes)
        denom = float(np.square(x, dtype=np.float64).sum()) or 1.0
        approx = np.zeros_like(x)
        out = []
        for level in range(self.levels):
            approx += self.codebooks[level][codes[:, level].astype(np.int64)]
            err = float(np.square(x - approx, dtype=np.float64).sum())
            out.append({"mse": err / x.shape[0], "relative": err / denom})
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, np.ndarray]:
        """numpy arrays only: ``codebook_{l}`` f32[K_l, d] and ``meta`` (JSON bytes as uint8)."""
        self._require_fitted()
        meta = {"kind": "rqkmeans", "levels": self.levels, "requested_sizes": self.requested_sizes, "niter": self.niter,
                "seed": self.seed, "capacity": self.capacity,
                "balance_iters": self.balance_iters, "stats": self.stats}
        state = {f"codebook_{i}": c for i, c in enumerate(self.codebooks)}
        state["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8).copy()
        return state

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> "ResidualKMeans":
        if "meta" not in state:
            raise DataError("state has no 'meta' entry", field="meta")
        meta = json.loads(np.asarray(state["meta"], dtype=np.uint8).tobytes().decode())
        if meta.get("kind", "rqkmeans") != "rqkmeans":
            raise DataError(f"state is a {meta['kind']!r} quantiser, not 'rqkmeans'", field="meta")
        rq = cls(meta["levels"], meta["requested_sizes"], niter=meta["niter"], seed=meta["seed"],
                 capacity=meta.get("capacity"), balance_iters=meta.get("balance_iters", 5))
        books = []
        for i in range(rq.levels):
            key = f"codebook_{i}"
            if key not in state:
                raise DataError(f"state is missing {key!r}", field=key)
            books.append(np.ascontiguousarray(state[key], dtype=np.float32))
        dims = {b.shape[1] for b in books}
        if len(dims) != 1 or any(b.ndim != 2 for b in books):
            raise DataError(f"codebooks have inconsistent shapes {[b.shape for b in books]}", field="codebook_*")
        rq.codebooks = books
        rq.stats = meta.get("stats", {"warnings": []})
        return rq

    def save(self, path: str | Path) -> None:
        """Write the state as one safetensors file (caller handles atomicity)."""
        save_file(self.state_dict(), str(path))

    @classmethod
    def load(cls, path: str | Path) -> "ResidualKMeans":
        return cls.from_state(load_file(str(path)))
