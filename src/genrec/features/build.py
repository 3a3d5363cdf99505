"""Build a WorkDir's ``features/`` folder: content + engagement vectors for every item.

The two item vectors of PinGER's dense history token (content ‖ engagement; PinCLIP and
OmniSage there). Non-standard: engagement comes from count-based PPMI-SVD over the
TRAINING split only -- the caller passes ``train_events``; this module never reads splits
itself. The manifest fingerprints both inputs (sha256 over the id columns) so a later
stage can check it was built from the data it is given.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from genrec.features.content import catalogue_ids, content_vectors, parse_spec
from genrec.features.engagement import engagement_vectors
from genrec.features.store import ItemVectors
from genrec.features.text_quality import DegenerateTextWarning, features_warning, measure_text


def table_fingerprint(table: pa.Table, columns: Sequence[str]) -> str:
    """sha256 over the named columns' values (as int64/utf-8 bytes), in row order."""
    h = hashlib.sha256()
    for name in columns:
        col = table.column(name)
        h.update(name.encode())
        if pa.types.is_integer(col.type):
            h.update(np.ascontiguousarray(col.to_numpy().astype(np.int64)).tobytes())
        else:
            for v in col.to_pylist():
                h.update(str(v).encode() + b"\0")
    return h.hexdigest()


def build_features(items: pa.Table, train_events: pa.Table, out_dir: str | Path, *, content: str = "tfidf",
                   content_dim: int | None = 64, engagement_dim: int = 64, window: int | None = 5,
                   min_count: float = 1, smoothing: float = 1.0, actions: Sequence[str] | None = None,
                   seed: int = 0, inputs: dict[str, object] | None = None) -> ItemVectors:
    """Compute both vectors for ``items`` and save them to ``out_dir`` atomically.

    ``train_events`` must hold the training split only. ``content_dim`` is an upper bound
    (``None`` keeps an encoder's or a file's native width); ``inputs`` adds caller
    provenance (e.g. the tables' manifest path) to the manifest. The manifest's ``text_quality``
    says whether the item text is worth content vectors (:func:`genrec.features.text_quality.measure_text`);
    when it is degenerate (and the content comes from text) a :class:`DegenerateTextWarning` is issued.
    """
    kind, _ = parse_spec(content)  # fail on a bad spec before any work
    ids = catalogue_ids(items)  # [n]
    quality = {**measure_text(items), "content_from_text": kind != "file"}
    t0 = time.perf_counter()
    cvec = content_vectors(items, content, dim=content_dim, seed=seed)  # [n, dc]
    t1 = time.perf_counter()
    evec = engagement_vectors(train_events, ids, dim=engagement_dim, window=window, min_count=min_count,
                              smoothing=smoothing, actions=actions, seed=seed)  # [n, de]
    t2 = time.perf_counter()
    meta = {
        "inputs": {
            "items": {"rows": items.num_rows, "sha256": table_fingerprint(items, ["item_id", "text"])},
            "train_events": {"rows": train_events.num_rows,
                             "sha256": table_fingerprint(train_events, ["user_id", "item_id", "seq"])},
            **(inputs or {}),
        },
        "params": {"content": content, "content_dim": content_dim, "engagement_dim": engagement_dim,
                   "window": window, "min_count": min_count, "smoothing": smoothing,
                   "actions": list(actions) if actions is not None else None, "seed": seed},
        "seconds": {"content": round(t1 - t0, 3), "engagement": round(t2 - t1, 3)},
        "text_quality": quality,
    }
    vecs = ItemVectors(item_ids=ids, content=cvec, engagement=evec, meta=meta)
    vecs.save(out_dir)
    msg = features_warning(quality)
    if msg is not None:
        warnings.warn(msg, DegenerateTextWarning, stacklevel=2)
    return vecs
