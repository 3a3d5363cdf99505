"""The legal-SID prefix trie as device tensors, queried one batched op per decode step.

Follows PinGER's serving section ("约束解码"): the trie of existing SIDs lives on the
accelerator in CSR form and each decode step does one batched lookup, never a trip
back to the CPU and never a Python loop over beams.

Input is the plain array layout of ``genrec.sid.trie.SidTrie`` (this module does not
import it; :class:`SidArrays`): nodes at depths 0..L, numbered per depth in lexicographic order of their
prefixes; for d in 0..L-1 ``offsets[d]: int64[n_d + 1]`` delimits node j's children
``codes[d][offsets[d][j]:offsets[d][j+1]]`` (ascending) and ``children[d]`` (their node
ids at depth d+1).

What is non-standard:
  * Two layouts per depth for ``valid_mask``, picked by size. Where ``n_d * K_d`` is
    small (the shallow levels) a dense ``has_child[d]: bool[n_d, K_d]`` table makes the
    mask a single row gather (1 byte per entry). Deeper levels stay CSR: the mask is
    built by expanding each queried node's child segment (vectorised segment expansion)
    and scattering its codes. ``advance`` always binary-searches a per-depth sorted key
    ``parent * K_d + code`` (sorted because nodes are numbered lexicographically and codes
    ascend within a node): B*W lookups of O(log n) are cheap, and no int64 [n_d, K_d]
    table is needed.
  * Node id -1 stands for "no node" (a dead or invalid beam); it has no children and
    every query on it answers "invalid" / -1.
  * On CUDA each query is one Triton launch (:mod:`genrec.kernels.trie_step`, same answers)
    unless ``GENREC_TRIE=torch``; the torch ops below are the reference and the CPU path.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from genrec.errors import ConfigError, DataError

DEFAULT_DENSE_MAX_ENTRIES = 1 << 26  # bool entries: at most 64 MiB per dense level


def _kernels(t: torch.Tensor):  # type: ignore[no-untyped-def]
    """The Triton trie step module for a CUDA query, or None (CPU, GENREC_TRIE=torch, no triton)."""
    if not t.is_cuda or os.environ.get("GENREC_TRIE", "").lower() == "torch":
        return None
    try:
        from genrec.kernels import trie_step  # local: triton, needed only for a CUDA query
    except ImportError:  # pragma: no cover - triton ships with CUDA torch builds
        return None
    return trie_step


class SidArrays(Protocol):
    """The plain array layout of a SID trie (:class:`genrec.sid.trie.SidTrie` has it): per depth
    ``offsets`` / ``codes`` / ``children``, the ``codebook_sizes`` and ``leaf_items`` (the item of each
    depth-L node, in node order)."""

    offsets: list[np.ndarray]
    codes: list[np.ndarray]
    children: list[np.ndarray]
    codebook_sizes: list[int]
    leaf_items: np.ndarray


@dataclass
class _Level:
    """One depth d of the trie (edges from depth d to depth d+1)."""

    offsets: torch.Tensor  # [n_d + 1] int64
    codes: torch.Tensor  # [n_{d+1}] int64, ascending within each parent
    children: torch.Tensor  # [n_{d+1}] int64
    keys: torch.Tensor  # [n_{d+1}] int64, parent * K_d + code, ascending
    has_child: torch.Tensor | None  # [n_d, K_d] bool, or None for CSR-only levels
    n_nodes: int  # n_d
    k: int  # K_d: codebook size of level d+1
    max_fanout: int  # most children of any node at depth d (host int: fixes the CSR expansion's size)


class TorchTrie:
    """Prefix trie of legal SIDs on a torch device. Build with :meth:`from_sid_trie` (a run's SIDs)
    or :meth:`from_arrays`."""

    def __init__(self, levels: list[_Level], codebook_sizes: list[int], device: torch.device, n_leaves: int) -> None:
        self._levels = levels
        self.codebook_sizes = list(codebook_sizes)
        self.device = device
        self.n_leaves = n_leaves  # a host int: counting the leaves never reads the device

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_sid_trie(cls, trie: SidArrays, device: torch.device | str = "cpu", *,
                      dense_max_entries: int = DEFAULT_DENSE_MAX_ENTRIES) -> TorchTrie:
        """The device copy of a SID trie (e.g. ``open_current(wd.sid).trie``, a run's current SIDs)."""
        return cls.from_arrays(trie.offsets, trie.codes, trie.children, [int(k) for k in trie.codebook_sizes],
                               device=device, dense_max_entries=dense_max_entries)

    @classmethod
    def from_arrays(
        cls,
        offsets: Sequence[np.ndarray],
        codes: Sequence[np.ndarray],
        children: Sequence[np.ndarray],
        codebook_sizes: Sequence[int],
        device: torch.device | str = "cpu",
        *,
        dense_max_entries: int = DEFAULT_DENSE_MAX_ENTRIES,
        check: bool = True,
    ) -> TorchTrie:
        """Copy the CSR arrays to ``device``; levels with ``n_d * K_d <= dense_max_entries``
        also get a dense bool child table. ``check`` validates the arrays (O(edges))."""
        n_levels = len(codebook_sizes)
        if n_levels < 1:
            raise ConfigError("codebook_sizes must name at least one level")
        for name, arr in (("offsets", offsets), ("codes", codes), ("children", children)):
            if len(arr) != n_levels:
                raise DataError(
                    f"expected {n_levels} arrays (one per level, len(codebook_sizes)), got {len(arr)}",
                    field=name,
                )
        if any(int(k) < 1 for k in codebook_sizes):
            raise ConfigError(f"codebook_sizes must be positive, got {list(codebook_sizes)}")
        dev = torch.device(device)
        levels: list[_Level] = []
        n_d = 1  # the root
        for d in range(n_levels):
            k = int(codebook_sizes[d])
            off = np.asarray(offsets[d], dtype=np.int64)
            cod = np.asarray(codes[d], dtype=np.int64)
            chi = np.asarray(children[d], dtype=np.int64)
            if check:
                _check_level(d, n_d, k, off, cod, chi)
            n_next = int(off[-1])
            counts = np.diff(off)
            parent = np.repeat(np.arange(n_d, dtype=np.int64), counts)  # [n_{d+1}]
            keys = parent * k + cod
            has_child_t: torch.Tensor | None = None
            if n_d * k <= dense_max_entries:
                table = np.zeros(n_d * k, dtype=bool)
                table[keys] = True
                has_child_t = torch.from_numpy(table.reshape(n_d, k)).to(dev)
            levels.append(
                _Level(
                    offsets=torch.from_numpy(np.array(off)).to(dev),  # copy: the trie may be a read-only mmap
                    codes=torch.from_numpy(np.array(cod)).to(dev),
                    children=torch.from_numpy(np.array(chi)).to(dev),
                    keys=torch.from_numpy(keys).to(dev),
                    has_child=has_child_t,
                    n_nodes=n_d,
                    k=k,
                    max_fanout=int(counts.max()) if counts.size else 0,
                )
            )
            n_d = n_next
        return cls(levels, list(int(k) for k in codebook_sizes), dev, n_d)

    # ------------------------------------------------------------------ properties
    @property
    def n_levels(self) -> int:
        return len(self._levels)

    def n_nodes(self, depth: int) -> int:
        """Number of nodes at ``depth`` (0 = root, L = leaves)."""
        if depth == self.n_levels:
            return self.n_leaves
        return self._level(depth).n_nodes

    def cut(self, depth: int) -> TorchTrie:
        """The trie of the prefixes of ``depth`` levels (this trie's first ``depth`` levels, the same tensors)."""
        if not 1 <= depth <= self.n_levels:
            raise ConfigError(f"depth must be in 1..{self.n_levels}, got {depth}")
        return TorchTrie(self._levels[:depth], self.codebook_sizes[:depth], self.device, self.n_nodes(depth))

    def last_level(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The leaves under each depth-(L-1) node: (offsets int64 [n_{L-1} + 1], final code of each leaf
        int64 [n_L], the most leaves under one node). Leaves are numbered in lexicographic SID order, so
        node j's leaves are ``offsets[j]:offsets[j + 1]`` -- the trie's ``leaf_start[L-1]``."""
        lv = self._levels[-1]
        return lv.offsets, lv.codes, lv.max_fanout

    def is_dense(self, depth: int) -> bool:
        return self._level(depth).has_child is not None

    def _level(self, depth: int) -> _Level:
        if not 0 <= depth < len(self._levels):
            raise ConfigError(f"depth must be in 0..{len(self._levels) - 1}, got {depth}")
        return self._levels[depth]

    # ------------------------------------------------------------------ queries
    def valid_mask(self, depth: int, node_ids: torch.Tensor, *, force_csr: bool = False) -> torch.Tensor:
        """Which next-level codes exist below each node.

        node_ids: int64 [N] node ids at ``depth`` (-1 = none). Returns bool [N, K_depth].
        ``force_csr``: read the CSR segments even where a dense table exists.
        """
        lv = self._level(depth)
        node_ids = node_ids.to(device=self.device, dtype=torch.int64)
        fast = _kernels(node_ids)
        if fast is not None:
            return fast.valid_mask_triton(node_ids, lv.offsets, lv.codes, None if force_csr else lv.has_child, lv.k)
        return self.valid_mask_reference(depth, node_ids, force_csr=force_csr)

    def valid_mask_reference(self, depth: int, node_ids: torch.Tensor, *, force_csr: bool = False) -> torch.Tensor:
        """:meth:`valid_mask` in plain torch ops (the CPU path and the Triton kernel's twin)."""
        lv = self._level(depth)
        node_ids = node_ids.to(device=self.device, dtype=torch.int64)
        n = node_ids.shape[0]
        alive = node_ids >= 0  # [N]
        safe = node_ids.clamp(min=0)  # [N]
        if lv.has_child is not None and not force_csr:
            return lv.has_child[safe] & alive[:, None]  # [N, K]
        # CSR: every queried node's child segment, expanded to the level's largest fan-out F
        # (known at build time, so no device->host sync: the step stays CUDA-graph capturable).
        # N*F <= N*K, the size of the mask itself. Slots past a node's own count write a dummy column K.
        f = lv.max_fanout
        if f == 0:
            return torch.zeros(n, lv.k, dtype=torch.bool, device=self.device)
        starts = lv.offsets[safe]  # [N]
        counts = torch.where(alive, lv.offsets[safe + 1] - starts, torch.zeros_like(starts))  # [N]
        slot = torch.arange(f, device=self.device)  # [F]
        edge = (starts[:, None] + slot).clamp(max=lv.codes.numel() - 1)  # [N, F]
        code = torch.where(slot < counts[:, None], lv.codes[edge], lv.k)  # [N, F], K = dummy
        mask = torch.zeros(n, lv.k + 1, dtype=torch.bool, device=self.device)  # [N, K + 1]
        mask.scatter_(1, code, True)
        return mask[:, : lv.k]

    def advance(self, depth: int, node_ids: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Child of each node along each code: int64 [N] node ids at depth+1, -1 where the
        node is -1, the code is out of range, or the edge does not exist."""
        lv = self._level(depth)
        node_ids = node_ids.to(device=self.device, dtype=torch.int64)
        codes = codes.to(device=self.device, dtype=torch.int64)
        if node_ids.shape != codes.shape:
            raise ConfigError(f"node_ids {tuple(node_ids.shape)} and codes {tuple(codes.shape)} must match")
        fast = _kernels(node_ids)
        if fast is not None and node_ids.ndim == 1:
            return fast.advance_triton(node_ids, codes, lv.offsets, lv.codes, lv.children, lv.k, lv.max_fanout)
        return self.advance_reference(depth, node_ids, codes)

    def advance_reference(self, depth: int, node_ids: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """:meth:`advance` in plain torch ops (the CPU path and the Triton kernel's twin)."""
        lv = self._level(depth)
        node_ids = node_ids.to(device=self.device, dtype=torch.int64)
        codes = codes.to(device=self.device, dtype=torch.int64)
        ok = (node_ids >= 0) & (codes >= 0) & (codes < lv.k)  # [N]
        safe_node = torch.where(ok, node_ids, torch.zeros_like(node_ids))
        safe_code = torch.where(ok, codes, torch.zeros_like(codes))
        minus_one = torch.full_like(node_ids, -1)
        if lv.keys.numel() == 0:
            return minus_one
        query = safe_node * lv.k + safe_code  # [N]
        pos = torch.searchsorted(lv.keys, query).clamp(max=lv.keys.numel() - 1)  # [N]
        hit = ok & (lv.keys[pos] == query)
        return torch.where(hit, lv.children[pos], minus_one)

    def walk(self, codes: torch.Tensor) -> torch.Tensor:
        """Node ids reached by following each row of ``codes`` from the root.

        codes: int64 [..., m] with m <= L. Returns int64 [..., m + 1]: column j is the node
        at depth j (-1 once the path leaves the trie). Column 0 is the root (0).
        """
        if codes.shape[-1] > self.n_levels:
            raise ConfigError(f"codes have {codes.shape[-1]} levels, the trie has {self.n_levels}")
        n = math.prod(codes.shape[:-1])
        flat = codes.reshape(n, codes.shape[-1]).to(device=self.device, dtype=torch.int64)  # [N, m]
        node = torch.zeros(flat.shape[0], dtype=torch.int64, device=self.device)  # [N]
        path = [node]
        for d in range(flat.shape[1]):
            node = self.advance(d, node, flat[:, d])
            path.append(node)
        return torch.stack(path, dim=1).reshape(*codes.shape[:-1], flat.shape[1] + 1)

    def contains(self, codes: torch.Tensor) -> torch.Tensor:
        """bool [...]: does the full (or partial) SID in the last dim exist in the trie."""
        return self.walk(codes)[..., -1] >= 0

    def valid_prefix_depth(self, codes: torch.Tensor) -> torch.Tensor:
        """int64 [...]: length of the longest prefix of each SID that exists in the trie."""
        return (self.walk(codes)[..., 1:] >= 0).long().sum(-1)  # prefixes are nested: count = depth


def _check_level(d: int, n_d: int, k: int, off: np.ndarray, cod: np.ndarray, chi: np.ndarray) -> None:
    """Validate one level's CSR arrays; errors name the array and the first bad entry."""
    if off.ndim != 1 or off.shape[0] != n_d + 1:
        raise DataError(f"expected shape [{n_d + 1}] (n_{d} + 1), got {list(off.shape)}", field=f"offsets[{d}]")
    if off[0] != 0 or np.any(np.diff(off) < 0):
        bad = 0 if off[0] != 0 else int(np.argmax(np.diff(off) < 0)) + 1
        raise DataError(f"must start at 0 and be non-decreasing (entry {bad} = {off[bad]})", field=f"offsets[{d}]")
    n_next = int(off[-1])
    for name, arr in ((f"codes[{d}]", cod), (f"children[{d}]", chi)):
        if arr.ndim != 1 or arr.shape[0] != n_next:
            raise DataError(f"expected shape [{n_next}] (offsets[{d}][-1]), got {list(arr.shape)}", field=name)
    if n_next and (cod.min() < 0 or cod.max() >= k):
        bad = int(np.argmax((cod < 0) | (cod >= k)))
        raise DataError(f"entry {bad} = {cod[bad]} is outside codebook 0..{k - 1}", field=f"codes[{d}]")
    parent = np.repeat(np.arange(n_d, dtype=np.int64), np.diff(off))
    keys = parent * k + cod
    if n_next > 1 and np.any(np.diff(keys) <= 0):
        bad = int(np.argmax(np.diff(keys) <= 0)) + 1
        raise DataError(f"codes must ascend strictly within each node (entry {bad})", field=f"codes[{d}]")
    if n_next and not np.array_equal(chi, np.arange(n_next, dtype=np.int64)):
        # Lexicographic numbering forces children[d] == arange(n_{d+1}); other numberings
        # would still work for queries, but they mean the producer broke the format.
        bad = int(np.argmax(chi != np.arange(n_next)))
        raise DataError(
            f"entry {bad} = {chi[bad]}: nodes must be numbered in lexicographic order", field=f"children[{d}]"
        )
