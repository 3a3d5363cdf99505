"""paired_slates: the paired bootstrap of AUC per action and Hit@3 over slates, checked against
slate_metrics (the metrics as eval reports them) on the full set and on one explicit resample."""

from __future__ import annotations

import numpy as np
import pytest

from genrec.eval.ranking import Slate, paired_slates, slate_metrics

ACTIONS = ["view", "like", "dislike"]
POSITIVE = ["view", "like"]


def _slates(rng: np.random.Generator, n: int) -> list[Slate]:
    out = []
    for _ in range(n):
        logged, sampled = int(rng.integers(1, 4)), int(rng.integers(0, 5))
        labels = np.concatenate([rng.choice([1, 2, 3, 4], logged), np.zeros(sampled, np.int64)]).astype(np.int64)
        z = np.zeros(2, np.int64)
        out.append(Slate(z, z, z, z, rng.integers(0, 50, logged + sampled), labels, 0, 0, n_sampled=sampled))
    return out


def _probs(rng: np.random.Generator, slates: list[Slate]) -> list[np.ndarray]:
    return [rng.random((len(s.cand_rows), len(ACTIONS))) for s in slates]


def _metrics(probs, slates, u):
    m = slate_metrics(probs, slates, ACTIONS, POSITIVE, u)
    return {**{f"auc/{a}": v for a, v in m["auc"].items()}, "hit@3": m["hit@3"]}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_observed_and_one_resample_equal_slate_metrics(seed):
    rng = np.random.default_rng(seed)
    slates = _slates(rng, 60)
    probs = {"a": _probs(rng, slates), "b": _probs(rng, slates)}
    u = {"a": np.array([1.0, 1.0, -1.0]), "b": np.array([1.0, 2.0, -1.0])}
    res = paired_slates(probs, slates, ACTIONS, POSITIVE, u, n_boot=1, seed=seed)
    full = {v: _metrics(probs[v], slates, u[v]) for v in probs}
    idx = np.random.default_rng(seed).integers(0, len(slates), len(slates))  # paired_bootstrap's one resample
    sub = [slates[i] for i in idx]
    once = {v: _metrics([probs[v][i] for i in idx], sub, u[v]) for v in probs}
    assert set(res) == set(full["a"])
    for metric, diffs in res.items():
        d = diffs[("a", "b")]
        assert d.observed == pytest.approx(full["a"][metric] - full["b"][metric])
        assert d.low == pytest.approx(once["a"][metric] - once["b"][metric])
        assert d.high == pytest.approx(d.low)
        assert diffs[("b", "a")].observed == pytest.approx(-d.observed)


def test_identical_variants_tie_and_a_perfect_scorer_is_decided():
    rng = np.random.default_rng(7)
    slates = _slates(rng, 200)
    noise = _probs(rng, slates)
    bits = 1 << np.arange(len(ACTIONS))
    perfect = [((s.labels[:, None] & bits) > 0).astype(float) * 0.9 + 0.05 * rng.random((len(s.labels), 3))
               for s in slates]
    u = {v: np.array([1.0, 1.0, -1.0]) for v in ("noise", "same", "perfect")}
    res = paired_slates({"noise": noise, "same": noise, "perfect": perfect}, slates, ACTIONS, POSITIVE, u,
                        n_boot=300)
    for metric, diffs in res.items():
        same = diffs[("noise", "same")]
        assert (same.observed, same.low, same.high, same.p_greater) == (0.0, 0.0, 0.0, 0.5)
        better = diffs[("perfect", "noise")]
        assert better.decided and better.low > 0, metric
