"""The item catalogue: what training, inference, evaluation and serving share about a run's items.

:class:`ItemCatalog` holds every per-item tensor the model reads, aligned by row (ids, features, SID
codes, titles); :func:`load_catalog` builds it from a run directory's item features and current SID
version; :func:`open_store` opens the run's tables (defined beside :class:`genrec.data.store.TableStore`,
which ``genrec.data`` itself needs, and exported here with the rest).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from genrec.data.store import TableStore, catalog_config, open_store
from genrec.errors import ConfigError, DataError
from genrec.features.build import table_fingerprint
from genrec.features.extend import featured_rows
from genrec.features.store import ItemVectors
from genrec.sid.build import ADDED_CONTENT, added_items, open_current
from genrec.sid.source import new_item_engagement
from genrec.workdir import WorkDir

__all__ = ["COLD_ENGAGEMENT_SCALE", "ItemCatalog", "load_catalog", "open_store"]

COLD_ENGAGEMENT_SCALE = 0.7
"""Length of the imputed engagement block an item `genrec sid assign` added gets in the served catalogue
(:func:`load_catalog`; 0 = the all-zero block). Every engaged item's block has length 1. Chosen on the cold-start
protocol's validation cases (docs/RESULTS.md, C1); the SIDs quantise the unit-length block whatever this is."""


@dataclass
class ItemCatalog:
    """Everything per item the model reads, aligned by row: ids, features, SID codes."""

    item_ids: np.ndarray  # int64 [N], sorted ascending
    feats: torch.Tensor  # float32 [N, F]: [content ‖ engagement]
    codes: torch.Tensor | None  # int64 [N, L] SID codes (None for dense-only models)
    titles: list[str | None] | None = None
    n_engagement: int = 0  # the last n_engagement feature columns are the engagement vector
    # bool [N]: the items `genrec sid assign` added (not in the item features; their engagement block imputed);
    # None: none
    added: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not np.all(self.item_ids[1:] > self.item_ids[:-1]):
            order = np.argsort(self.item_ids)
            self.item_ids = self.item_ids[order]
            t = torch.from_numpy(order)
            self.feats = self.feats[t]
            self.codes = None if self.codes is None else self.codes[t]
            if self.titles is not None:
                self.titles = [self.titles[i] for i in order]
            if self.added is not None:
                self.added = self.added[order]

    def __len__(self) -> int:
        return len(self.item_ids)

    def rows(self, ids: np.ndarray, *, strict: bool = True) -> np.ndarray:
        """Row of each item id; unknown ids raise (strict) or map to -1. Ids that are small non-negative integers
        (the tables' remapped ids: at most ``4 N + 2^22``) are looked up in a dense table built once (4 us for a
        1,000-item history, where the binary search took 70: every served request parses one); others by
        :meth:`rows_by_search`, the twin it is tested against."""
        ids = np.asarray(ids, dtype=np.int64)
        table = self._dense_rows()
        if table is None or not len(ids):
            return self.rows_by_search(ids, strict=strict)
        if int(ids.min()) >= 0 and int(ids.max()) < len(table):
            r = table[ids].astype(np.int64)
        else:
            inside = (ids >= 0) & (ids < len(table))
            r = np.where(inside, table[np.where(inside, ids, 0)], -1).astype(np.int64)
        if strict and (r < 0).any():
            raise DataError(f"unknown item id {int(ids[r < 0][0])} (not in the item catalogue)", field="item_id")
        return r

    def rows_by_search(self, ids: np.ndarray, *, strict: bool = True) -> np.ndarray:
        """:meth:`rows` by binary search over the sorted ids (any int64 ids)."""
        ids = np.asarray(ids, dtype=np.int64)
        r = np.searchsorted(self.item_ids, ids)
        r = np.clip(r, 0, len(self.item_ids) - 1)
        ok = self.item_ids[r] == ids if len(self.item_ids) else np.zeros(len(ids), bool)
        if strict and not ok.all():
            raise DataError(f"unknown item id {int(ids[~ok][0])} (not in the item catalogue)", field="item_id")
        return np.where(ok, r, -1)

    def _dense_rows(self) -> np.ndarray | None:
        """int32 ``[max id + 1]``: each id's row, -1 for an id not in the catalogue; None where the ids are not small
        non-negative integers. Built on first use for these ``item_ids`` (a catalogue is not changed in place)."""
        ids = self.item_ids
        cached = self.__dict__.get("_dense")
        if cached is not None and cached[0] is ids:
            return cached[1]
        table = None
        n = len(ids)
        if n and n < 2**31 and int(ids[0]) >= 0 and int(ids[-1]) < 4 * n + 2**22:
            table = np.full(int(ids[-1]) + 1, -1, dtype=np.int32)
            table[ids] = np.arange(n, dtype=np.int32)
        self.__dict__["_dense"] = (ids, table)
        return table


def load_catalog(workdir: str | Path, *, with_sids: bool = True,
                 cold_engagement_scale: float = COLD_ENGAGEMENT_SCALE) -> ItemCatalog:
    """The per-item tensors the model reads: features, SID codes (current version) and titles.

    With SIDs, the items ``genrec sid assign`` added in the current version (not in the item features; ``added``
    marks them) join the featured ones with their content vectors and an engagement block imputed from the
    featured items with engagement nearest by content (:func:`genrec.sid.source.new_item_engagement`: the block
    their collaborative SIDs quantise), times ``cold_engagement_scale``. Nobody engaged with them yet, but an
    all-zero block would make them look like the rare items nobody engaged with at training time, far from every
    user in the ANN index."""
    if not (np.isfinite(cold_engagement_scale) and cold_engagement_scale >= 0):
        raise ConfigError(f"cold_engagement_scale must be a finite number >= 0, got {cold_engagement_scale!r}")
    wd = WorkDir(workdir)
    vecs = ItemVectors.load(wd.features, mmap=False)
    ids = np.asarray(vecs.item_ids, dtype=np.int64)
    feat_np = np.ascontiguousarray(vecs.concat(), dtype=np.float32)
    codes = None
    added = None
    if with_sids:
        sb = open_current(wd.sid)
        extra = added_items(sb.path)
        if extra is not None:
            keep = ~np.isin(extra[0], ids)
            a_ids, a_content = extra[0][keep], extra[1][keep]
            dc = int(np.asarray(vecs.content).shape[1])
            if a_content.shape[1] != dc:
                raise DataError(f"the items `sid assign` added have content vectors of dimension "
                                f"{a_content.shape[1]}, the item features {dc}", path=sb.path / ADDED_CONTENT)
            engagement = np.asarray(vecs.engagement, dtype=np.float32)
            known = np.any(engagement != 0, axis=1)
            a_eng = np.zeros((len(a_ids), engagement.shape[1]), np.float32)
            if len(a_ids) and engagement.shape[1] and known.any():
                a_eng = np.float32(cold_engagement_scale) * new_item_engagement(
                    a_content, np.asarray(vecs.content)[known], engagement[known])
            added = np.r_[np.zeros(len(ids), bool), np.ones(len(a_ids), bool)]
            ids = np.concatenate([ids, a_ids])
            feat_np = np.concatenate([feat_np, np.concatenate([a_content, a_eng], axis=1)])
        rows = sb.index.codes_of(ids)  # [N, L] in catalogue order
        codes = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    feats = torch.from_numpy(feat_np)
    titles = None
    store = TableStore(wd.tables, catalog_config())
    if store.exists():
        items = store.read_items()
        built_from = vecs.meta.get("inputs", {}).get("items", {}).get("sha256")
        if built_from is not None:
            # the features' items as they were built from: the whole table, or -- after `genrec data append` added
            # items -- the featured rows of it, unchanged (an append keeps a known item's stored row)
            featured = featured_rows(items, np.asarray(vecs.item_ids))
            same = table_fingerprint(items, ["item_id", "text"]) == built_from or (
                not isinstance(featured, int) and table_fingerprint(featured, ["item_id", "text"]) == built_from)
            if not same:  # the data was prepared again since
                raise ConfigError(f"{wd.features}: the item features were built from other item tables than "
                                  f"those now in {wd.tables} (the data was prepared again since): run `genrec "
                                  f"features build`, `genrec sid build` and `genrec train` for {wd.root} again")
        # an item without a title (Taobao has none; generic files may lack the column) shows its text,
        # the description its content vector was built from, rather than nothing
        t = {i: title if title else (text[:80] + "..." if len(text) > 80 else text) or None
             for i, title, text in zip(items.column("item_id").to_pylist(), items.column("title").to_pylist(),
                                       items.column("text").to_pylist())}
        titles = [t.get(int(i)) for i in ids]
    return ItemCatalog(item_ids=ids, feats=feats, codes=codes, titles=titles,
                       n_engagement=int(np.asarray(vecs.engagement).shape[1]), added=added)
