"""The prefix trie of all valid Semantic IDs, as CSR arrays (PinGER: constrained decoding).

PinGER keeps the trie of valid code prefixes on the GPU in compressed-sparse-row form so
each decoding step is one batched table look-up. This module builds those arrays (numpy,
saved as one ``.npy`` per array so a server can memory-map them or copy them to a
device); ``genrec.kernels`` / ``genrec.decode`` read the same arrays.

FORMAT (other modules depend on it):

SID codes ``int32[N, L]``; ``codebook_sizes: list[int]`` of length L. Nodes exist at
depths 0..L (depth 0 = the root only; depth L = leaves = full codes, one per item).
Nodes at each depth are numbered 0..n_d-1 in lexicographic order of their prefixes.
For d in 0..L-1: ``offsets[d]: int64[n_d + 1]`` (node j's children are entries
offsets[d][j]:offsets[d][j+1]), ``codes[d]: int32[n_{d+1}]`` child codes, ascending
within each node, ``children[d]: int64[n_{d+1}]`` child node index at depth d+1.
``leaf_start[d]: int64[n_d + 1]`` for d in 0..L: node j at depth d covers leaves
leaf_start[d][j]:leaf_start[d][j+1] in lexicographic SID order. ``leaf_items: int64[N]``:
the item id of each leaf in lexicographic SID order.

Because children are numbered in prefix order, ``children[d]`` is always
``arange(n_{d+1})``; it is stored anyway so a consumer never has to rely on that.

Files in a saved folder: ``trie.json`` (L, N, codebook_sizes, nodes per depth, largest
fan-out per depth) and ``offsets_{d}.npy``, ``codes_{d}.npy``, ``children_{d}.npy``,
``leaf_start_{d}.npy``, ``leaf_items.npy``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np

from genrec.errors import DataError, MissingDataError
from genrec.sid.disambiguate import check_codes, check_item_ids, lex_order

__all__ = ["SidTrie"]

META = "trie.json"


def _ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flattened ``arange(starts[b], starts[b] + counts[b])`` for all b, and the row b of each."""
    total = int(counts.sum())
    rows = np.repeat(np.arange(counts.shape[0]), counts)  # [M]
    first = np.cumsum(counts) - counts  # position in the output where row b starts
    idx = np.arange(total) - np.repeat(first, counts) + np.repeat(starts, counts)  # [M]
    return idx, rows


class SidTrie:
    """Valid SID prefixes in CSR form; see the module docstring for the array layout."""

    def __init__(self, offsets: list[np.ndarray], codes: list[np.ndarray], children: list[np.ndarray],
                 leaf_start: list[np.ndarray], leaf_items: np.ndarray, codebook_sizes: list[int],
                 max_fanout: list[int] | None = None) -> None:
        self.offsets = offsets
        self.codes = codes
        self.children = children
        self.leaf_start = leaf_start
        self.leaf_items = leaf_items
        self.codebook_sizes = [int(k) for k in codebook_sizes]
        self.depth = len(self.codebook_sizes)  # L
        if max_fanout is None:
            max_fanout = [int(np.diff(o).max()) if o.shape[0] > 1 else 0 for o in offsets]
        self.max_fanout = [int(f) for f in max_fanout]

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, codes: Any, item_ids: Any, codebook_sizes: list[int]) -> "SidTrie":
        """Build from full codes int[N, L] (unique rows) and their item ids int[N]."""
        c = check_codes(codes)
        n, L = c.shape
        ids = check_item_ids(item_ids, n)
        sizes = [int(k) for k in codebook_sizes]
        if len(sizes) != L:
            raise DataError(f"{len(sizes)} codebook sizes for codes with {L} levels", field="codebook_sizes")
        for lvl, k in enumerate(sizes):
            if n and c[:, lvl].max() >= k:
                row = int(np.argmax(c[:, lvl]))
                raise DataError(f"row {row}: code {int(c[row, lvl])} >= codebook size {k}", field=f"codes[:, {lvl}]")
        order = lex_order(c)
        s = c[order]  # [N, L] sorted
        # first column where row i differs from row i-1 (L if identical)
        if n > 1:
            neq = s[1:] != s[:-1]  # [N-1, L]
            first_diff = np.where(neq.any(axis=1), neq.argmax(axis=1), L)
            if (first_diff == L).any():
                i = int(np.flatnonzero(first_diff == L)[0])
                raise DataError(f"items {int(ids[order[i]])} and {int(ids[order[i + 1]])} share the full code "
                                f"{s[i].tolist()}: disambiguate first", field="codes")
        else:
            first_diff = np.zeros(0, dtype=np.int64)
        leaf_start: list[np.ndarray] = []
        node_of_row: list[np.ndarray] = []  # node index at depth d for each sorted row
        for d in range(L + 1):
            starts = np.ones(n, dtype=bool)
            starts[1:] = first_diff < d
            if n:
                ls = np.append(np.flatnonzero(starts), n).astype(np.int64)
            else:
                ls = np.zeros(1, dtype=np.int64) if d else np.zeros(2, dtype=np.int64)
            leaf_start.append(ls)
            node_of_row.append(np.cumsum(starts) - 1)
        offsets, codes_l, children = [], [], []
        for d in range(L):
            child_first_row = leaf_start[d + 1][:-1]  # [n_{d+1}]
            parent = node_of_row[d][child_first_row]  # [n_{d+1}] non-decreasing
            n_d = leaf_start[d].shape[0] - 1
            offsets.append(np.searchsorted(parent, np.arange(n_d + 1), side="left").astype(np.int64))
            codes_l.append(s[child_first_row, d].astype(np.int32))
            children.append(np.arange(child_first_row.shape[0], dtype=np.int64))
        return cls(offsets, codes_l, children, leaf_start, ids[order].astype(np.int64), sizes)

    # ------------------------------------------------------------------ save / load
    def save(self, folder: str | Path) -> None:
        """One ``.npy`` per array + ``trie.json`` (caller makes the folder write atomic)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for d in range(self.depth):
            np.save(folder / f"offsets_{d}.npy", np.asarray(self.offsets[d]))
            np.save(folder / f"codes_{d}.npy", np.asarray(self.codes[d]))
            np.save(folder / f"children_{d}.npy", np.asarray(self.children[d]))
        for d in range(self.depth + 1):
            np.save(folder / f"leaf_start_{d}.npy", np.asarray(self.leaf_start[d]))
        np.save(folder / "leaf_items.npy", np.asarray(self.leaf_items))
        meta = {"format": "genrec.sid.trie/1", "depth": self.depth, "n_items": int(self.leaf_items.shape[0]),
                "codebook_sizes": self.codebook_sizes, "nodes_per_depth": self.nodes_per_depth,
                "max_fanout": self.max_fanout}
        (folder / META).write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def load(cls, folder: str | Path, mmap: bool = True) -> "SidTrie":
        folder = Path(folder)
        if not (folder / META).exists():
            raise MissingDataError(f"{folder / META} not found: not a saved SidTrie folder")
        meta = json.loads((folder / META).read_text())
        mode: Literal["r"] | None = "r" if mmap else None
        L = int(meta["depth"])

        def ld(name: str) -> np.ndarray:
            p = folder / name
            if not p.exists():
                raise MissingDataError(f"{p} not found (trie folder incomplete)")
            return np.load(p, mmap_mode=mode)

        trie = cls([ld(f"offsets_{d}.npy") for d in range(L)], [ld(f"codes_{d}.npy") for d in range(L)],
                   [ld(f"children_{d}.npy") for d in range(L)], [ld(f"leaf_start_{d}.npy") for d in range(L + 1)],
                   ld("leaf_items.npy"), meta["codebook_sizes"], meta["max_fanout"])
        if trie.nodes_per_depth != meta["nodes_per_depth"]:
            raise DataError(f"arrays give {trie.nodes_per_depth} nodes per depth, trie.json says "
                            f"{meta['nodes_per_depth']}", path=folder / META, field="nodes_per_depth")
        return trie

    # ------------------------------------------------------------------ queries
    @property
    def nodes_per_depth(self) -> list[int]:
        return [int(ls.shape[0]) - 1 for ls in self.leaf_start]

    def _check_depth(self, d: int, top: int) -> None:
        if not 0 <= d < top:
            raise ValueError(f"depth d={d} outside 0..{top - 1}")

    def _check_nodes(self, d: int, node_ids: np.ndarray) -> None:
        n_d = self.nodes_per_depth[d]
        if node_ids.size and (node_ids.max() >= n_d or node_ids.min() < -1):
            raise ValueError(f"node_ids at depth {d} must be in -1..{n_d - 1}, got {node_ids.min()}..{node_ids.max()}")

    def child(self, d: int, node_ids: Any, codes: Any) -> np.ndarray:
        """Child of each node at depth d reached with code ``codes[b]``: int64[B] (-1 = none).

        Vectorised lower-bound binary search inside each node's slice of ``codes[d]``;
        the loop runs ceil(log2(max fan-out + 1)) times over the whole batch. Node -1
        (a prefix already known invalid) stays -1.
        """
        self._check_depth(d, self.depth)
        nodes = np.asarray(node_ids, dtype=np.int64).reshape(-1)  # [B]
        want = np.asarray(codes, dtype=np.int64).reshape(-1)  # [B]
        if nodes.shape != want.shape:
            raise ValueError(f"node_ids has {nodes.shape[0]} entries, codes {want.shape[0]}")
        self._check_nodes(d, nodes)
        valid = nodes >= 0
        safe = np.where(valid, nodes, 0)
        off = self.offsets[d]
        cd = self.codes[d]
        lo = np.asarray(off[safe], dtype=np.int64)
        end = np.asarray(off[safe + 1], dtype=np.int64)
        hi = end.copy()
        last = max(int(cd.shape[0]) - 1, 0)
        for _ in range(int(self.max_fanout[d]).bit_length()):
            active = lo < hi
            mid = (lo + hi) // 2
            mid_code = np.asarray(cd[np.minimum(mid, last)], dtype=np.int64) if cd.shape[0] else mid
            right = active & (mid_code < want)
            lo = np.where(right, mid + 1, lo)
            hi = np.where(active & ~right, mid, hi)
        found = valid & (lo < end)
        if cd.shape[0]:
            found &= np.asarray(cd[np.minimum(lo, last)], dtype=np.int64) == want
        out = np.full(nodes.shape[0], -1, dtype=np.int64)
        if found.any():
            out[found] = self.children[d][lo[found]]
        return out

    def valid_mask(self, d: int, node_ids: Any) -> np.ndarray:
        """bool[B, K_d]: which codes at level d extend each node (row of False for node -1)."""
        self._check_depth(d, self.depth)
        nodes = np.asarray(node_ids, dtype=np.int64).reshape(-1)  # [B]
        self._check_nodes(d, nodes)
        mask = np.zeros((nodes.shape[0], self.codebook_sizes[d]), dtype=bool)  # [B, K_d]
        valid = nodes >= 0
        safe = np.where(valid, nodes, 0)
        starts = np.asarray(self.offsets[d][safe], dtype=np.int64)
        counts = np.where(valid, np.asarray(self.offsets[d][safe + 1], dtype=np.int64) - starts, 0)
        idx, rows = _ranges(starts, counts)
        mask[rows, np.asarray(self.codes[d][idx], dtype=np.int64)] = True
        return mask

    def node_of_prefix(self, prefix: Any) -> np.ndarray:
        """Node index at depth d of each prefix int[B, d] (-1 where the prefix is not valid)."""
        p = np.asarray(prefix, dtype=np.int64)
        if p.ndim != 2 or p.shape[1] > self.depth:
            raise ValueError(f"prefix must be [B, d] with d <= {self.depth}, got shape {p.shape}")
        nodes = np.zeros(p.shape[0], dtype=np.int64)  # [B], the root
        for d in range(p.shape[1]):
            nodes = self.child(d, nodes, p[:, d])
        return nodes

    def items_of_node(self, d: int, node: int) -> np.ndarray:
        """Item ids of the leaves under one node at depth d (lexicographic SID order)."""
        self._check_depth(d, self.depth + 1)
        ls = self.leaf_start[d]
        if not 0 <= node < ls.shape[0] - 1:
            raise ValueError(f"node {node} outside 0..{ls.shape[0] - 2} at depth {d}")
        return np.asarray(self.leaf_items[int(ls[node]):int(ls[node + 1])])

    def nbytes(self) -> int:
        arrs = [*self.offsets, *self.codes, *self.children, *self.leaf_start, self.leaf_items]
        return int(sum(np.asarray(a).nbytes for a in arrs))
