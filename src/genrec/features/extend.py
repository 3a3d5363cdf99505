"""Content vectors for items that arrived after ``genrec features build``, in the features' own content space.

A daily cycle adds items (``genrec data append``) to a catalogue whose content vectors -- and the SID
codebooks quantised from them -- must stay as they are: rebuilding the features would move every item's vector
(a new TF-IDF vocabulary, a new SVD basis), and the frozen codebooks and the trained item tower would read the
old items wrongly. So the content encoder is fitted again on exactly the items the features hold, with the
parameters their manifest recorded (content spec, dimension, seed), and that refit is checked: it must give back
the stored vectors (to ``tolerance``) -- else the features were built from other text or settings, and nothing
is returned. The new items are then encoded by the refitted encoder (:func:`genrec.features.content.content_encoder`:
TF-IDF rows under the same vocabulary folded into the same LSA basis; a sentence encoder as it is, through the
same projection). Their engagement is unknown (nobody engaged with them when the features were built):
``genrec sid assign`` codes them and adds them to the catalogue with an engagement block imputed from their
content neighbours (:func:`genrec.catalog.load_catalog`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genrec.errors import DataError
from genrec.features.content import content_encoder
from genrec.features.store import ItemVectors

__all__ = ["featured_rows", "new_item_content"]

TOLERANCE = 1e-4
"""Largest difference allowed between a refitted content vector and the stored one (float32 round-off)."""


def featured_rows(items: pa.Table, featured_ids: np.ndarray) -> pa.Table | int:
    """The rows of ``items`` of the ``featured_ids``, in that order; or the first id ``items`` lacks."""
    featured_ids = np.asarray(featured_ids, dtype=np.int64)
    ids = items.column("item_id").to_numpy().astype(np.int64)
    order = np.argsort(ids, kind="stable")
    pos = np.searchsorted(ids[order], featured_ids)
    found = (pos < len(ids)) & (ids[order][np.minimum(pos, max(len(ids) - 1, 0))] == featured_ids) if len(ids) \
        else np.zeros(len(featured_ids), bool)
    if not found.all():
        return int(featured_ids[~found][0])
    return items.take(pa.array(order[pos]))


def new_item_content(features_dir: str | Path, items: pa.Table, *, exclude: np.ndarray | None = None,
                     tolerance: float = TOLERANCE) -> tuple[np.ndarray, np.ndarray]:
    """``(item_ids int64 [m], content f32 [m, dc])`` of the rows of ``items`` (the items table) that the item
    features in ``features_dir`` do not hold and ``exclude`` does not list (e.g. items a SID version already
    codes), in ``items``' order; ``m`` may be 0. Raises :class:`DataError` when the features' encoder cannot be
    refitted to their stored vectors (the module docstring)."""
    vecs = ItemVectors.load(features_dir)
    params = vecs.meta.get("params") or {}
    spec = str(params.get("content", "tfidf"))
    dim = params.get("content_dim")
    seed = int(params.get("seed", 0))
    featured_ids = np.asarray(vecs.item_ids, dtype=np.int64)
    featured = featured_rows(items, featured_ids)  # the features' items, in their order
    if isinstance(featured, int):
        raise DataError(f"item {featured} has item features but is not in the items table (the tables were "
                        f"prepared again since `genrec features build`?)", path=features_dir, field="item_id")
    refit, encode = content_encoder(featured, spec, dim=None if dim is None else int(dim), seed=seed)
    stored = np.asarray(vecs.content, dtype=np.float32)
    if refit.shape != stored.shape or float(np.max(np.abs(refit - stored), initial=0.0)) > tolerance:
        gap = "shape " + str(refit.shape) if refit.shape != stored.shape else \
            f"largest difference {float(np.max(np.abs(refit - stored))):.3g}"
        raise DataError(f"the content encoder refitted on the featured items ({spec}, dim {dim}, seed {seed}) does "
                        f"not give back their stored vectors ({gap} vs {stored.shape}): the item text changed since "
                        f"`genrec features build`, so new items cannot be placed in the same space. Give their "
                        f"vectors with `genrec sid assign --vectors`, or rebuild features, SIDs and the model",
                        path=Path(features_dir) / "content.npy", field="content")
    skip = featured_ids if exclude is None else np.union1d(featured_ids, np.asarray(exclude, dtype=np.int64))
    fresh = items.filter(pc.invert(pc.is_in(items.column("item_id"), value_set=pa.array(skip, pa.int64()))))
    if fresh.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros((0, stored.shape[1]), np.float32)
    out = np.asarray(encode(fresh), dtype=np.float32)
    return fresh.column("item_id").to_numpy().astype(np.int64), out
