"""Export any dataset genrec can ingest as a P5-form directory (``genrec data export-p5``).

P5 form is what the plain SASRec yardstick (``sasrec.py``) and genrec's own ``amazon-p5``
ingest read: ``sequential_data.txt``, one line ``user item item ...`` per user in
interaction order, leave-one-out (last item = test target, second-last = validation
target). Writing MovieLens (or anything else) in this form lets genrec and the yardstick
see exactly the same sequences and the same split:

    genrec data export-p5 movielens-100k OUT       # this module
    python sasrec.py OUT                            # the yardstick
    genrec data prepare amazon-p5 RUN --source OUT  # genrec, same sequences

Rules (also written into ``OUT/README.txt``):

* **Interactions** -- every row of genrec's canonical events table counts, whatever its
  action (MovieLens: every rated movie, whatever the rating; Taobao: pv/cart/fav/buy alike);
  repeated (user, item) events are kept.
* **Order** -- genrec's own ingest order, the ``seq`` column: by timestamp, ties by the
  event's position in the source file (a stable sort, :func:`genrec.data.ingest.build.order_events`).
  Ties are *not* broken by item id. This is the order genrec's ``loo`` split
  (:mod:`genrec.data.splits`) takes its targets from, so the P5 targets equal the targets
  of genrec's direct ingest of the source dataset.
* **Users** -- those with at least ``min_events`` interactions (default 3: leave-one-out
  needs a train item, a validation and a test target; genrec's ``loo`` gives shorter
  histories no eval case while ``sasrec.py`` would), numbered 1..U in ascending source
  user id; line ``k`` is user ``k``.
* **Items** -- those in at least one kept interaction (an item nobody interacted with is
  not in the catalogue: ``sasrec.py`` ranks ids 1..max), numbered 1..I in ascending source
  item id.

Metadata, in the files ``amazon-p5`` reads: ``datamaps.json.gz`` (P5's user2id / id2user /
item2id / id2item, source id <-> P5 id, both as strings; the ingest keeps the source item
id as ``attributes["asin"]``) and ``item_text.jsonl.gz`` (title, genres as one-element
category paths, genrec's item ``text`` verbatim, the source attributes).
"""

from __future__ import annotations

import gzip
import json
import textwrap
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from genrec._version import __version__
from genrec.data.ingest import REGISTRY, prepare_dataset
from genrec.data.ingest.amazon import DATAMAPS, ITEM_TEXT, SEQUENCES
from genrec.data.ingest.options import IngestOptions
from genrec.data.schema import Dataset
from genrec.data.store import open_store
from genrec.errors import ConfigError, DataError
from genrec.workdir import atomic_write_bytes

README = "README.txt"
FILES = (SEQUENCES, DATAMAPS, ITEM_TEXT, README)

ORDER_RULE = ("by timestamp; ties by the event's position in the source file (genrec's ingest order, the events "
              "table's `seq`: a stable sort by (user, timestamp)); ties are NOT broken by item id")


@dataclass(frozen=True)
class P5Export:
    """What :func:`export_p5` wrote."""

    folder: str
    dataset: str
    users: int
    items: int
    interactions: int
    dropped_users: int
    """Users with fewer than ``min_events`` interactions (left out)."""
    dropped_interactions: int
    min_events: int
    users_with_tied_targets: int
    """Users whose validation or test target shares its timestamp with the event before it (the tie rule decides)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)  # mtime 0: same input, same bytes


def _categories(attrs: dict[str, Any]) -> list[list[str]]:
    """Category paths for item_text.jsonl.gz: Amazon-style ``categories`` or one path per genre."""
    cats = attrs.get("categories")
    if isinstance(cats, list) and all(isinstance(p, list) and all(isinstance(c, str) for c in p) for p in cats):
        return [list(p) for p in cats]
    genres = attrs.get("genres")
    if isinstance(genres, list):
        return [[g] for g in genres if isinstance(g, str) and g]
    return []


def write_p5(ds: Dataset, outdir: str | Path, *, min_events: int = 3, overwrite: bool = False,
             made_by: str = "") -> P5Export:
    """Write ``ds`` (an ingested dataset) as a P5-form directory ``outdir``; see the module docstring."""
    if not isinstance(min_events, int) or min_events < 1:
        raise ConfigError(f"min_events (--min-events) must be a positive integer, got {min_events!r}")
    out = Path(outdir).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"OUTDIR {out} exists and is not a folder")
    there = [f for f in FILES if (out / f).exists()]
    if there and not overwrite:
        raise ConfigError(f"{out} already holds a P5 export ({', '.join(there)}); pass overwrite=True "
                          f"(CLI: --overwrite) to replace it")

    ev = ds.events
    user = ev.column("user_id").to_numpy().astype(np.int64)
    seq = ev.column("seq").to_numpy().astype(np.int64)
    order = np.lexsort((seq, user))  # [N]: per user, genrec's ingest order
    user = user[order]
    item = ev.column("item_id").to_numpy().astype(np.int64)[order]
    ts = ev.column("timestamp").to_numpy().astype(np.int64)[order]
    n = user.size
    if n == 0:
        raise DataError(f"{ds.info.name}: the dataset has no events to export")

    starts = np.flatnonzero(np.r_[True, user[1:] != user[:-1]])  # [U]
    counts = np.diff(np.r_[starts, n])  # [U]
    keep_user = counts >= min_events  # [U]
    if not keep_user.any():
        raise DataError(f"{ds.info.name}: no user has {min_events} or more interactions (--min-events)")
    keep = np.repeat(keep_user, counts)  # [N]
    u_src, i_src, t_kept = user[keep], item[keep], ts[keep]
    k_starts = np.flatnonzero(np.r_[True, u_src[1:] != u_src[:-1]])  # [U']
    k_counts = np.diff(np.r_[k_starts, u_src.size])
    users_src = u_src[k_starts]  # ascending (events sorted by user)
    items_src, i_new = np.unique(i_src, return_inverse=True)  # ascending source id -> 0..I-1
    i_new = i_new.reshape(-1) + 1  # P5 ids are 1-based

    # Ties that decide a target: the valid / test target has the same timestamp as the event before it.
    ends = k_starts + k_counts
    tied = (t_kept[ends - 1] == t_kept[ends - 2]) | (t_kept[ends - 2] == t_kept[np.maximum(ends - 3, k_starts)])
    tied &= k_counts >= 3

    lines = []
    for k, (s, c) in enumerate(zip(k_starts.tolist(), k_counts.tolist()), start=1):
        lines.append(f"{k} " + " ".join(map(str, i_new[s:s + c].tolist())) + "\n")

    # items: canonical rows of the kept items, in P5 id order
    tab = ds.items
    ids = tab.column("item_id").to_numpy().astype(np.int64)
    pos = {int(v): r for r, v in enumerate(ids.tolist())}
    titles, texts, attrs = (tab.column(c).to_pylist() for c in ("title", "text", "attributes"))
    item_lines = []
    for k, src in enumerate(items_src.tolist(), start=1):
        r = pos.get(int(src))
        if r is None:
            raise DataError(f"{ds.info.name}: item {src} has events but no row in the items table")
        a = json.loads(attrs[r]) if attrs[r] else {}
        row: dict[str, Any] = {"item_id": k, "source_item_id": int(src), "title": titles[r],
                               "categories": _categories(a), "text": texts[r], "source_attributes": a}
        if isinstance(a.get("brand"), str):
            row["brand"] = a["brand"]
        item_lines.append(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")

    u_ids = [str(int(x)) for x in users_src.tolist()]
    i_ids = [str(int(x)) for x in items_src.tolist()]
    datamaps = {
        "user2id": {s: str(k) for k, s in enumerate(u_ids, start=1)},
        "id2user": {str(k): s for k, s in enumerate(u_ids, start=1)},
        "item2id": {s: str(k) for k, s in enumerate(i_ids, start=1)},
        "id2item": {str(k): s for k, s in enumerate(i_ids, start=1)},
    }

    result = P5Export(
        folder=str(out.resolve()),
        dataset=ds.info.name,
        users=int(users_src.size),
        items=int(items_src.size),
        interactions=int(u_src.size),
        dropped_users=int((~keep_user).sum()),
        dropped_interactions=int(n - u_src.size),
        min_events=min_events,
        users_with_tied_targets=int(tied.sum()),
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / SEQUENCES, "".join(lines).encode("utf-8"))
    atomic_write_bytes(out / DATAMAPS, _gzip(json.dumps(datamaps, ensure_ascii=False).encode("utf-8")))
    atomic_write_bytes(out / ITEM_TEXT, _gzip("".join(item_lines).encode("utf-8")))
    atomic_write_bytes(out / README, readme(ds, result, made_by=made_by).encode("utf-8"))
    return result


def _fill(text: str, indent: int) -> str:
    return textwrap.fill(text, width=106, initial_indent=" " * indent, subsequent_indent=" " * (indent + 2))


def readme(ds: Dataset, r: P5Export, *, made_by: str = "") -> str:
    """The PROVENANCE-style README.txt of an export."""
    src = ds.source or {}
    files = "\n".join(
        f"    {f.get('path')}  {f.get('bytes')} bytes" + (f"  sha256 {f['sha256']}" if f.get("sha256") else "")
        for f in src.get("files", [])
    ) or "    (not recorded)"
    info = ds.info
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    dropped = (f"{r.dropped_users} users with fewer than {r.min_events} interactions were left out "
               f"({r.dropped_interactions} interactions)." if r.dropped_users else
               f"No user was left out (every user has >= {r.min_events} interactions).")
    return f"""P5-form export of genrec dataset '{info.name}'
=============================================

Made by genrec {__version__} on {when}{f' with: {made_by}' if made_by else ''}.
Source: genrec's ingest of '{info.name}' from {src.get('folder', '(unknown folder)')}; files read:
{files}
Licence: the source dataset's terms apply to this derived data. MovieLens: research use only, no
redistribution (including derived data) without GroupLens's permission -- keep it internal and never
commit it to a repository.

Counts: {r.users} users, {r.items} items, {r.interactions} interactions. {dropped}

Files
  sequential_data.txt  one line per user, `user_id item_1 item_2 ...` (space-separated integers, LF line
                       endings), items in interaction order. Line k is user k.
  datamaps.json.gz     P5 id maps, all ids as strings: user2id / id2user and item2id / id2item
                       (source id <-> P5 id). genrec's amazon-p5 ingest keeps the source item id in
                       attributes["asin"].
  item_text.jsonl.gz   one JSON object per item, ordered by item_id: item_id (P5), source_item_id, title,
                       categories (each genre as a one-element path), brand (when the source has one),
                       text (genrec's item text, which the amazon-p5 ingest uses verbatim), source_attributes.
  README.txt           this file.

Rules
  Interactions: every event of genrec's canonical events table counts as one interaction, whatever its
    action -- for MovieLens every rated movie, whatever the rating; repeated (user, item) events are kept.
{_fill('Source action rule: ' + (info.action_rule or '(none stated)'), 4)}
    genrec's amazon-p5 ingest reads every interaction back as one action, 'review' (positive).
{_fill('Order within a user: ' + ORDER_RULE + '.', 2)}
    Source timestamps: {'real times' if info.has_timestamps else 'none (timestamp = position in the source file)'}.
    {r.users_with_tied_targets} of {r.users} users have their validation or test target tied in time with
    the event before it, so the tie rule decides those targets.
  Users: those with >= {r.min_events} interactions, renumbered 1..{r.users} in ascending source user id.
  Items: those in at least one exported interaction, renumbered 1..{r.items} in ascending source item id;
    items nobody interacted with are not in the catalogue.
  Split (leave-one-out, as sasrec.py and genrec's `loo`): the last item of a line is the test target,
    the second-last the validation target, the items before them are training data.

Use
  python /work/shared/yardstick/sasrec.py THIS_FOLDER --loss ce
  genrec data prepare amazon-p5 WORKDIR --source THIS_FOLDER
"""


def export_p5(dataset: str | Path, outdir: str | Path, *, source: str | Path | None = None,
              data_dir: str | Path | None = None, options: IngestOptions | None = None, min_events: int = 3,
              overwrite: bool = False, made_by: str = "") -> P5Export:
    """Export ``dataset`` -- a name genrec can ingest, or a run directory made by ``genrec data prepare``
    (for generic data or non-default ingest options) -- as a P5-form directory ``outdir``."""
    name = str(dataset)
    if name in REGISTRY:
        ds = prepare_dataset(name, source, data_dir=data_dir, options=options)
    elif Path(name).expanduser().is_dir():
        if source is not None:
            raise ConfigError("--source applies to a dataset name, not to a prepared run directory")
        ds = open_store(Path(name).expanduser()).read()
    else:
        raise ConfigError(f"export-p5: {name!r} is neither a dataset name ({', '.join(REGISTRY)}) nor a run "
                          f"directory made by `genrec data prepare`")
    return write_p5(ds, outdir, min_events=min_events, overwrite=overwrite, made_by=made_by)


__all__ = ["P5Export", "export_p5", "readme", "write_p5"]
