"""The stream index (per-bucket training examples, item counts) against the join itself, its slow twin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from genrec.data.join import BucketJoinReader
from genrec.data.schema import EVENTS_SCHEMA, FEEDVIEWS_SCHEMA, ITEMS_SCHEMA, Dataset, DatasetInfo
from genrec.data.splits import SplitSpec
from genrec.data.store import TableStore
from genrec.data.stream_index import build_stream_index, stream_index
from genrec.errors import ConfigError

INFO = DatasetInfo(name="small", actions=["click", "save"], positive_actions=["save"], surfaces=["home"],
                   feedview_rule="slates of 3 consecutive events")


def _dataset(seed: int, n_users: int = 60) -> Dataset:
    """Users with 0..9 events (short ones too: the min_len rule matters), slates of 3 consecutive events."""
    rng = np.random.default_rng(seed)
    ev: dict[str, list] = {f: [] for f in EVENTS_SCHEMA.names}
    fv: dict[str, list] = {f: [] for f in FEEDVIEWS_SCHEMA.names}
    for u in range(1, n_users + 1):
        n = int(rng.integers(0, 10))
        t = int(rng.integers(0, 1000))
        for s in range(n):
            t += int(rng.integers(1, 100))
            ev["user_id"].append(u), ev["seq"].append(s), ev["timestamp"].append(t)
            ev["item_id"].append(int(rng.integers(0, 25))), ev["surface"].append("home")
            ev["action"].append(["click", "save"][int(rng.integers(0, 2))])
        for s in range(0, n, 3):
            k = min(3, n - s)
            fv["user_id"].append(u), fv["request_seq"].append(s), fv["request_ts"].append(t)
            fv["surface"].append("home"), fv["item_ids"].append(ev["item_id"][-n + s:][:k])
            fv["labels"].append([1] * k)
    items = pa.table({"item_id": list(range(25)), "title": ["t"] * 25, "text": ["x"] * 25,
                      "attributes": ["{}"] * 25}, schema=ITEMS_SCHEMA)
    return Dataset(INFO, pa.table(ev, schema=EVENTS_SCHEMA), items, pa.table(fv, schema=FEEDVIEWS_SCHEMA))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> TableStore:
    s = TableStore(tmp_path_factory.mktemp("tables"))
    s.write(_dataset(0), n_buckets=3)
    return s


@pytest.mark.parametrize("split", [SplitSpec("loo"), SplitSpec("temporal", cut_quantile=0.3),
                                   SplitSpec("temporal", cut_quantile=0.8)], ids=["loo", "temporal.3", "temporal.8"])
@pytest.mark.parametrize("min_len", [1, 2, 4])
def test_index_counts_what_the_join_yields(store: TableStore, split: SplitSpec, min_len: int) -> None:
    reader = BucketJoinReader(store, split=split, role="train", context_len=10 ** 9, seed=3)
    idx = build_stream_index(store, reader.split, min_len=min_len)
    items: list[np.ndarray] = []
    for b, exs in reader.iter_buckets():  # the twin: the join itself, and materialise's length rule
        kept = [e for e in exs if len(e.items) >= min_len]
        assert idx.examples[b] == len(kept)
        items += [e.items for e in kept]
    ids, counts = np.unique(np.concatenate(items), return_counts=True)
    assert np.array_equal(idx.item_ids, ids) and np.array_equal(idx.item_counts, counts)
    assert 0 < idx.total < 60  # some users are too short: the rule is exercised


def test_index_is_cached_per_table_version(tmp_path: Path) -> None:
    store = TableStore(tmp_path / "tables")
    store.write(_dataset(1), n_buckets=2)
    first = stream_index(store, SplitSpec("loo"))
    files = sorted((tmp_path / "tables" / "stream_index").glob("*.npz"))
    assert len(files) == 1
    again = stream_index(store, SplitSpec("loo"))  # read back
    assert np.array_equal(first.examples, again.examples) and np.array_equal(first.item_counts, again.item_counts)
    store.write(_dataset(2), n_buckets=2, overwrite=True)  # a new version: a new index, the old file gone
    fresh = TableStore(tmp_path / "tables")
    new = stream_index(fresh, SplitSpec("loo"))
    assert new.total == build_stream_index(fresh, SplitSpec("loo")).total != first.total
    assert [p.name for p in (tmp_path / "tables" / "stream_index").glob("*.npz")] != [files[0].name]
    assert len(list((tmp_path / "tables" / "stream_index").glob("*.npz"))) == 1
    with pytest.raises(ConfigError, match="resolve the temporal split"):
        build_stream_index(fresh, SplitSpec("temporal"))
