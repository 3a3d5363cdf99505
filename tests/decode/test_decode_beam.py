"""beam_search against brute force and a plain Python-list beam search; PinGER's worked
diversity example; constrained decoding; batch-row independence; coarse-prefix fallback."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_decode_trie_torch import make_trie, random_table

from genrec.decode import beam_search, fallback_items, select_diverse
from genrec.decode.beam import check_nan_flags, deferred_nan_checks, select_diverse_reference
from genrec.errors import ConfigError

LogpFn = Callable[[int, tuple[int, ...]], np.ndarray]


# ---------------------------------------------------------------------------- helpers
def random_model(ks: list[int], seed: int, scale: float = 2.0) -> LogpFn:
    """Deterministic random next-code log-probs for (batch row, prefix)."""

    def logp(b: int, prefix: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([seed, b, len(prefix), *prefix])
        x = rng.normal(size=ks[len(prefix)]) * scale
        return x - np.log(np.exp(x - x.max()).sum()) - x.max()

    return logp


def as_step_fn(logp: LogpFn) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(prefix: torch.Tensor) -> torch.Tensor:  # [B, Wc, d] -> [B, Wc, K]
        b, wc, _ = prefix.shape
        rows = [[logp(i, tuple(int(c) for c in prefix[i, w])) for w in range(wc)] for i in range(b)]
        return torch.tensor(np.array(rows), dtype=torch.float64)

    return step


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def ref_beam(
    logp: LogpFn,
    b: int,
    ks: list[int],
    width: int,
    lam: float = 0.0,
    penalty: str = "sum",
    legal: set[tuple[int, ...]] | None = None,
) -> list[tuple[tuple[int, ...], float]]:
    """Beam search written plainly with lists; illegal candidates are simply absent."""
    beams: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    for d in range(len(ks)):
        cands = []
        for pref, s in beams:
            lp = logp(b, pref)
            for c in range(ks[d]):
                if legal is None or pref + (c,) in legal:
                    cands.append((pref + (c,), s + float(lp[c])))
        pens = [0.0] * len(cands)
        free = list(range(len(cands)))
        picked: list[int] = []
        while free and len(picked) < width:
            best = max(free, key=lambda i: cands[i][1] - lam * pens[i])  # first max on ties
            picked.append(best)
            free.remove(best)
            for i in free:
                sh = common_prefix(cands[i][0], cands[best][0])
                pens[i] = pens[i] + sh if penalty == "sum" else max(pens[i], sh)
        beams = [cands[i] for i in picked]
    return beams


def finite_beams(res, b: int) -> list[tuple[tuple[int, ...], float]]:  # noqa: ANN001
    out = []
    for w in range(res.codes.shape[1]):
        s = float(res.scores[b, w])
        if math.isfinite(s):
            out.append((tuple(int(c) for c in res.codes[b, w]), s))
    return out


def assert_same_beams(got: list, want: list) -> None:  # noqa: ANN001
    assert [g[0] for g in got] == [w[0] for w in want]
    np.testing.assert_allclose([g[1] for g in got], [w[1] for w in want], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- plain beam search
def test_lambda0_with_wide_beam_is_exhaustive_sort() -> None:
    ks = [3, 4, 3]
    logp = random_model(ks, seed=1)
    res = beam_search(as_step_fn(logp), 2, 3, ks, beam_width=40)  # 36 paths < 40 slots
    for b in range(2):
        allp = []
        for c0 in range(3):
            for c1 in range(4):
                for c2 in range(3):
                    s = logp(b, ())[c0] + logp(b, (c0,))[c1] + logp(b, (c0, c1))[c2]
                    allp.append(((c0, c1, c2), float(s)))
        allp.sort(key=lambda t: -t[1])
        assert_same_beams(finite_beams(res, b), allp)
        assert res.codes[b, 36:].eq(-1).all() and not res.valid[b, 36:].any()
        assert res.valid[b, :36].all()


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 12),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.0, 0.3, 2.0]),
    st.sampled_from(["sum", "max"]),
)
def test_matches_list_reference(n_levels: int, width: int, seed: int, lam: float, penalty: str) -> None:
    rng = np.random.default_rng(seed)
    ks = [int(k) for k in rng.integers(1, 6, size=n_levels)]
    logp = random_model(ks, seed)
    res = beam_search(as_step_fn(logp), 2, n_levels, ks, width, diversity_lambda=lam, penalty=penalty)  # type: ignore[arg-type]
    for b in range(2):
        assert_same_beams(finite_beams(res, b), ref_beam(logp, b, ks, width, lam, penalty))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 10), st.integers(0, 2**31 - 1), st.sampled_from([0.0, 1.0]), st.booleans())
def test_constrained_never_invalid_and_matches_set_reference(
    n_levels: int, width: int, seed: int, lam: float, force_csr: bool
) -> None:
    rng = np.random.default_rng(seed)
    ks = [int(k) for k in rng.integers(1, 6, size=n_levels)]
    codes = random_table(rng, n_levels, ks, int(rng.integers(1, 25)))
    legal_full = {tuple(int(x) for x in row) for row in codes}
    legal = {p[:d] for p in legal_full for d in range(1, n_levels + 1)}
    trie = make_trie(codes, ks, dense_max_entries=0 if force_csr else 10**9)
    logp = random_model(ks, seed)
    res = beam_search(as_step_fn(logp), 2, n_levels, ks, width, diversity_lambda=lam, trie=trie)
    for b in range(2):
        got = finite_beams(res, b)
        assert all(sid in legal_full for sid, _ in got)
        assert_same_beams(got, ref_beam(logp, b, ks, width, lam, legal=legal))
        assert res.valid[b].tolist() == [math.isfinite(float(s)) for s in res.scores[b]]


def test_unconstrained_reports_validity_with_trie() -> None:
    ks = [4, 4, 4]
    rng = np.random.default_rng(3)
    codes = random_table(rng, 3, ks, 10)
    legal = {tuple(int(x) for x in r) for r in codes}
    trie = make_trie(codes, ks)
    res = beam_search(as_step_fn(random_model(ks, 3)), 2, 3, ks, 16, trie=trie, constrain=False)
    free = beam_search(as_step_fn(random_model(ks, 3)), 2, 3, ks, 16)
    assert torch.equal(res.codes, free.codes)  # checking only: same beams as no trie
    want = [[tuple(int(c) for c in res.codes[b, w]) in legal for w in range(16)] for b in range(2)]
    assert res.valid.tolist() == want
    assert not all(all(r) for r in want)  # the case is non-trivial


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 3),  # B
    st.integers(1, 6),  # Wc
    st.integers(1, 5),  # K
    st.integers(0, 3),  # d
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    st.sampled_from(["sum", "max"]),
)
def test_select_diverse_equals_candidate_scan_twin(
    b: int, wc: int, k: int, d: int, seed: int, lam: float, penalty: str
) -> None:
    """Integer scores make ties common; -inf entries make rows run dry."""
    rng = np.random.default_rng(seed)
    if d == 0:
        wc = 1
    cand = torch.from_numpy(rng.integers(-4, 1, size=(b, wc, k)).astype(np.float64))
    cand = cand.masked_fill(torch.from_numpy(rng.random((b, wc, k)) < 0.3), -math.inf)
    space = np.array(list(itertools.product(range(3), repeat=d)), dtype=np.int64).reshape(3**d, d)  # all 3**d prefixes
    wc = min(wc, len(space))
    cand = cand[:, :wc]
    prefix = torch.stack([torch.from_numpy(space[rng.permutation(len(space))[:wc]]) for _ in range(b)])  # distinct
    n_keep = int(rng.integers(1, wc * k + 1))
    fast = select_diverse(cand, prefix, n_keep, lam, penalty)  # type: ignore[arg-type]
    slow = select_diverse_reference(cand, prefix, n_keep, lam, penalty)  # type: ignore[arg-type]
    assert torch.equal(fast, slow)
    assert all(len(set(r)) == n_keep for r in fast.tolist())  # never the same candidate twice


# ---------------------------------------------------------------------------- the paper's example
A, B, C = (12, 7), (12, 9), (40, 3)


def example_candidates(a: list[float], b: list[float], c: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    cand = torch.full((1, 3, 4), -math.inf, dtype=torch.float64)  # [B=1, Wc=3 parents, K=4]
    for w, sc in enumerate((a, b, c)):
        cand[0, w, : len(sc)] = torch.tensor(sc, dtype=torch.float64)
    prefix = torch.tensor([[A, B, C]], dtype=torch.int64)  # [1, 3, 2]
    return cand, prefix


def picked(idx: torch.Tensor) -> list[tuple[str, int]]:
    return [("ABC"[int(j) // 4], int(j) % 4) for j in idx[0]]


@pytest.mark.parametrize("penalty", ["sum", "max"])
def test_paper_worked_example(penalty: str) -> None:
    lam = 0.5
    # C is 0.2 below B (< λ) and above A's second child minus 2λ -> C is picked second.
    cand, prefix = example_candidates([-1.0, -1.1], [-1.2], [-1.4])
    assert picked(select_diverse(cand, prefix, 2, lam, penalty)) == [("A", 0), ("C", 0)]
    # Without the penalty A's second child (raw -1.1) wins.
    assert picked(select_diverse(cand, prefix, 2, 0.0, penalty)) == [("A", 0), ("A", 1)]
    # C more than λ below B -> B (penalised λ×1) wins.
    cand, prefix = example_candidates([-1.0, -1.1], [-1.2], [-1.8])
    assert picked(select_diverse(cand, prefix, 2, lam, penalty)) == [("A", 0), ("B", 0)]
    # A's second child minus 2λ still beats C and B -> A's second child.
    cand, prefix = example_candidates([-1.0, -1.01], [-2.5], [-2.2])
    assert picked(select_diverse(cand, prefix, 2, lam, penalty)) == [("A", 0), ("A", 1)]
    # Exact boundary: B - λ ties C  -> B is earlier in candidate order, first max wins.
    cand, prefix = example_candidates([-1.0, -3.0], [-1.25], [-1.75])
    assert picked(select_diverse(cand, prefix, 2, lam, penalty)) == [("A", 0), ("B", 0)]


def test_penalties_add_up_over_picks_sum_vs_max() -> None:
    """Third pick separates the rules: A's third child shares depth 2 with two picks."""
    cand, prefix = example_candidates([-1.0, -1.05, -1.1], [-1.9], [-5.0])
    # after A0, A1: sum -> A2 pays 4λ = 2.0 (-3.1), B pays 2λ = 1.0 (-2.9) -> B
    assert picked(select_diverse(cand, prefix, 3, 0.5, "sum")) == [("A", 0), ("A", 1), ("B", 0)]
    # max -> A2 pays 2λ (-2.1), B pays λ (-2.4) -> A2
    assert picked(select_diverse(cand, prefix, 3, 0.5, "max")) == [("A", 0), ("A", 1), ("A", 2)]


def test_paper_example_end_to_end() -> None:
    """Levels 1-2 leave exactly A, B, C as beams; level 3 follows the example."""
    ks = [48, 10, 4]
    lp3 = {A: [-0.30, -0.35, -9, -9], B: [-0.35, -9, -9, -9], C: [-0.20, -9, -9, -9]}

    def logp(b: int, prefix: tuple[int, ...]) -> np.ndarray:
        x = np.full(ks[len(prefix)], -30.0)
        if prefix == ():
            x[12], x[40] = -0.5, -0.9
        elif prefix == (12,):
            x[7], x[9] = -0.3, -0.4
        elif prefix == (40,):
            x[3] = -0.1
        elif len(prefix) == 2:
            x[:] = lp3.get(prefix, [-30.0] * 4)
        return x

    # cumulative: A0 -1.1, A1 -1.15, C0 -1.2, B0 -1.25
    res = beam_search(as_step_fn(logp), 1, 3, ks, 3, diversity_lambda=0.5)
    got = [tuple(int(c) for c in sid) for sid in res.codes[0]]
    assert got == [(12, 7, 0), (40, 3, 0), (12, 9, 0)]
    np.testing.assert_allclose(res.scores[0].numpy(), [-1.1, -1.2, -1.25])  # raw log-probs, no penalty
    plain = beam_search(as_step_fn(logp), 1, 3, ks, 3)
    assert [tuple(int(c) for c in sid) for sid in plain.codes[0]] == [(12, 7, 0), (12, 7, 1), (40, 3, 0)]


# ---------------------------------------------------------------------------- diversity, batch rows
def test_diversity_increases_distinct_first_level_codes() -> None:
    ks = [16, 16, 16]
    base = random_model(ks, seed=7, scale=0.5)

    def peaked(b: int, prefix: tuple[int, ...]) -> np.ndarray:
        if prefix == ():
            x = np.full(16, -8.0)
            x[:3] = [-0.1, -2.5, -3.5]  # one dominant first-level code
            return x
        return base(b, prefix)

    distinct = {}
    for lam in (0.0, 1.0, 3.0):
        res = beam_search(as_step_fn(peaked), 1, 3, ks, 20, diversity_lambda=lam)
        distinct[lam] = len(set(res.codes[0, :, 0].tolist()))
    assert distinct[0.0] <= 2
    assert distinct[0.0] < distinct[1.0] < distinct[3.0]


@pytest.mark.parametrize("lam", [0.0, 1.5])
def test_batch_rows_are_independent(lam: float) -> None:
    ks = [5, 5, 5]
    codes = random_table(np.random.default_rng(0), 3, ks, 40)
    trie = make_trie(codes, ks)
    m1, m2 = random_model(ks, seed=11), random_model(ks, seed=12)

    def mixed(b: int, prefix: tuple[int, ...]) -> np.ndarray:
        return m1(b, prefix) if b == 0 else m2(b, prefix)

    for tr in (None, trie):
        r1 = beam_search(as_step_fn(m1), 3, 3, ks, 7, diversity_lambda=lam, trie=tr)
        r2 = beam_search(as_step_fn(mixed), 3, 3, ks, 7, diversity_lambda=lam, trie=tr)
        assert torch.equal(r1.codes[0], r2.codes[0]) and torch.equal(r1.scores[0], r2.scores[0])
        assert not torch.equal(r1.codes[1:], r2.codes[1:])  # the other rows really changed


# ---------------------------------------------------------------------------- fallback, errors
def test_fallback_items_backs_off_to_deepest_existing_prefix() -> None:
    index = {(1,): [10, 11, 12, 13], (1, 2): [10, 11], (1, 2, 3): [10], (2,): [20, 21], (2, 5): [21]}
    codes = torch.tensor([[[1, 2, 3], [1, 2, 9], [2, 7, 7], [-1, -1, -1], [9, 9, 9]]])  # [1, 5, 3]
    res = fallback_items(codes, lambda p: index.get(p, []), k=10)
    assert res.items[0].tolist() == [10, 11, 20, 21] + [-1] * 6
    assert res.depth[0].tolist() == [3, 2, 1, 0, 0]
    res = fallback_items(codes, lambda p: index.get(p, []), k=3)
    assert res.items[0].tolist() == [10, 11, 20]
    res = fallback_items(codes, lambda p: index.get(p, []), k=10, min_depth=2)
    assert res.items[0].tolist() == [10, 11] + [-1] * 8


def test_bad_arguments_raise() -> None:
    ks = [3, 3]
    step = as_step_fn(random_model(ks, 0))
    with pytest.raises(ConfigError, match="diversity_lambda"):
        beam_search(step, 1, 2, ks, 4, diversity_lambda=-1.0)
    with pytest.raises(ConfigError, match="codebook_sizes"):
        beam_search(step, 1, 3, ks, 4)
    with pytest.raises(ConfigError, match="step_fn returned shape"):
        beam_search(lambda p: torch.zeros(p.shape[0], p.shape[1] + 1, 3), 1, 2, ks, 4)
    with pytest.raises(ConfigError, match="NaN"):
        beam_search(lambda p: torch.full((p.shape[0], p.shape[1], 3), math.nan), 1, 2, ks, 4)
    # flagged per level, checked once at the end: the message names the level that went NaN
    with pytest.raises(ConfigError, match="level 2: step_fn returned NaN"):
        beam_search(lambda p: torch.full((p.shape[0], p.shape[1], 3), math.nan if p.shape[2] == 1 else -1.0), 1, 2, ks, 4)
    # deferred: the search returns, its flags wait for the caller's own copy back, which raises the same error
    nan_at_2 = lambda p: torch.full((p.shape[0], p.shape[1], 3), math.nan if p.shape[2] == 1 else -1.0)  # noqa: E731
    with deferred_nan_checks() as pending:
        beam_search(nan_at_2, 1, 2, ks, 4)
        beam_search(step, 1, 2, ks, 4)
    assert [f.tolist() for f in pending] == [[False, True], [False, False]]
    check_nan_flags(pending[1])
    with pytest.raises(ConfigError, match="level 2: step_fn returned NaN"):
        check_nan_flags(pending[0])
    trie = make_trie(np.array([[0, 1]]), [3, 4])
    with pytest.raises(ConfigError, match="trie codebook_sizes"):
        beam_search(step, 1, 2, ks, 4, trie=trie)
