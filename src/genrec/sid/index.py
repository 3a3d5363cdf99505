"""The local, read-only, memory-mapped SID -> items index (PinGER serving: "local index").

PinGER replaces the remote ANN call with a per-host index from Semantic ID to items,
rebuilt daily, memory-mapped read-only and shared by every replica on the machine. When
the decoded full code is not a real item, the server falls back to a coarser prefix and
takes the items under it.

Non-standard here: each full code is packed into one uint64 key, level 0 in the most
significant bits (``bits_l = bit_length(K_l - 1)``), so lexicographic SID order equals
numeric key order and the items under ANY prefix are one contiguous slice found with two
``np.searchsorted`` calls. Codes needing more than 64 bits in total are refused.

Files in a saved folder: ``index.json`` (version, codebook sizes, bits), ``keys.npy``
uint64[N] (sorted), ``items.npy`` int64[N] (item of each key), ``id_sorted.npy`` int64[N]
(item ids ascending) and ``id_pos.npy`` int64[N] (row in ``keys`` of each of those ids).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from genrec.errors import ConfigError, DataError, MissingDataError
from genrec.sid.disambiguate import check_codes, check_item_ids

__all__ = ["SidIndex", "level_bits"]

META = "index.json"


def level_bits(codebook_sizes: Sequence[int]) -> list[int]:
    """Bits per level for packing; ConfigError if they sum to more than 64."""
    bits = [max(1, int(k - 1).bit_length()) for k in codebook_sizes]
    if sum(bits) > 64:
        raise ConfigError(f"codebook sizes {list(codebook_sizes)} need {sum(bits)} bits per packed SID (> 64): "
                          "use fewer levels or smaller codebooks")
    return bits


def _slices(lo: np.ndarray, hi: np.ndarray, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """offsets int64[B+1] and the flat row positions of ``lo[b]:min(hi[b], lo[b]+limit)``."""
    counts = hi - lo
    if limit is not None:
        counts = np.minimum(counts, int(limit))
    offsets = np.zeros(lo.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    pos = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1] - lo, counts)  # [M]
    return offsets, pos


class SidIndex:
    """Items sorted by packed SID; prefix look-ups at any depth 0..L."""

    def __init__(self, keys: np.ndarray, items: np.ndarray, id_sorted: np.ndarray, id_pos: np.ndarray,
                 codebook_sizes: Sequence[int], version: str = "") -> None:
        self.keys = keys  # uint64[N] ascending
        self.items = items  # int64[N]
        self.id_sorted = id_sorted  # int64[N]
        self.id_pos = id_pos  # int64[N]
        self.codebook_sizes = [int(k) for k in codebook_sizes]
        self.depth = len(self.codebook_sizes)  # L
        self.bits = level_bits(self.codebook_sizes)
        # shift of level l = bits of the levels after it
        self.shifts = [int(sum(self.bits[l + 1:])) for l in range(self.depth)]
        self.version = version

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    # ------------------------------------------------------------------ build / io
    @classmethod
    def build(cls, codes: Any, item_ids: Any, codebook_sizes: Sequence[int], version: str = "") -> "SidIndex":
        c = check_codes(codes)
        ids = check_item_ids(item_ids, c.shape[0])
        if c.shape[1] != len(codebook_sizes):
            raise DataError(f"codes have {c.shape[1]} levels but {len(codebook_sizes)} codebook sizes given",
                            field="codebook_sizes")
        for lvl, k in enumerate(codebook_sizes):
            if c.shape[0] and c[:, lvl].max() >= k:
                row = int(np.argmax(c[:, lvl]))
                raise DataError(f"row {row}: code {int(c[row, lvl])} >= codebook size {k}", field=f"codes[:, {lvl}]")
        idx = cls(np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                  codebook_sizes, version)
        keys = idx.pack(c)  # [N]
        order = np.argsort(keys, kind="stable")
        if keys.shape[0] > 1:
            ks = keys[order]
            dup = np.flatnonzero(ks[1:] == ks[:-1])
            if dup.size:
                i = int(dup[0])
                raise DataError(f"items {int(ids[order[i]])} and {int(ids[order[i + 1]])} share one full code: "
                                "disambiguate first", field="codes")
        idx.keys = keys[order]
        idx.items = ids[order]
        id_order = np.argsort(idx.items, kind="stable")
        idx.id_sorted = idx.items[id_order]
        idx.id_pos = id_order.astype(np.int64)
        return idx

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("keys", "items", "id_sorted", "id_pos"):
            np.save(folder / f"{name}.npy", np.asarray(getattr(self, name)))
        meta = {"format": "genrec.sid.index/1", "version": self.version, "codebook_sizes": self.codebook_sizes,
                "bits": self.bits, "n_items": len(self)}
        (folder / META).write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def load(cls, folder: str | Path, mmap: bool = True) -> "SidIndex":
        """Open a saved index; with ``mmap`` the arrays are read-only memory maps."""
        folder = Path(folder)
        if not (folder / META).exists():
            raise MissingDataError(f"{folder / META} not found: not a saved SidIndex folder")
        meta = json.loads((folder / META).read_text())
        arrs = {}
        for name in ("keys", "items", "id_sorted", "id_pos"):
            p = folder / f"{name}.npy"
            if not p.exists():
                raise MissingDataError(f"{p} not found (index folder incomplete)")
            arrs[name] = np.load(p, mmap_mode="r" if mmap else None)
            if arrs[name].shape != (meta["n_items"],):
                raise DataError(f"shape {arrs[name].shape}, expected ({meta['n_items']},)", path=p, field=name)
        idx = cls(codebook_sizes=meta["codebook_sizes"], version=meta["version"], **arrs)
        if idx.bits != meta["bits"]:
            raise DataError(f"bits {meta['bits']} do not match codebook sizes", path=folder / META, field="bits")
        return idx

    # ------------------------------------------------------------------ packing
    def pack(self, codes: Any) -> np.ndarray:
        """Full codes int[n, L] -> uint64[n]; DataError if a code is outside its codebook."""
        c = np.asarray(codes, dtype=np.int64)
        if c.ndim != 2 or c.shape[1] != self.depth:
            raise DataError(f"expected codes [n, {self.depth}], got shape {c.shape}", field="codes")
        bad = (c < 0) | (c >= np.asarray(self.codebook_sizes, dtype=np.int64))
        if bad.any():
            row, lvl = map(int, np.argwhere(bad)[0])
            raise DataError(f"row {row}: code {int(c[row, lvl])} outside 0..{self.codebook_sizes[lvl] - 1}",
                            field=f"codes[:, {lvl}]")
        return self._pack_prefix(c)

    def _pack_prefix(self, p: np.ndarray) -> np.ndarray:
        """Prefix int64[B, d] (codes already in range) -> uint64 key with later levels zero."""
        key = np.zeros(p.shape[0], dtype=np.uint64)
        for lvl in range(p.shape[1]):
            key |= p[:, lvl].astype(np.uint64) << np.uint64(self.shifts[lvl])
        return key

    def unpack(self, keys: Any) -> np.ndarray:
        """uint64[n] -> int32[n, L]."""
        k = np.asarray(keys, dtype=np.uint64)
        out = np.empty((k.shape[0], self.depth), dtype=np.int32)
        for lvl in range(self.depth):
            mask = np.uint64((1 << self.bits[lvl]) - 1)
            out[:, lvl] = ((k >> np.uint64(self.shifts[lvl])) & mask).astype(np.int32)
        return out

    # ------------------------------------------------------------------ look-ups
    def ranges(self, prefixes: Any) -> tuple[np.ndarray, np.ndarray]:
        """Row range ``lo[b]:hi[b]`` in the sorted keys of each prefix int[B, d] (empty if invalid)."""
        p = np.asarray(prefixes)
        if p.ndim != 2 or p.shape[1] > self.depth:
            raise ValueError(f"prefixes must be [B, d] with d <= {self.depth}, got shape {p.shape}")
        p = p.astype(np.int64, copy=False)
        B, d = p.shape
        n = len(self)
        if d == 0:
            return np.zeros(B, dtype=np.int64), np.full(B, n, dtype=np.int64)
        ok = np.asarray(((p >= 0) & (p < np.asarray(self.codebook_sizes[:d], dtype=np.int64))).all(axis=1))  # [B]
        safe = np.where(ok[:, None], p, 0)
        lo_key = self._pack_prefix(safe)  # [B]
        hi_key = lo_key | np.uint64((1 << self.shifts[d - 1]) - 1)  # inclusive upper bound
        lo = np.searchsorted(self.keys, lo_key, side="left").astype(np.int64)
        hi = np.searchsorted(self.keys, hi_key, side="right").astype(np.int64)
        hi = np.where(ok, hi, lo)
        return lo, hi

    def lookup_batch(self, prefixes: Any, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Items under each prefix int[B, d]: (offsets int64[B+1], items int64[M]), CSR style.

        Prefix b's items are ``items[offsets[b]:offsets[b+1]]`` in lexicographic SID order,
        at most ``limit`` of them. A prefix with an out-of-range code has no items.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        lo, hi = self.ranges(prefixes)
        offsets, pos = _slices(lo, hi, limit)
        return offsets, np.asarray(self.items[pos], dtype=np.int64)

    def lookup(self, prefix: Sequence[int]) -> np.ndarray:
        """Items whose SID starts with ``prefix`` (any depth 0..L): int64[m]."""
        p = np.asarray(list(prefix), dtype=np.int64).reshape(1, -1)
        lo, hi = self.ranges(p)
        return np.array(self.items[int(lo[0]):int(hi[0])], dtype=np.int64)

    def lookup_fallback(self, prefixes: Any, min_items: int = 1,
                        limit: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Coarse-prefix fallback: use the deepest depth whose prefix has >= ``min_items`` items.

        Returns (offsets int64[B+1], items int64[M], depth int64[B]). Depth 0 (the whole
        catalogue) is the last resort.
        """
        p = np.asarray(prefixes, dtype=np.int64)
        if p.ndim != 2 or p.shape[1] > self.depth:
            raise ValueError(f"prefixes must be [B, d] with d <= {self.depth}, got shape {p.shape}")
        B, D = p.shape
        lo = np.zeros(B, dtype=np.int64)
        hi = np.full(B, len(self), dtype=np.int64)
        depth = np.zeros(B, dtype=np.int64)
        done = np.zeros(B, dtype=bool)
        for d in range(D, 0, -1):
            l_d, h_d = self.ranges(p[:, :d])
            take = ~done & (h_d - l_d >= min_items)
            lo = np.where(take, l_d, lo)
            hi = np.where(take, h_d, hi)
            depth = np.where(take, d, depth)
            done |= take
            if done.all():
                break
        offsets, pos = _slices(lo, hi, limit)
        return offsets, np.asarray(self.items[pos], dtype=np.int64), depth

    def codes_of(self, item_ids: Any) -> np.ndarray:
        """Full codes int32[n, L] of the given items; KeyError naming unknown ids."""
        ids = np.asarray(item_ids, dtype=np.int64).reshape(-1)
        pos = np.searchsorted(self.id_sorted, ids)
        safe = np.minimum(pos, max(len(self) - 1, 0))
        known = np.zeros(ids.shape, dtype=bool)
        if len(self):
            known = (pos < len(self)) & (np.asarray(self.id_sorted[safe]) == ids)
        if not known.all():
            unknown = ids[~known]
            raise KeyError(f"{unknown.size} item id(s) not in SID index {self.version or ''}: "
                           f"{unknown[:10].tolist()}{' ...' if unknown.size > 10 else ''}")
        rows = np.asarray(self.id_pos[safe], dtype=np.int64)
        return self.unpack(np.asarray(self.keys[rows]))

    def contains(self, item_ids: Any) -> np.ndarray:
        ids = np.asarray(item_ids, dtype=np.int64).reshape(-1)
        if not len(self):
            return np.zeros(ids.shape, dtype=bool)
        pos = np.minimum(np.searchsorted(self.id_sorted, ids), len(self) - 1)
        return np.asarray(self.id_sorted[pos]) == ids
