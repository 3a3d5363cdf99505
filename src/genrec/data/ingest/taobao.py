"""Taobao UserBehavior (Tianchi): ``user,item,category,behavior,timestamp``, no header.

Actions ["pv", "cart", "fav", "buy"] (bit order), all positive; one surface, "taobao".
There is no items file: the items table is synthesised from the events (policy: every item
seen gets a row; ``attributes = {"category_id": c}``, plus ``"category_ids"`` if the log gives
one item several categories, where ``c`` is the most frequent, ties -> smallest). The
official file has a few out-of-window timestamps; they are kept as found (filter downstream).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genrec.data.ingest.build import build_dataset
from genrec.data.ingest.common import Column, file_record, int_col, read_delimited
from genrec.data.ingest.options import IngestOptions
from genrec.data.schema import ITEMS_SCHEMA, Dataset, DatasetInfo
from genrec.errors import MissingDataError

ACTIONS = ["pv", "cart", "fav", "buy"]
SURFACE = "taobao"
FILES = ("UserBehavior.csv", "UserBehavior_head.csv")


def find_file(folder: Path) -> Path:
    for f in FILES:
        if (folder / f).is_file():
            return folder / f
    hits = sorted(folder.glob("UserBehavior*.csv")) if folder.is_dir() else []
    if hits:
        return hits[0]
    raise MissingDataError(
        f"taobao: none of {list(FILES)} found in {folder}. Download UserBehavior.csv from Alibaba Tianchi "
        f"(https://tianchi.aliyun.com/dataset/649; needs a Tianchi login, so genrec cannot fetch it) and put it "
        f"at {folder / FILES[0]}."
    )


def items_from_events(item: np.ndarray, category: np.ndarray) -> pa.Table:
    """One synthesised row per distinct item, built with Arrow string kernels. ``item``, ``category``: [N]."""
    order = np.lexsort((category, item))  # [N] by (item, category)
    it, cat = item[order], category[order]
    new_pair = np.ones(len(it), dtype=bool)
    new_pair[1:] = (it[1:] != it[:-1]) | (cat[1:] != cat[:-1])
    p_start = np.flatnonzero(new_pair)  # [P] distinct (item, category) pairs
    p_item, p_cat = it[p_start], cat[p_start]
    p_count = np.diff(np.append(p_start, len(it)))  # [P] events per pair
    new_item = np.ones(len(p_item), dtype=bool)
    new_item[1:] = p_item[1:] != p_item[:-1]
    first = np.flatnonzero(new_item)  # [I] first pair of each item
    n_cats = np.diff(np.append(first, len(p_item)))  # [I]
    # most frequent category per item; ties -> smallest id (pairs are sorted by category)
    by_count = np.lexsort((p_cat, -p_count, np.repeat(np.arange(len(first)), n_cats)))
    best = p_cat[by_count[first]]  # [I]
    ids = p_item[first]  # [I]
    id_s = pc.cast(pa.array(ids), pa.string())
    cat_s = pc.cast(pa.array(best), pa.string())
    text = pc.binary_join_element_wise("Taobao item ", id_s, ". Category ", cat_s, "")
    attrs = pc.binary_join_element_wise('{"category_id": ', cat_s, "}", "")
    multi = np.flatnonzero(n_cats > 1)
    if len(multi):  # rare: spell out every category in Python
        attr_list = attrs.to_pylist()
        for k in multi.tolist():
            cats = [int(c) for c in p_cat[first[k]: first[k] + n_cats[k]]]
            attr_list[k] = json.dumps({"category_id": int(best[k]), "category_ids": cats}, sort_keys=True)
        attrs = pa.array(attr_list, pa.string())
    return pa.Table.from_arrays([pa.array(ids), pa.nulls(len(ids), pa.string()), text, attrs],
                                schema=ITEMS_SCHEMA)


def ingest_taobao(name: str, folder: Path, options: IngestOptions) -> Dataset:
    """Ingest ``UserBehavior.csv`` (or the ``_head`` sample) from ``folder`` (or a path to the CSV)."""
    folder = Path(folder)
    path = folder if folder.is_file() else find_file(folder)
    cols = [
        int_col("user_id"),
        int_col("item_id"),
        int_col("category_id"),
        Column("behavior_type", "str", lambda a: np.isin(a, ACTIONS), f"one of {ACTIONS}"),
        Column("timestamp", "int"),
    ]
    parsed = read_delimited(path, cols, delimiter=",", header=False, quoted=False)
    beh = parsed["behavior_type"]  # DictionaryArray
    vocab = beh.dictionary.to_pylist()
    remap = np.asarray([ACTIONS.index(v) for v in vocab], dtype=np.int8)
    action_idx = remap[beh.indices.to_numpy()]
    items = items_from_events(parsed["item_id"], parsed["category_id"])
    info = DatasetInfo(
        name=name,
        actions=list(ACTIONS),
        positive_actions=list(ACTIONS),
        surfaces=[SURFACE],
        feedview_rule="",
        action_rule="behavior_type as logged: pv = page view/click, cart = add to cart, fav = favourite, buy = "
                    "purchase; all four are positive engagement.",
        has_timestamps=True,
        extra={"items": "synthesised from events (category_id only); no titles"},
    )
    return build_dataset(
        info,
        user=parsed["user_id"],
        item=parsed["item_id"],
        timestamp=parsed["timestamp"],
        action_idx=action_idx,
        surface_idx=None,
        items=items,
        source={"dataset": name, "folder": str(path.parent), "files": [file_record(path, checksum=options.checksum)]},
        slate_size=options.slate_size,
    )
