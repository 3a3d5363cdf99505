"""The cold-start split: withheld items never appear in training histories, only as users'
last (test) events; everything else is untouched and sequences stay contiguous."""

import numpy as np
import pytest

from genrec.data.ingest import prepare_dataset
from genrec.data.splits import SplitSpec, train_events
from genrec.errors import ConfigError
from genrec.recipes.coldstart import run_cold_start, withhold_items


@pytest.fixture(scope="module")
def ml100k(data_root):  # noqa: ANN001
    return prepare_dataset("movielens-100k", data_dir=data_root)


@pytest.mark.parametrize("seed", [0, 1])
def test_withheld_items_only_remain_as_test_targets(ml100k, seed):  # noqa: ANN001
    ds, cold = withhold_items(ml100k, 0.05, seed)
    assert len(cold) == round(0.05 * 1682)
    ev = ds.events
    users = ev.column("user_id").to_numpy()
    items = ev.column("item_id").to_numpy()
    seq = ev.column("seq").to_numpy()
    last = np.r_[users[1:] != users[:-1], True]
    is_cold = np.isin(items, cold)
    assert not (is_cold & ~last).any()  # a cold item survives only as a user's last event
    assert is_cold.any()  # ... and some test targets are cold
    # train split (loo) never sees a cold item
    tr = train_events(ev, SplitSpec("loo")).column("item_id").to_numpy()
    assert not np.isin(tr, cold).any()
    # seq is 0..n-1 per user
    starts = np.r_[0, np.flatnonzero(users[1:] != users[:-1]) + 1]
    assert (seq[starts] == 0).all() and (np.diff(seq)[~np.isin(np.arange(1, len(seq)), starts)] == 1).all()
    # warm events are all kept, in order
    orig = ml100k.events
    o_items = orig.column("item_id").to_numpy()
    o_last = np.r_[orig.column("user_id").to_numpy()[1:] != orig.column("user_id").to_numpy()[:-1], True]
    assert len(ev) == int((~np.isin(o_items, cold) | o_last).sum())
    assert ds.feedviews.num_rows > 0 and ds.items.num_rows == 1682


def test_bad_fraction_is_named(ml100k):  # noqa: ANN001
    with pytest.raises(ConfigError, match="fraction"):
        withhold_items(ml100k, 0.0)


def test_a_source_that_cannot_code_cold_items_is_refused(tmp_path):  # noqa: ANN001
    with pytest.raises(ConfigError, match="--source must be one of content, content\\+engagement"):
        run_cold_start(tmp_path / "base", tmp_path / "out", source="engagement")
    assert not (tmp_path / "out").exists()


def test_validation_cases_are_the_protocol_one_event_earlier(tmp_path):  # noqa: ANN001
    """genrec.recipes.cold_block's validation cases: each user's second-to-last event of the base data, asked for
    from the events before it without the withheld items (the same items as the cold-start run's), some of them
    cold; a run that withheld other items is refused."""
    from genrec.data.join import BucketJoinReader
    from genrec.data.store import TableStore
    from genrec.recipes import pipeline as P
    from genrec.recipes.cold_block import validation_store
    from genrec.workdir import WorkDir

    base = WorkDir(tmp_path / "base")
    P.synthesize(base.root, users=60, items=80, events=1500, seed=0, n_buckets=2)
    orig = TableStore(base.tables).read()
    _, cold = withhold_items(orig, 0.2, seed=3)
    store = validation_store(base.root, 0.2, 3, cold, tmp_path / "valid")
    got = {r.user_id: r for r in BucketJoinReader(store, split=SplitSpec("loo"), role="test", context_len=1000)}
    users = orig.events.column("user_id").to_numpy()
    items = orig.events.column("item_id").to_numpy()
    n_cold = 0
    for u in np.unique(users):
        mine = items[users == u]  # in seq order
        if len(mine) < 3:
            continue
        r = got[int(u)]
        assert r.target_item == mine[-2], u
        before = mine[:-2]
        np.testing.assert_array_equal(r.items, before[~np.isin(before, cold)])
        n_cold += int(np.isin(mine[-2], cold))
    assert n_cold > 0 and len(got) >= len(np.unique(users)) - 5
    with pytest.raises(ConfigError, match="withhold other items"):
        validation_store(base.root, 0.2, 3, cold[1:], tmp_path / "other")
