"""A run's users as the commands see them: a user's events as a history (``genrec recommend --user``), the
evaluation case ``genrec eval`` scores for them (``--as-of valid|test``), and the source file's own ids of a
dataset prepared with ``map_ids`` (what a person types and reads)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc  # type: ignore[import-untyped]

from genrec.catalog import open_store
from genrec.data.splits import SplitSpec, compute_cutoffs
from genrec.data.store import TableStore, catalog_config, user_bucket
from genrec.errors import ConfigError, DataError
from genrec.workdir import WorkDir


@dataclass
class SourceIds:
    """The source file's own ids of a dataset prepared with ``map_ids`` (users and items numbered
    0..n-1 in the tables): ``users`` / ``items`` map an original id, as text, to the table's id;
    ``item_original`` maps back. What a person types and reads is the original id."""

    users: dict[str, int]
    items: dict[str, int]
    item_original: dict[int, Any]

    @staticmethod
    def remapped(workdir: str | Path) -> bool:
        """Whether WORKDIR's tables were prepared with ``map_ids`` (False when there are no tables yet)."""
        store = TableStore(WorkDir(workdir).tables, catalog_config())
        return store.exists() and bool((store.info().extra or {}).get("map_ids"))

    @classmethod
    def of(cls, workdir: str | Path) -> "SourceIds | None":
        """The maps of WORKDIR's tables, or None when its ids were not remapped."""
        store = open_store(workdir)
        extra = store.info().extra or {}
        if not extra.get("map_ids"):
            return None
        users = {str(u): i for i, u in enumerate(extra.get("user_ids") or [])}
        it = store.read_items()
        back: dict[int, Any] = {}
        for iid, attrs in zip(it.column("item_id").to_pylist(), it.column("attributes").to_pylist()):
            orig = json.loads(attrs or "{}").get("original_id")
            if orig is not None:
                back[int(iid)] = orig
        return cls(users, {str(o): i for i, o in back.items()}, back)

    def user(self, original: str) -> int:
        if str(original) not in self.users:
            raise DataError(f"user {original!r} is not in the source data (its ids were remapped with map_ids: "
                            f"give the id as it appears in the source file)", field="user_id")
        return self.users[str(original)]


def user_history(workdir: str | Path, user_id: int) -> list[dict[str, Any]]:
    """All events of ``user_id`` in WORKDIR's tables, in ``seq`` order, as history entries."""
    return user_case(workdir, user_id)[0]


def user_case(workdir: str | Path, user_id: int, role: str | None = None,
              split_kind: str = "loo") -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``user_id``'s events as history entries, and with ``role`` ("valid" / "test") the evaluation case
    ``genrec eval`` scores for them under ``split_kind``: the events before that split's target, and the
    target ({item_id, action, ts, seq}). ``role`` None: every event, no target."""
    store = open_store(workdir)
    bucket = int(user_bucket(np.array([user_id], dtype=np.int64), store.n_buckets)[0])
    ev = store.read_events(bucket)
    ev = ev.filter(pc.equal(ev.column("user_id"), user_id))
    if ev.num_rows == 0:
        raise DataError(f"user {user_id} has no events", path=WorkDir(workdir).tables, field="user_id")
    ev = ev.sort_by("seq")
    hist = [{"item_id": int(i), "action": a, "surface": s, "ts": int(t)} for i, a, s, t in zip(
        ev.column("item_id").to_pylist(), ev.column("action").to_pylist(), ev.column("surface").to_pylist(),
        ev.column("timestamp").to_pylist())]
    if role is None:
        return hist, None
    if role not in ("valid", "test"):
        raise ConfigError(f"--as-of: 'valid' or 'test', got {role!r}")
    spec = SplitSpec(kind=split_kind)  # type: ignore[arg-type]
    if spec.kind == "temporal":  # the cut is a quantile of every event's time, not this user's
        spec = spec.resolve(store.read_events(columns=["timestamp"]).column("timestamp"))
    t = int(compute_cutoffs(ev, spec).target_seq(role)[0])  # type: ignore[arg-type]
    if t < 0:
        raise DataError(f"user {user_id} has no {role} case under the {split_kind} split (too few events, or none "
                        f"on both sides of the cut)", field="user_id")
    seqs = ev.column("seq").to_pylist()
    j = seqs.index(t)
    return hist[:j], {**hist[j], "seq": t}
