"""Amazon reviews in the P5 / S3-Rec form (``sequential_data.txt``): Beauty 2014 and other categories.

Non-standard: there are no timestamps. Each line ``user item item ...`` is already in
review-time order, so ``timestamp = seq`` (position in the line) and
``DatasetInfo.has_timestamps = False``. One action, "review" (positive); one surface, "amazon".

Items: ``item_text.jsonl.gz`` (title, categories, brand) with ASINs from ``datamaps.json.gz``
(``id2item``) kept in ``attributes["asin"]``. ``item2attributes.json`` is ignored (its names do
not match its ids, see the dataset's PROVENANCE.md). HTML entities (``&amp;``, ``&#39;``) are
**unescaped** in ``title``, ``text`` and the category/brand attributes; the verbatim title is
kept as ``attributes["title_raw"]`` where it differs. A row's optional ``text`` string is the
item text verbatim (what content encoders read) instead of the one built from title, brand and
categories -- ``genrec data export-p5`` (:mod:`genrec.data.p5`) writes genrec's own item text
there, so a dataset exported to P5 form and ingested back has the same content. Item policy:
an item in the sequences without a text row gets a synthesised minimal row
(``attributes["synthesised"] = true``).
"""

from __future__ import annotations

import gzip
import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from genrec.data.ingest.build import ItemRows, build_dataset, check_unique_ids
from genrec.data.ingest.common import file_record, iter_lines
from genrec.data.ingest.options import IngestOptions
from genrec.data.schema import Dataset, DatasetInfo
from genrec.errors import DataError, MissingDataError

SURFACE = "amazon"
SEQUENCES = "sequential_data.txt"
DATAMAPS = "datamaps.json.gz"
ITEM_TEXT = "item_text.jsonl.gz"


def _read_text(path: Path) -> str:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8: {e.reason}", path=path, line=raw[: e.start].count(b"\n") + 1) from None


def read_sequences(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``user item item ...`` per line -> (user, item, position) arrays, each [N], in file order."""
    users: list[int] = []
    items: list[int] = []
    counts: list[int] = []
    seen: dict[int, int] = {}
    text = _read_text(path)
    for line, s in iter_lines(text):
        tok = s.split()
        for k, t in enumerate(tok):
            if not t.isdigit():
                fld = "user_id" if k == 0 else f"item_id (position {k})"
                raise DataError(f"not an integer: {t!r}", path=path, line=line, field=fld)
        u = int(tok[0])
        if u in seen:
            raise DataError(f"user {u} already has a sequence on line {seen[u]}", path=path, line=line,
                            field="user_id")
        seen[u] = line
        if len(tok) < 2:
            raise DataError("a user line needs at least one item", path=path, line=line, field="item_id")
        users.append(u)
        counts.append(len(tok) - 1)
        items.extend(int(t) for t in tok[1:])
    if not users:
        raise DataError("file is empty: expected lines 'user item item ...'", path=path, line=1, field="user_id")
    c = np.asarray(counts, dtype=np.int64)
    user = np.repeat(np.asarray(users, dtype=np.int64), c)  # [N]
    starts = np.repeat(np.cumsum(c) - c, c)  # [N]
    pos = np.arange(int(c.sum()), dtype=np.int64) - starts  # [N]
    return user, np.asarray(items, dtype=np.int64), pos


def read_id2item(path: Path) -> dict[int, str]:
    try:
        d = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise DataError(f"invalid JSON: {e.msg}", path=path, line=e.lineno) from None
    if not isinstance(d, dict) or "id2item" not in d:
        raise DataError("expected a JSON object with key 'id2item'", path=path, line=1, field="id2item")
    out = {}
    for k, v in d["id2item"].items():
        if not str(k).isdigit():
            raise DataError(f"id2item key is not an integer: {k!r}", path=path, line=1, field="id2item")
        out[int(k)] = str(v)
    return out


def _unescape(x: Any) -> Any:
    if isinstance(x, str):
        return html.unescape(x)
    if isinstance(x, list):
        return [_unescape(v) for v in x]
    return x


def amazon_text(title: str | None, brand: str | None, categories: list[list[str]], asin: str | None,
                item_id: int) -> str:
    """"<title>. Brand: <brand>. Categories: Beauty > Makeup > Nails" (placeholders when absent)."""
    parts = [title or f"Amazon item {asin or item_id}"]
    if brand:
        parts.append(f"Brand: {brand}")
    if categories:
        parts.append("Categories: " + "; ".join(" > ".join(p) for p in categories))
    return ". ".join(parts)


def read_item_text(path: Path, id2item: dict[int, str]) -> ItemRows:
    rows, ids, lines = ItemRows.empty(), [], []
    for line, s in iter_lines(_read_text(path)):
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as e:
            raise DataError(f"invalid JSON: {e.msg}", path=path, line=line) from None
        if not isinstance(obj, dict):
            raise DataError("expected a JSON object", path=path, line=line)
        iid = obj.get("item_id")
        if not isinstance(iid, int) or isinstance(iid, bool) or iid < 0:
            raise DataError(f"not a non-negative integer: {iid!r}", path=path, line=line, field="item_id")
        asin = obj.get("asin")
        if id2item and iid in id2item and asin is not None and asin != id2item[iid]:
            raise DataError(f"asin {asin!r} disagrees with datamaps id2item[{iid}] = {id2item[iid]!r}", path=path,
                            line=line, field="asin")
        asin = asin if asin is not None else id2item.get(iid)
        cats = obj.get("categories") or []
        if not (isinstance(cats, list) and all(isinstance(p, list) for p in cats)):
            raise DataError("expected a list of category paths (list of lists of strings)", path=path, line=line,
                            field="categories")
        raw_title = obj.get("title")
        title = _unescape(raw_title) if raw_title is not None else None
        brand = _unescape(obj.get("brand"))
        cats = _unescape(cats)
        text = obj.get("text")
        if text is not None and not (isinstance(text, str) and text.strip()):
            raise DataError(f"expected a non-empty string, got {text!r}", path=path, line=line, field="text")
        attrs: dict[str, Any] = {"asin": asin, "categories": cats}
        if brand is not None:
            attrs["brand"] = brand
        if raw_title is not None and raw_title != title:
            attrs["title_raw"] = raw_title
        rows.add(iid, title, text if text is not None else amazon_text(title, brand, cats, asin, iid), attrs)
        ids.append(iid)
        lines.append(line)
    check_unique_ids(ids, lines, path=path, field="item_id")
    return rows


def ingest_amazon_p5(name: str, folder: Path, options: IngestOptions) -> Dataset:
    """Ingest a P5-form Amazon category from ``folder`` (``sequential_data.txt`` [+ datamaps, item text])."""
    folder = Path(folder)
    seq_path = folder / SEQUENCES
    if not seq_path.is_file():
        raise MissingDataError(
            f"{name}: {SEQUENCES} not found in {folder}. Put the P5/S3-Rec file there ({seq_path}: one line per "
            f"user, 'user item item ...', time-ordered), optionally with {DATAMAPS} and {ITEM_TEXT}."
        )
    files = [file_record(seq_path, checksum=options.checksum)]
    user, item, pos = read_sequences(seq_path)
    id2item: dict[int, str] = {}
    if (folder / DATAMAPS).is_file():
        id2item = read_id2item(folder / DATAMAPS)
        files.append(file_record(folder / DATAMAPS, checksum=options.checksum))
    items = ItemRows.empty()
    if (folder / ITEM_TEXT).is_file():
        items = read_item_text(folder / ITEM_TEXT, id2item)
        files.append(file_record(folder / ITEM_TEXT, checksum=options.checksum))

    def synthesise(i: int) -> tuple[str | None, str, dict[str, Any]]:
        asin = id2item.get(i)
        return None, amazon_text(None, None, [], asin, i), {"asin": asin, "categories": [], "synthesised": True}

    info = DatasetInfo(
        name=name,
        actions=["review"],
        positive_actions=["review"],
        surfaces=[SURFACE],
        feedview_rule="",
        action_rule="Every (user, item) pair in sequential_data.txt is one 'review' (5-core reviews; no ratings).",
        has_timestamps=False,
        extra={"timestamp": "timestamp = position in the user's line (order is review time; no real time)",
               "html_entities": "unescaped in title/text/attributes; verbatim title in attributes.title_raw",
               "category": folder.name},
    )
    return build_dataset(
        info,
        user=user,
        item=item,
        timestamp=pos,
        action_idx=np.zeros(len(user), dtype=np.int8),
        surface_idx=None,
        items=items,
        source={"dataset": name, "folder": str(folder), "files": files},
        slate_size=options.slate_size,
        synthesise=synthesise,
    )
