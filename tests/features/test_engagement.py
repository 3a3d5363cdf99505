"""Engagement vectors: co-occurrence and PPMI against slow dense twins, SVD structure, purity."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import ConfigError, DataError
from genrec.features.content import truncated_svd
from genrec.features.engagement import cooccurrence, engagement_vectors, ppmi, svd_embed


def events_table(histories: dict[int, list[int]], *, shuffle_seed: int | None = None,
                 actions: dict[int, list[str]] | None = None) -> pa.Table:
    """One row per (user, position); rows optionally shuffled so the code must sort by seq."""
    rows = [(u, it, pos, (actions or {}).get(u, ["click"] * len(h))[pos])
            for u, h in histories.items() for pos, it in enumerate(h)]
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(len(rows))
        rows = [rows[i] for i in order]
    return pa.table({
        "user_id": pa.array([r[0] for r in rows], pa.int64()),
        "item_id": pa.array([r[1] for r in rows], pa.int64()),
        "action": pa.array([r[3] for r in rows], pa.string()),
        "seq": pa.array([r[2] for r in rows], pa.int32()),
    })


def slow_cooccurrence(histories: dict[int, list[int]], item_ids: list[int], window: int | None) -> np.ndarray:
    """Obviously-correct twin: every pair of positions within ``window`` in one history."""
    idx = {it: i for i, it in enumerate(item_ids)}
    c = np.zeros((len(item_ids), len(item_ids)))
    for h in histories.values():
        for i in range(len(h)):
            for j in range(i + 1, len(h)):
                if (window is None or j - i <= window) and h[i] != h[j]:
                    c[idx[h[i]], idx[h[j]]] += 1
                    c[idx[h[j]], idx[h[i]]] += 1
    return c


def slow_ppmi(c: np.ndarray, smoothing: float = 1.0) -> np.ndarray:
    """Dense PPMI straight from the definition, with explicit loops."""
    total = c.sum()
    if total == 0:
        return np.zeros_like(c)
    pw = c.sum(axis=1) / total
    ctx = c.sum(axis=0) ** smoothing
    pc = ctx / ctx.sum()
    out = np.zeros_like(c)
    for a in range(c.shape[0]):
        for b in range(c.shape[1]):
            if c[a, b] > 0:
                out[a, b] = max(0.0, math.log((c[a, b] / total) / (pw[a] * pc[b])))
    return out


def test_cooccurrence_hand_example() -> None:
    ev = events_table({1: [10, 20, 30], 2: [20, 10]}, shuffle_seed=0)
    ids = np.array([30, 20, 10])  # catalogue order differs from id order
    c1 = cooccurrence(ev, ids, window=1).toarray()
    # pairs: (10,20) twice, (20,30) once
    np.testing.assert_array_equal(c1, [[0, 1, 0], [1, 0, 2], [0, 2, 0]])
    c2 = cooccurrence(ev, ids, window=2).toarray()
    np.testing.assert_array_equal(c2, [[0, 1, 1], [1, 0, 2], [1, 2, 0]])


histories_st = st.dictionaries(st.integers(0, 6), st.lists(st.integers(0, 7), min_size=0, max_size=9),
                               min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(hist=histories_st, window=st.one_of(st.none(), st.integers(1, 4)), seed=st.integers(0, 1000))
def test_cooccurrence_matches_slow_twin(hist: dict[int, list[int]], window: int | None, seed: int) -> None:
    ids = list(np.random.default_rng(seed).permutation(8))
    got = cooccurrence(events_table(hist, shuffle_seed=seed), np.array(ids), window=window).toarray()
    np.testing.assert_array_equal(got, slow_cooccurrence(hist, ids, window))


def test_whole_history_equals_huge_window() -> None:
    rng = np.random.default_rng(1)
    hist = {u: list(rng.integers(0, 20, size=rng.integers(1, 15))) for u in range(30)}
    ev, ids = events_table(hist), np.arange(20)
    np.testing.assert_array_equal(cooccurrence(ev, ids, window=None).toarray(),
                                  cooccurrence(ev, ids, window=100).toarray())


def test_min_count_and_action_filter() -> None:
    hist = {1: [1, 2, 3], 2: [1, 2], 3: [2, 3]}
    ev = events_table(hist, actions={3: ["click", "hide"]})
    c = cooccurrence(ev, np.array([1, 2, 3]), window=1, min_count=2).toarray()
    np.testing.assert_array_equal(c, [[0, 2, 0], [2, 0, 2], [0, 2, 0]])
    c = cooccurrence(ev, np.array([1, 2, 3]), window=1, actions=["click"]).toarray()
    np.testing.assert_array_equal(c, [[0, 2, 0], [2, 0, 1], [0, 1, 0]])


def test_ppmi_hand_computed() -> None:
    """C01=4, C02=1, C12=1, C23=2 (symmetric); |C|=16, row sums 5,5,4,2.

    PMI01 = log(4*16/25) > 0, PMI02 = PMI12 = log(16/20) < 0 -> 0, PMI23 = log(2*16/8) = log 4.
    """
    c = np.zeros((4, 4))
    for a, b, v in [(0, 1, 4), (0, 2, 1), (1, 2, 1), (2, 3, 2)]:
        c[a, b] = c[b, a] = v
    want = np.zeros((4, 4))
    want[0, 1] = want[1, 0] = math.log(64 / 25)
    want[2, 3] = want[3, 2] = math.log(4)
    import scipy.sparse as sp

    got = ppmi(sp.csr_matrix(c))
    np.testing.assert_allclose(got.toarray(), want, rtol=1e-12)
    assert got.nnz == 4  # the non-positive entries are gone, not stored as zeros
    np.testing.assert_allclose(slow_ppmi(c), want, rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(hist=histories_st, window=st.integers(1, 3), smoothing=st.sampled_from([1.0, 0.75, 0.5]))
def test_ppmi_matches_dense_twin(hist: dict[int, list[int]], window: int, smoothing: float) -> None:
    ids = np.arange(8)
    c = cooccurrence(events_table(hist), ids, window=window)
    np.testing.assert_allclose(ppmi(c, smoothing=smoothing).toarray(), slow_ppmi(c.toarray(), smoothing),
                               rtol=1e-10, atol=1e-12)


def test_svd_reconstructs_ppmi_and_is_eckart_young() -> None:
    rng = np.random.default_rng(0)
    hist = {u: list(rng.integers(0, 12, size=8)) for u in range(40)}
    m = ppmi(cooccurrence(events_table(hist), np.arange(12), window=2)).toarray()  # [12, 12]
    n = m.shape[0]
    u, s, vt = truncated_svd(m, n, seed=0)
    np.testing.assert_allclose((u * s) @ vt, m, atol=1e-10)  # full rank: exact
    sv = np.linalg.svd(m, compute_uv=False)
    for k in (2, 5):
        u, s, vt = truncated_svd(m, k, seed=0)
        err = np.linalg.norm(m - (u * s) @ vt)
        assert err == pytest.approx(np.sqrt((sv[k:] ** 2).sum()), rel=1e-8)


def test_svd_embed_matches_dense_twin_and_skips_inactive() -> None:
    import scipy.sparse as sp

    rng = np.random.default_rng(3)
    m = np.abs(rng.normal(size=(6, 6)))
    m = m + m.T
    m[4, :] = m[:, 4] = 0  # item 4 has no co-interaction
    got = svd_embed(sp.csr_matrix(m), 3)  # [6, 3]
    act = [0, 1, 2, 3, 5]
    u, s, _ = np.linalg.svd(m[np.ix_(act, act)])
    want = u[:, :3] * np.sqrt(s[:3])
    assert np.all(got[4] == 0)
    # per-column sign is the only freedom
    signs = np.sign((got[act] * want).sum(axis=0))
    np.testing.assert_allclose(got[act], want * signs, atol=1e-5)
    wide = svd_embed(sp.csr_matrix(m), 10)  # only 5 active items: columns 5.. are zero padding
    assert wide.shape == (6, 10) and not wide[:, 5:].any() and wide[:, :5].any()


def test_engagement_recovers_communities_and_zero_rows() -> None:
    """Two item communities (0-9, 10-19); item 20 only ever alone; item 21 never seen."""
    rng = np.random.default_rng(0)
    hist: dict[int, list[int]] = {}
    for u in range(200):
        base = 0 if u % 2 == 0 else 10
        hist[u] = list(base + rng.integers(0, 10, size=12))
    hist[1000] = [20]
    ids = np.arange(22)
    e = engagement_vectors(events_table(hist), ids, dim=4, window=3, seed=0)
    assert e.shape == (22, 4) and e.dtype == np.float32
    assert np.all(e[20] == 0) and np.all(e[21] == 0)
    np.testing.assert_allclose(np.linalg.norm(e[:20], axis=1), 1.0, atol=1e-5)
    sim = e[:20] @ e[:20].T
    np.fill_diagonal(sim, -np.inf)
    top = np.argsort(-sim, axis=1)[:, :5]  # top-5 neighbours of each item
    assert np.all((top < 10) == (np.arange(20) < 10)[:, None])


def test_deterministic_and_row_order_invariant() -> None:
    rng = np.random.default_rng(5)
    hist = {u: list(rng.integers(0, 30, size=10)) for u in range(50)}
    ids = np.arange(30)
    a = engagement_vectors(events_table(hist), ids, dim=8, seed=1)
    b = engagement_vectors(events_table(hist, shuffle_seed=7), ids, dim=8, seed=1)
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_array_equal(a, engagement_vectors(events_table(hist), ids, dim=8, seed=1))


def test_pure_function_of_train_events() -> None:
    """Changing a held-out event leaves the output unchanged when only train events are passed,
    while the same change inside the train events does change it (so the check can fail)."""
    rng = np.random.default_rng(2)
    hist = {u: list(rng.integers(0, 15, size=8)) for u in range(40)}
    ids = np.arange(15)
    train = {u: h[:-1] for u, h in hist.items()}
    heldout_a = {u: h[-1] for u, h in hist.items()}
    heldout_b = {u: (h[-1] + 1) % 15 for u, h in hist.items()}
    base = engagement_vectors(events_table(train), ids, dim=6, seed=0)
    # a "split" helper: the function only ever sees train rows, whatever held-out holds
    for held in (heldout_a, heldout_b):
        full = {u: train[u] + [held[u]] for u in hist}
        train_only = {u: h[:-1] for u, h in full.items()}
        np.testing.assert_array_equal(engagement_vectors(events_table(train_only), ids, dim=6, seed=0), base)
    leaked = engagement_vectors(events_table({u: train[u] + [heldout_b[u]] for u in hist}), ids, dim=6, seed=0)
    assert not np.allclose(leaked, base)


def test_errors() -> None:
    ev = events_table({1: [1, 2, 99]})
    with pytest.raises(DataError, match="event item_id 99 is not in the item catalogue"):
        engagement_vectors(ev, np.array([1, 2, 3]))
    with pytest.raises(DataError, match="duplicate item_id 2"):
        engagement_vectors(events_table({1: [1, 2]}), np.array([1, 2, 2]))
    with pytest.raises(ConfigError, match="window"):
        engagement_vectors(events_table({1: [1, 2]}), np.array([1, 2]), window=0)
    with pytest.raises(ConfigError, match="smoothing"):
        engagement_vectors(events_table({1: [1, 2]}), np.array([1, 2]), smoothing=0)
    with pytest.raises(DataError, match="'seq'"):
        engagement_vectors(events_table({1: [1, 2]}).drop_columns(["seq"]), np.array([1, 2]))


def test_empty_events_gives_zero_vectors() -> None:
    ev = events_table({1: [1, 2]}).slice(0, 0)
    out = engagement_vectors(ev, np.array([1, 2, 3]), dim=4)
    assert out.shape == (3, 4) and not out.any()
