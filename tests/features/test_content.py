"""TF-IDF content vectors: determinism, alignment to item order, similarity sanity, errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import ConfigError, DataError
from genrec.features.content import content_vectors, l2_normalize, parse_spec, truncated_svd

TEXTS = [
    "OPI Nail Lacquer red shimmer nail polish",
    "Essie nail polish red gloss",
    "Neutrogena hydrating face moisturizer SPF 15",
    "Olay regenerist face moisturizer cream",
    "Paul Mitchell shampoo for curly hair",
    "Herbal Essences shampoo and conditioner hair",
    "OPI Nail Lacquer red shimmer nail polish",  # same text as row 0
    "Maybelline mascara volume black",
    "L'Oreal mascara lash black",
    "Revlon lipstick matte red",
]


def items_table(texts: list[str], ids: list[int] | None = None) -> pa.Table:
    ids = ids if ids is not None else [100 + i for i in range(len(texts))]
    return pa.table({"item_id": pa.array(ids, pa.int64()), "text": pa.array(texts, pa.string())})


def test_tfidf_shape_norm_and_determinism() -> None:
    t = items_table(TEXTS)
    a = content_vectors(t, "tfidf", dim=6, seed=3)
    b = content_vectors(t, "tfidf", dim=6, seed=3)
    assert a.shape == (len(TEXTS), 6) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)


def test_tfidf_dim_capped_by_rank() -> None:
    t = items_table(TEXTS)
    out = content_vectors(t, "tfidf", dim=500, seed=0)
    assert out.shape == (len(TEXTS), len(TEXTS))
    assert content_vectors(t, "tfidf", seed=0).shape[1] == len(TEXTS)  # default 64 -> capped at n


def test_same_text_closer_than_unrelated() -> None:
    v = content_vectors(items_table(TEXTS), "tfidf", dim=8, seed=0)
    sim = v @ v.T  # [n, n]
    assert sim[0, 6] > 0.99  # identical texts
    assert sim[0, 1] > sim[0, 4]  # two red nail polishes vs nail polish / shampoo
    assert sim[2, 3] > sim[2, 7]  # two moisturizers vs moisturizer / mascara
    assert sim[7, 8] > sim[7, 5]


def test_rows_follow_item_order() -> None:
    """Permuting the items table permutes the rows (exact SVD; sign choice is permutation-invariant)."""
    perm = np.random.default_rng(0).permutation(len(TEXTS))
    ids = [100 + i for i in range(len(TEXTS))]
    a = content_vectors(items_table(TEXTS, ids), "tfidf", dim=5, seed=0)
    b = content_vectors(items_table([TEXTS[i] for i in perm], [ids[i] for i in perm]), "tfidf", dim=5, seed=0)
    np.testing.assert_allclose(b, a[perm], atol=1e-5)


def test_empty_text_gets_zero_row() -> None:
    v = content_vectors(items_table(TEXTS + [""]), "tfidf", dim=4, seed=0)
    assert np.all(v[-1] == 0) and np.all(np.linalg.norm(v[:-1], axis=1) > 0.99)


def test_errors() -> None:
    t = items_table(TEXTS)
    with pytest.raises(ConfigError, match="content spec"):
        content_vectors(t, "bert")
    with pytest.raises(ConfigError):
        parse_spec("file:")
    with pytest.raises(ConfigError, match="dim"):
        content_vectors(t, "tfidf", dim=0)
    with pytest.raises(DataError, match="duplicate item_id 100"):
        content_vectors(items_table(TEXTS[:3], [100, 101, 100]), "tfidf")
    with pytest.raises(DataError, match="every item text is empty"):
        content_vectors(items_table(["", " "]), "tfidf")
    with pytest.raises(DataError, match="null text for item_id 101"):
        content_vectors(pa.table({"item_id": pa.array([100, 101], pa.int64()), "text": ["a b", None]}), "tfidf")
    with pytest.raises(DataError, match="'text'"):
        content_vectors(pa.table({"item_id": pa.array([1], pa.int64())}), "tfidf")


def test_l2_normalize_keeps_zero_rows() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(l2_normalize(x), [[0.6, 0.8], [0.0, 0.0]])


@settings(max_examples=25, deadline=None)
@given(r=st.integers(5, 40), c=st.integers(5, 40), k=st.integers(1, 5), seed=st.integers(0, 10**6))
def test_randomized_svd_matches_exact(r: int, c: int, k: int, seed: int) -> None:
    """The randomized path (used above DENSE_SVD_MAX) against LAPACK on a matrix with a clear gap."""
    rng = np.random.default_rng(seed)
    k = min(k, r, c)
    low = rng.normal(size=(r, k)) @ np.diag(np.linspace(10, 5, k)) @ rng.normal(size=(k, c))
    m = low + 1e-3 * rng.normal(size=(r, c))
    ue, se, vte = truncated_svd(m, k, seed=0, method="exact")
    ur, sr, vtr = truncated_svd(m, k, seed=0, method="randomized")
    np.testing.assert_allclose(sr, se, rtol=1e-4)
    np.testing.assert_allclose((ur * sr) @ vtr, (ue * se) @ vte, atol=1e-3 * np.abs(low).max())
    # both have deterministic signs: the same factors, not just the same product
    np.testing.assert_allclose(np.abs(ur.T @ ue), np.eye(k), atol=1e-3)
    np.testing.assert_allclose(ur, ue, atol=1e-3)


def test_randomized_svd_at_full_rank_is_exact() -> None:
    """k == min(shape): the randomized range finder covers the whole row space (wide TF-IDF case)."""
    m = np.random.default_rng(0).normal(size=(30, 500))
    ue, se, vte = truncated_svd(m, 30, seed=0, method="exact")
    ur, sr, vtr = truncated_svd(m, 30, seed=0, method="randomized")
    np.testing.assert_allclose(sr, se, rtol=1e-8)
    np.testing.assert_allclose(ur, ue, atol=1e-8)
    with pytest.raises(ValueError, match="k=31"):
        truncated_svd(m, 31, seed=0)
