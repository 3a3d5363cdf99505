"""ResidualKMeans: error falls with levels, encode/reconstruct agree with a brute-force twin."""

from __future__ import annotations

import warnings

import faiss
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import ConfigError, DataError
from genrec.sid.rqkmeans import ResidualKMeans, balanced_assign

faiss.omp_set_num_threads(1)


def _clustered(n: int = 400, d: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((10, d)) * 3
    return (centers[rng.integers(0, 10, n)] + rng.standard_normal((n, d))).astype(np.float32)


def test_error_decreases_with_levels() -> None:
    x = _clustered()
    rq = ResidualKMeans(levels=4, codebook_size=8, niter=10).fit(x)
    errs = [e["mse"] for e in rq.level_errors(x)]
    assert all(b < a for a, b in zip(errs, errs[1:])), errs
    assert errs[0] < float(np.square(x - x.mean(0)).sum(1).mean())  # better than the mean
    rel = [e["relative"] for e in rq.level_errors(x)]
    assert 0 < rel[-1] < rel[0] < 1


def test_encode_matches_bruteforce_and_reconstruct() -> None:
    x = _clustered(200, 6, seed=1)
    rq = ResidualKMeans(levels=3, codebook_size=[5, 4, 3], niter=5).fit(x)
    codes = rq.encode(x)
    assert codes.shape == (200, 3) and codes.dtype == np.int32
    assert rq.codebook_sizes == [5, 4, 3]
    # slow twin: explicit distances, level by level
    res = x.astype(np.float64)
    for lvl, cb in enumerate(rq.codebooks):
        dist = ((res[:, None, :] - cb[None].astype(np.float64)) ** 2).sum(-1)  # [n, K]
        best = dist.min(1)
        chosen = dist[np.arange(len(x)), codes[:, lvl]]
        np.testing.assert_allclose(chosen, best, rtol=1e-4, atol=1e-4)  # ties may pick either
        res = res - cb[codes[:, lvl]]
    np.testing.assert_allclose(rq.reconstruct(codes), x - res.astype(np.float32), atol=1e-4)


def test_deterministic_and_state_roundtrip(tmp_path) -> None:
    x = _clustered(300, 8, seed=2)
    a = ResidualKMeans(3, 6, niter=5, seed=7).fit(x)
    b = ResidualKMeans(3, 6, niter=5, seed=7).fit(x)
    np.testing.assert_array_equal(a.encode(x), b.encode(x))
    c = ResidualKMeans.from_state(a.state_dict())
    np.testing.assert_array_equal(c.encode(x), a.encode(x))
    a.save(tmp_path / "q.safetensors")
    d = ResidualKMeans.load(tmp_path / "q.safetensors")
    np.testing.assert_array_equal(d.encode(x), a.encode(x))
    assert d.levels == 3 and d.seed == 7


def test_cap_when_fewer_points_than_k() -> None:
    x = _clustered(5, 4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rq = ResidualKMeans(2, 16, niter=3).fit(x)
    assert rq.codebook_sizes == [5, 5]
    assert len(rq.stats["warnings"]) == 2 and len(w) == 2
    assert rq.encode(x).max() < 5


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError):
        ResidualKMeans(0, 4)
    with pytest.raises(ConfigError):
        ResidualKMeans(2, [4])
    x = _clustered(50, 4)
    x[7, 2] = np.nan
    with pytest.raises(DataError, match="row 8 \\(counting from 1\\)"):
        ResidualKMeans(2, 4).fit(x)
    rq = ResidualKMeans(2, 4, niter=2).fit(_clustered(50, 4))
    with pytest.raises(DataError, match="dimension"):
        rq.encode(np.zeros((3, 5), np.float32))
    with pytest.raises(DataError, match="outside codebook"):
        rq.reconstruct(np.array([[0, 4]]))
    with pytest.raises(ConfigError, match="not fitted"):
        ResidualKMeans(2, 4).encode(np.zeros((1, 4), np.float32))


def _deferred_acceptance_reference(x: np.ndarray, c: np.ndarray, capacity: float, groups: np.ndarray) -> list[int]:
    """One point at a time Gale-Shapley with exact float64 distances (slow, obvious)."""
    n, k = len(x), len(c)
    dist = ((x[:, None, :].astype(np.float64) - c[None].astype(np.float64)) ** 2).sum(-1)
    prefs = [sorted(range(k), key=lambda j: (dist[i, j], j)) for i in range(n)]
    size = {g: int((groups == g).sum()) for g in set(groups.tolist())}
    cap = {g: int(np.ceil(capacity * size[g] / k - 1e-9)) for g in size}
    held: dict[tuple[int, int], list[int]] = {}
    nxt = [0] * n
    free = list(range(n))
    while free:
        i = free.pop()
        j = prefs[i][nxt[i]]
        nxt[i] += 1
        slot = (int(groups[i]), j)
        members = sorted(held.get(slot, []) + [i], key=lambda r: (dist[r, j], r))
        held[slot] = members[: cap[int(groups[i])]]
        free.extend(members[cap[int(groups[i])]:])
    out = [0] * n
    for (_g, j), members in held.items():
        for r in members:
            out[r] = j
    return out


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 60), k=st.integers(1, 6), n_groups=st.integers(1, 4),
       capacity=st.sampled_from([1.0, 1.3, 2.0, 4.0]))
def test_balanced_assign_matches_sequential_reference(seed, n, k, n_groups, capacity) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, (n, 3)).astype(np.float32)  # small ints: exact distances, real ties
    c = rng.integers(-3, 4, (k, 3)).astype(np.float32)
    groups = rng.integers(0, n_groups, n)
    got = balanced_assign(x, c, capacity, groups)
    assert got.tolist() == _deferred_acceptance_reference(x, c, capacity, groups)
    for g in set(groups.tolist()):
        sizes = np.bincount(got[groups == g], minlength=k)
        assert sizes.max() <= np.ceil(capacity * (groups == g).sum() / k - 1e-9)


def test_capacity_bounds_items_per_code() -> None:
    rng = np.random.default_rng(3)
    # very skewed data: most points in one tight blob
    x = np.concatenate([rng.standard_normal((300, 4)) * 0.01, rng.standard_normal((60, 4)) * 3]).astype(np.float32)
    plain = ResidualKMeans(2, 4, niter=5).fit_encode(x)
    rq = ResidualKMeans(2, 4, niter=5, capacity=1.5)
    codes = rq.fit_encode(x)
    assert np.bincount(codes[:, 0]).max() <= np.ceil(1.5 * 360 / 4)
    _, inv, cnt = np.unique(codes[:, :1], axis=0, return_inverse=True, return_counts=True)
    for g, n_g in enumerate(cnt):
        assert np.bincount(codes[inv.ravel() == g, 1]).max() <= np.ceil(1.5 * n_g / 4)
    assert np.unique(codes, axis=0, return_counts=True)[1].max() < np.unique(plain, axis=0, return_counts=True)[1].max()
    back = ResidualKMeans.from_state(rq.state_dict())
    assert back.capacity == 1.5
    np.testing.assert_array_equal(back.encode(x), rq.encode(x))
    with pytest.raises(ConfigError, match="capacity"):
        ResidualKMeans(2, 4, capacity=0.5)
