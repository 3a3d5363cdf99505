"""First-order item transitions for the L1 fusion: ``log P(candidate | the history's last item)``.

A sequence model at the small widths that suit Amazon- and MovieLens-sized logs underfits the item-to-item
pairs of rare items, which a production L1 stage ranks with counting features. The cheapest such feature is the
transition from the user's last item: add-one smoothed counts of consecutive pairs in the users' histories,
``log((count(last -> c) + 1) / (count(last -> *) + N))`` over the N catalogue rows. Measured first as an offline
probe (docs/log/2026-12-06-l1-transitions.md): on Amazon Beauty it lifted L0+L1 test R@10 .0690 -> .0851.

Where the pairs come from decides whether a metric leaks: :func:`genrec.eval.fusion_tune.tune_fusion` and
``genrec eval`` count the pairs of the events before each user's target of the evaluated split (the
targets never); the table a server loads (``WORKDIR/fusion/<key>.transitions.npz``, written by ``genrec
fusion tune`` beside the weights it belongs to) counts every event of the tables.

Non-standard: the table is the sorted pair keys ``src * N + dst`` with their counts (a CSR without the row
pointers: one ``searchsorted`` finds every (last, candidate) pair of a batch at once).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa

from genrec.catalog import ItemCatalog
from genrec.errors import DataError
from genrec.workdir import atomic_write_bytes

__all__ = ["TransitionTable"]

FORMAT = "genrec.transitions/1"


@dataclass(frozen=True)
class TransitionTable:
    """Counts of consecutive catalogue-row pairs: ``keys`` int64 [P] (``src * n_items + dst``, sorted, unique),
    ``counts`` int64 [P], ``out_degree`` int64 [n_items] (pairs leaving each row)."""

    keys: np.ndarray
    counts: np.ndarray
    out_degree: np.ndarray
    n_items: int

    @classmethod
    def from_sequences(cls, sequences: Iterable[np.ndarray], n_items: int) -> "TransitionTable":
        """The pairs ``(s[i], s[i + 1])`` of each sequence of catalogue rows (oldest first); a pair with a row
        outside ``0 .. n_items - 1`` (e.g. -1, an item not in the catalogue) is not counted."""
        src, dst = [], []
        for s in sequences:
            s = np.asarray(s, dtype=np.int64)
            if len(s) > 1:
                src.append(s[:-1])
                dst.append(s[1:])
        return cls._from_pairs(np.concatenate(src) if src else np.zeros(0, np.int64),
                               np.concatenate(dst) if dst else np.zeros(0, np.int64), n_items)

    @classmethod
    def from_events(cls, users: np.ndarray, rows: np.ndarray, n_items: int) -> "TransitionTable":
        """The pairs of consecutive events of one user: ``users`` / ``rows`` (catalogue rows, -1 not in the
        catalogue) sorted by user, then by each user's event order."""
        users, rows = np.asarray(users), np.asarray(rows, dtype=np.int64)
        same = users[1:] == users[:-1]
        return cls._from_pairs(rows[:-1][same], rows[1:][same], n_items)

    @classmethod
    def from_events_table(cls, events: pa.Table, catalog: ItemCatalog) -> "TransitionTable":
        """The pairs of an events table (``user_id``, ``item_id``, ``seq``), each user's in ``seq`` order, over
        ``catalog``'s rows: the events before a split's targets for evaluating and choosing weights on it
        (``genrec.data.splits.history_events``), every event for serving (``genrec fusion tune`` writes that one
        beside the weights)."""
        u = np.asarray(events.column("user_id").to_numpy(), dtype=np.int64)
        i = np.asarray(events.column("item_id").to_numpy(), dtype=np.int64)
        o = np.lexsort((np.asarray(events.column("seq").to_numpy(), dtype=np.int64), u))
        return cls.from_events(u[o], catalog.rows(i[o], strict=False), len(catalog))

    @classmethod
    def _from_pairs(cls, a: np.ndarray, b: np.ndarray, n_items: int) -> "TransitionTable":
        ok = (a >= 0) & (a < n_items) & (b >= 0) & (b < n_items)
        a, b = a[ok], b[ok]
        keys, counts = np.unique(a * n_items + b, return_counts=True)
        return cls(keys, counts.astype(np.int64), np.bincount(a, minlength=n_items).astype(np.int64), int(n_items))

    def log_prob(self, last: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """float32 [B, M]: ``log P(rows[b, j] | last[b])``; 0 where the row or the last item is missing (< 0)."""
        last = np.asarray(last, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.int64)
        n = self.n_items
        ok = (rows >= 0) & (rows < n) & ((last >= 0) & (last < n))[:, None]
        src = np.clip(last, 0, max(n - 1, 0))
        key = src[:, None] * n + np.clip(rows, 0, max(n - 1, 0))
        if len(self.keys):
            i = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
            c = np.where(self.keys[i] == key, self.counts[i], 0)
        else:
            c = np.zeros(key.shape, np.int64)
        lp = np.log((c + 1.0) / (self.out_degree[src][:, None] + n))
        return np.where(ok, lp, 0.0).astype(np.float32)

    @cached_property
    def _by_count(self) -> tuple[np.ndarray, np.ndarray]:
        """(each row's first pair, rows + 1 offsets; every pair's destination) with each source's pairs by count,
        most first, ties by destination row: the candidate lists of :meth:`successors`."""
        n = self.n_items
        src, dst = self.keys // max(n, 1), self.keys % max(n, 1)
        order = np.lexsort((dst, -self.counts, src))
        return np.searchsorted(src[order], np.arange(n + 1)), dst[order]

    def successors(self, last: np.ndarray, n: int) -> np.ndarray:
        """int64 [B, n]: for each ``last[b]`` the (up to) ``n`` rows that followed it most often, most first (ties:
        lower row first), -1 past them or where ``last[b]`` is missing (< 0): an L0 candidate source, the items
        the L1 transition term favours most."""
        last = np.asarray(last, dtype=np.int64)
        out = np.full((len(last), max(n, 0)), -1, np.int64)
        if n <= 0 or not len(self.keys):
            return out
        ptr, dst = self._by_count
        ok = (last >= 0) & (last < self.n_items)
        start = np.where(ok, ptr[np.clip(last, 0, self.n_items - 1)], 0)
        count = np.where(ok, ptr[np.clip(last, 0, self.n_items - 1) + 1] - start, 0)
        j = np.arange(n)[None, :]
        has = j < count[:, None]
        out[has] = dst[(start[:, None] + j)[has]]
        return out

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write atomically (:func:`genrec.workdir.atomic_write_bytes`)."""
        buf = io.BytesIO()
        np.savez(buf, format=np.array(FORMAT), keys=self.keys, counts=self.counts, out_degree=self.out_degree,
                 n_items=np.array(self.n_items))
        atomic_write_bytes(path, buf.getvalue())
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> "TransitionTable":
        """A table written by :meth:`save`; a damaged or foreign file is a DataError naming it."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                if str(z["format"]) != FORMAT:
                    raise DataError(f"not a genrec transition table (format {str(z['format'])!r})", path=path,
                                    field="format")
                t = cls(z["keys"].astype(np.int64), z["counts"].astype(np.int64), z["out_degree"].astype(np.int64),
                        int(z["n_items"]))
        except (OSError, ValueError, KeyError) as e:
            raise DataError(f"cannot read the transition table ({e})", path=path) from e
        if t.keys.shape != t.counts.shape or t.out_degree.shape != (t.n_items,) or np.any(np.diff(t.keys) <= 0):
            raise DataError("inconsistent transition table (keys, counts and degrees disagree)", path=path)
        return t
