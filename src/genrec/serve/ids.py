"""The service's item ids for a run whose ids were remapped (``genrec data prepare generic`` with string ids, or
``--map-ids``): the tables number items 0..n-1 and keep the source file's id in ``items.attributes.original_id``
(:class:`genrec.infer.cases.SourceIds`). Clients speak the source file's ids; :class:`SourceItemIds` translates
them ONCE, at the service's boundary: a request's history and candidates into the tables' ids on the way in
(a dict lookup per id), every item id of the answer back on the way out (one vectorised take).

An id the catalogue lacks gets a placeholder for the request: a negative id, never a table id (the remapped
ids are 0..n-1), so the engine drops and reports it as any unknown id, and the answer names it by the text
the client sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from genrec.infer.cases import SourceIds
from genrec.infer.history import HistoryColumns

__all__ = ["SourceItemIds", "Unknown"]


class Unknown:
    """One request's ids that are not in the catalogue: text -> placeholder id (-1, -2, ...) and back."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.text: list[str] = []

    def placeholder(self, text: str) -> int:
        got = self.ids.get(text)
        if got is None:
            self.text.append(text)
            got = self.ids[text] = -len(self.text)
        return got


class SourceItemIds:
    """Source-file item ids <-> the tables' ids of one served catalogue."""

    def __init__(self, to_table: Mapping[str, int], original: np.ndarray) -> None:
        self.to_table = dict(to_table)  # source id (text) -> table id
        self.original = original  # object [max table id + 1]: table id -> source id (None: none)

    @classmethod
    def of(cls, workdir: str | Path, catalog_ids: np.ndarray) -> "SourceItemIds | None":
        """The ids of WORKDIR's tables, or None when they were not remapped. A catalogue item (``catalog_ids``,
        the tables' ids) without a source id -- one added later by its table id, e.g. ``genrec sid assign`` --
        is named ``#<table id>``, both ways."""
        src = SourceIds.of(workdir)
        if src is None:
            return None
        ids = np.asarray(catalog_ids, dtype=np.int64)
        size = int(max([*src.item_original, *ids.tolist(), -1])) + 1
        original = np.full(size, None, dtype=object)
        for tid, orig in src.item_original.items():
            original[tid] = str(orig)
        to_table = {str(k): int(v) for k, v in src.items.items()}
        for tid in ids[ids >= 0].tolist():
            if original[tid] is None:
                original[tid] = f"#{tid}"
                to_table.setdefault(f"#{tid}", tid)
        return cls(to_table, original)

    # ------------------------------------------------------------------ in
    def history_in(self, history: Sequence[Mapping[str, Any]], unknown: Unknown) -> Sequence[Mapping[str, Any]]:
        """The history with each ``item_id`` (source id, text) replaced by the tables' id (unknown: a placeholder)."""
        if isinstance(history, HistoryColumns):
            return history.with_ids(self.ids_in(history.item_id, unknown))
        tt = self.to_table
        out = []
        for h in history:
            iid = h["item_id"]
            tid = tt.get(iid)
            d = dict(h)
            d["item_id"] = unknown.placeholder(iid) if tid is None else tid
            out.append(d)
        return out

    def ids_in(self, ids: Sequence[str], unknown: Unknown) -> list[int]:
        """Source ids (text) -> the tables' ids (unknown: placeholders)."""
        tt = self.to_table
        return [t if (t := tt.get(i)) is not None else unknown.placeholder(i) for i in ids]

    # ------------------------------------------------------------------ out
    def ids_out(self, ids: Sequence[int], unknown: Unknown) -> list[str]:
        """The tables' ids (or this request's placeholders) -> source ids, vectorised."""
        a = np.asarray(ids, dtype=np.int64)
        if len(a) == 0:
            return []
        known = a >= 0
        out = np.empty(len(a), dtype=object)
        out[known] = self.original[a[known]]
        out[~known] = [unknown.text[-int(x) - 1] for x in a[~known]]
        return out.tolist()

    def answer_out(self, out: dict[str, Any], unknown: Unknown) -> dict[str, Any]:
        """An engine's answer (``items[].item_id``, ``dropped_items``, ``unknown_candidates``) in source ids, in place."""
        items = out["items"]
        for it, orig in zip(items, self.ids_out([it["item_id"] for it in items], unknown)):
            it["item_id"] = orig
        for key in ("dropped_items", "unknown_candidates"):
            if key in out:
                out[key] = self.ids_out(out[key], unknown)
        return out
