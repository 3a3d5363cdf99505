"""The paired bootstrap against cases whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from genrec.errors import ConfigError
from genrec.eval.significance import paired_bootstrap


def test_identical_variants_differ_by_exactly_zero() -> None:
    x = np.random.default_rng(0).normal(size=200)
    res = paired_bootstrap({"a": lambda i: x[i].mean(), "b": lambda i: x[i].mean()}, 200, n_boot=300)
    d = res[("a", "b")]
    assert d.observed == 0 and d.low == 0 and d.high == 0 and d.p_greater == 0.5 and not d.decided


def test_a_constant_per_case_gain_is_found_exactly_and_both_orders_agree() -> None:
    x = np.random.default_rng(1).normal(size=150)
    res = paired_bootstrap({"base": lambda i: x[i].mean(), "better": lambda i: (x[i] + 0.1).mean()}, 150, n_boot=300)
    up, down = res[("better", "base")], res[("base", "better")]
    assert up.observed == pytest.approx(0.1) and up.low == pytest.approx(0.1) and up.high == pytest.approx(0.1)
    assert up.decided and up.p_greater == 1.0 and down.p_greater == 0.0 and down.high == pytest.approx(-0.1)


def test_pairing_sees_a_small_gain_that_unpaired_noise_would_hide() -> None:
    """Per-case scores with a large shared component: the paired interval of a +0.02 gain excludes
    0, although each variant's own spread (sd ~ 1/sqrt(n)) is much larger than 0.02."""
    rng = np.random.default_rng(2)
    n = 400
    shared = rng.normal(size=n)
    a, b = shared + 0.02 + 0.01 * rng.normal(size=n), shared + 0.01 * rng.normal(size=n)
    res = paired_bootstrap({"a": lambda i: a[i].mean(), "b": lambda i: b[i].mean()}, n, n_boot=500, seed=3)
    d = res[("a", "b")]
    assert d.decided and d.low > 0 and abs(d.observed - 0.02) < 0.005
    assert shared.std() / np.sqrt(n) > 2 * 0.02  # unpaired, the two means' intervals would overlap


def test_the_interval_matches_a_plain_loop_twin() -> None:
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=60), rng.normal(size=60)
    got = paired_bootstrap({"x": lambda i: x[i].mean(), "y": lambda i: np.median(y[i])}, 60, n_boot=200, seed=9)
    r = np.random.default_rng(9)
    diffs = []
    for _ in range(200):
        i = r.integers(0, 60, 60)
        diffs.append(x[i].mean() - np.median(y[i]))
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    d = got[("x", "y")]
    assert d.low == pytest.approx(lo) and d.high == pytest.approx(hi)
    assert d.p_greater == pytest.approx(np.mean(np.array(diffs) > 0))


def test_nan_resamples_are_left_out_and_bad_arguments_named() -> None:
    calls = {"n": 0}

    def sometimes_nan(i: np.ndarray) -> float:
        calls["n"] += 1
        return float("nan") if calls["n"] % 2 == 0 else 1.0

    res = paired_bootstrap({"a": sometimes_nan, "b": lambda i: 0.0}, 10, n_boot=20)
    assert res[("a", "b")].low == 1.0  # only the finite resamples count
    with pytest.raises(ConfigError, match="at least one case"):
        paired_bootstrap({"a": lambda i: 0.0}, 0)
    with pytest.raises(ConfigError, match="n_boot"):
        paired_bootstrap({"a": lambda i: 0.0}, 5, n_boot=0)


def test_paired_topk_equals_the_bootstrap_of_topk_metrics_and_formats_cells() -> None:
    from genrec.eval.metrics import topk_metrics
    from genrec.eval.significance import paired_topk

    rng = np.random.default_rng(3)
    ranks = {v: rng.integers(-1, 30, 200) for v in ("a", "b", "c")}
    got = paired_topk(ranks, "ndcg@10", n_boot=300, seed=5)
    want = paired_bootstrap({v: (lambda idx, r=r: topk_metrics(r[idx], (10,))["ndcg@10"]) for v, r in ranks.items()},
                            200, n_boot=300, seed=5)
    assert got == want
    d = got[("a", "b")]
    mark = " **decided**" if d.decided else ""
    assert d.cells() == f"{d.observed:+.4f} | [{d.low:+.4f}, {d.high:+.4f}]{mark} | {d.p_greater:.3f}"
    with pytest.raises(ConfigError, match="same cases"):
        paired_topk({"a": ranks["a"], "b": ranks["b"][:10]})
    with pytest.raises(ConfigError, match="recall@K"):
        paired_topk(ranks, "mrr")


def test_paired_ratio_matches_a_plain_loop_twin_and_is_one_for_one_system() -> None:
    from genrec.eval.metrics import topk_metrics
    from genrec.eval.significance import paired_ratio

    rng = np.random.default_rng(6)
    a, b = rng.integers(-1, 25, 300), rng.integers(-1, 25, 300)
    got = paired_ratio(a, b, "recall@10", n_boot=250, seed=2)
    r = np.random.default_rng(2)
    ratios = []
    for _ in range(250):
        i = r.integers(0, 300, 300)
        ratios.append(topk_metrics(a[i], (10,))["recall@10"] / topk_metrics(b[i], (10,))["recall@10"])
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    full = topk_metrics(a, (10,))["recall@10"] / topk_metrics(b, (10,))["recall@10"]
    assert got.observed == pytest.approx(full) and got.low == pytest.approx(lo) and got.high == pytest.approx(hi)
    assert got.p_greater == pytest.approx(np.mean(np.array(ratios) > 1) + 0.5 * np.mean(np.array(ratios) == 1))
    same = paired_ratio(a, a, "ndcg@10", n_boot=50)
    assert same.observed == same.low == same.high == 1.0
    better = np.where(b >= 10, 0, b)  # every miss at 10 turned into a hit: strictly above on every resample
    assert paired_ratio(better, b, n_boot=100).low > 1
    with pytest.raises(ConfigError, match="same cases"):
        paired_ratio(a, b[:5])
