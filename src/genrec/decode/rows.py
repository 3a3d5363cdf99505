"""SID beams -> catalogue rows: the one mapping the serving funnel and the offline evaluation share.

A run's SIDs are unique full codes (the SID build disambiguates them), so a valid beam ends on
exactly one leaf of the trie and that leaf is one item. :func:`leaf_rows` maps the leaves to
catalogue rows once; :func:`beam_leaf_rows` follows each beam to its leaf on the device (the
offline SID path ranks these, beam by beam); :func:`beam_rows` is the serving funnel's list of
them: deduplicated, in beam order, with each row's beam log-probability.
"""

from __future__ import annotations

import numpy as np
import torch

from genrec.catalog import ItemCatalog
from genrec.decode.beam import BeamResult
from genrec.decode.trie_torch import SidArrays, TorchTrie

__all__ = ["beam_leaf_rows", "beam_rows", "compact", "first_seen", "leaf_rows"]


def leaf_rows(trie: SidArrays, catalog: ItemCatalog, *, strict: bool = False) -> np.ndarray:
    """int64 [N]: the catalogue row of each leaf of ``trie`` (depth-L node order); an item the catalogue
    lacks is -1 (``strict``: raises instead)."""
    return catalog.rows(np.asarray(trie.leaf_items, dtype=np.int64), strict=strict)


def beam_leaf_rows(beams: BeamResult, trie: TorchTrie, rows: torch.Tensor) -> torch.Tensor:
    """int64 [B, W] on the trie's device: the catalogue row of each beam's leaf (``rows``: :func:`leaf_rows`
    as a tensor there); -1 for an invalid beam."""
    node = trie.walk(beams.codes.clamp_min(0))[..., -1]  # [B, W] leaf node (-1 invalid)
    return torch.where((node >= 0) & beams.valid, rows[node.clamp_min(0)], torch.full_like(node, -1))


def beam_rows(beams: BeamResult, trie: TorchTrie, rows: torch.Tensor, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Valid beams -> catalogue rows, beam order, deduplicated, at most ``limit`` per request:
    (rows int64 [B, limit] (-1 pad), the beam log-probability of each, float32 [B, limit] (nan pad))."""
    b, w = beams.scores.shape
    at = beam_leaf_rows(beams, trie, rows)  # [B, W]
    # one device->host copy for both (rows are small ints: exact in float64)
    packed = torch.cat([at.double().flatten(), beams.scores.double().flatten()]).cpu().numpy()
    beam_row = packed[: b * w].astype(np.int64).reshape(b, w)
    scores = packed[b * w:].astype(np.float32).reshape(b, w)
    out = np.full((b, limit), -1, np.int64)
    lp = np.full((b, limit), np.nan, np.float32)
    i, j, pos = compact(first_seen(beam_row), limit)  # no Python loop over requests or beams
    out[i, pos], lp[i, pos] = beam_row[i, j], scores[i, j]
    return out, lp


def first_seen(a: np.ndarray) -> np.ndarray:
    """bool, shape of int ``a`` [B, W]: ``a[i, j] >= 0`` and no earlier ``a[i, j'] == a[i, j]`` (j' < j) --
    each row's values deduplicated in order, negative values (padding) dropped."""
    if a.size == 0:
        return np.zeros(a.shape, bool)
    order = np.argsort(a, axis=1, kind="stable")  # equal values keep their order: the first stays first
    s = np.take_along_axis(a, order, 1)
    dup = np.zeros(a.shape, bool)
    dup[:, 1:] = s[:, 1:] == s[:, :-1]
    out = np.empty(a.shape, bool)
    np.put_along_axis(out, order, ~dup, 1)
    return out & (a >= 0)


def compact(keep: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first ``limit`` True entries of each row of bool ``keep`` [B, W], moved to the front:
    (row i, column j, new column) of each, row-major."""
    pos = np.cumsum(keep, axis=1) - 1
    i, j = np.nonzero(keep & (pos < limit))
    return i, j, pos[i, j]
