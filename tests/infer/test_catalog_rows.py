"""``ItemCatalog.rows``: the dense look-up of small ids against the binary search it replaces, on fresh random
catalogues (dense ids, sparse ids, ids past the table, negative and unknown ids)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.catalog import ItemCatalog
from genrec.errors import DataError


def _catalog(ids: np.ndarray) -> ItemCatalog:
    return ItemCatalog(item_ids=ids, feats=torch.zeros(len(ids), 1), codes=None)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 300), spread=st.sampled_from([1, 3, 50, 10**7]))
def test_rows_equal_the_binary_search(seed: int, n: int, spread: int) -> None:
    g = np.random.default_rng(seed)
    ids = np.sort(g.choice(n * spread + 5, n, replace=False)).astype(np.int64) - (5 if spread == 3 else 0)
    cat = _catalog(g.permutation(ids))  # (sorted by the catalogue)
    ask = np.concatenate([g.choice(ids, 40), g.integers(-10, int(ids[-1]) + 10, 40), [int(ids[-1]) + 1, -1]])
    got, ref = cat.rows(ask, strict=False), cat.rows_by_search(ask, strict=False)
    assert got.dtype == np.int64 and np.array_equal(got, ref)
    assert np.array_equal(cat.item_ids[got[got >= 0]], ask[got >= 0])
    known = ask[ref >= 0]
    assert np.array_equal(cat.rows(known), cat.rows_by_search(known))
    if (ref < 0).any():
        first = int(ask[ref < 0][0])
        with pytest.raises(DataError, match=f"unknown item id {first}"):
            cat.rows(ask)
    assert (cat._dense_rows() is not None) == (int(ids[0]) >= 0 and int(ids[-1]) < 4 * n + 2**22)
    assert len(cat.rows(np.zeros(0, np.int64))) == 0
