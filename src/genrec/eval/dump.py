"""``genrec eval --dump-recs FILE``: every scored user's ranked top-K per path, checkable from outside.

One JSON-lines file per retrieval path, named by putting the path before FILE's extension
(``recs.jsonl`` -> ``recs.sid.jsonl``, ``recs.ann.jsonl``, ``recs.l0l1.jsonl``,
``recs.popularity.jsonl``), one line per evaluated case: ``{"user": <id>, "items": [<ids>]}``, in
the form ``/work/shared/yardstick/score.py`` reads (it takes one path per file, and counts a user
missing from the file as a miss). The ids are the source data's own: the tables' ids, or with
``map_ids`` data the original ids they were numbered from. The lists are exactly the ones the
report's metrics were computed on (the target at its metric rank; ANN ties ordered against the
target, as the metric counts them), so scoring a file against the split's targets reproduces the
report's Recall/NDCG@K. Slots a path could not fill (fewer beams than K) are left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from genrec.infer.cases import SourceIds
from genrec.workdir import atomic_write_bytes


def recs_file(base: str | Path, path: str) -> Path:
    """The file of one path: ``recs.jsonl`` -> ``recs.<path>.jsonl`` (no extension: ``recs.<path>``)."""
    base = Path(base)
    return base.with_name(f"{base.stem}.{path}{base.suffix}") if base.suffix else base.with_name(f"{base.name}.{path}")


def recs_lines(users: Sequence[Any], lists: np.ndarray, item_ids: np.ndarray,
               item_original: Mapping[int, Any] | None = None) -> bytes:
    """JSON lines ``{"user", "items"}``: ``lists`` int [C, K] catalogue rows (-1 = empty slot, left out),
    mapped to ids through ``item_ids`` (the catalogue's id per row) and then ``item_original``."""
    ids = np.asarray(item_ids, dtype=np.int64)
    out = []
    for u, row in zip(users, np.asarray(lists)):
        items = [int(i) for i in ids[row[row >= 0]]]
        if item_original is not None:
            items = [item_original.get(i, i) for i in items]
        out.append(json.dumps({"user": u, "items": items}, ensure_ascii=False))
    return ("\n".join(out) + "\n").encode() if out else b""


def gapped_cases(lists: np.ndarray) -> int:
    """Cases whose list has an empty slot (-1) before a filled one: their written list (empty slots left
    out) ranks later items higher than the metric did. 0 for every path ``genrec eval`` reports in practice
    (unfilled beams come last), and counted so a report would say otherwise."""
    a = np.asarray(lists)
    return int(((a[:, :-1] < 0) & (a[:, 1:] >= 0)).any(axis=1).sum()) if a.ndim == 2 and a.shape[1] > 1 else 0


def write_recs(base: str | Path, lists: Mapping[str, np.ndarray], user_ids: Sequence[int], item_ids: np.ndarray,
               workdir: str | Path) -> dict[str, str]:
    """Write one file per path (:func:`recs_file`) atomically; returns {path: file}. ``user_ids``: the
    tables' id of each case, in the order of ``lists``' rows; WORKDIR says whether ids were remapped."""
    src = SourceIds.of(workdir)
    users: list[Any] = [int(u) for u in user_ids]
    item_original: dict[int, Any] | None = None
    if src is not None:
        back = {i: orig for orig, i in src.users.items()}
        users = [back.get(u, u) for u in users]
        item_original = src.item_original
    files: dict[str, str] = {}
    for name, rows in lists.items():
        f = recs_file(base, name)
        atomic_write_bytes(f, recs_lines(users, rows, item_ids, item_original))
        files[name] = str(f)
    return files
