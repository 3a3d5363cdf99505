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
