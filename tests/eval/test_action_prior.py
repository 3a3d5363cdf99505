"""The action heads' counts floor (genrec.eval.baselines.ActionPrior): its counts against a loop, its shares, and
that it reads a user's habit and an item's reputation."""

from __future__ import annotations

import numpy as np
import pytest

from genrec.eval.baselines import ActionPrior
from genrec.eval.metrics import auc


def _slow_probs(n_catalog: int, rows: np.ndarray, acts: np.ndarray, n_act: int, hist: np.ndarray,
                cands: np.ndarray) -> np.ndarray:
    """The definition, a loop at a time: add-one shares of the user's history and of each item's events."""
    item = [[1.0] * n_act for _ in range(n_catalog)]
    for r, a in zip(rows.tolist(), acts.tolist()):
        if 0 <= r < n_catalog and 0 <= a < n_act:
            item[r][a] += 1.0
    user = [1.0] * n_act
    for a in hist.tolist():
        if 0 <= a < n_act:
            user[a] += 1.0
    out = np.zeros((len(cands), n_act))
    for i, c in enumerate(cands.tolist()):
        for a in range(n_act):
            out[i, a] = 0.5 * (user[a] / sum(user) + item[c][a] / sum(item[c]))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_probs_equal_the_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_cat, n_act = int(rng.integers(1, 30)), int(rng.integers(1, 5))
    rows = rng.integers(-2, n_cat + 2, 200)  # unknown rows (-1, past the catalogue) are not counted
    acts = rng.integers(0, n_act + 1, 200)  # n_act: the [MASK] class, not counted
    hist = rng.integers(0, n_act + 1, int(rng.integers(0, 20)))
    cands = rng.integers(0, n_cat, 7)
    got = ActionPrior(n_cat, rows, acts, n_act).probs(hist, cands)
    np.testing.assert_allclose(got, _slow_probs(n_cat, rows, acts, n_act, hist, cands), rtol=1e-12)
    np.testing.assert_allclose(got.sum(1), 1.0, rtol=1e-12)  # one action's share each: a distribution


def test_it_reads_the_users_habit_and_the_items_reputation() -> None:
    """Users who always log action 0 and items that always get action 1: the prior ranks by both."""
    n_act = 2
    habit = ActionPrior(4, np.zeros(0, np.int64), np.zeros(0, np.int64), n_act)  # no item events: habit alone
    p_habit0 = habit.probs(np.zeros(9, np.int64), np.array([0]))[0]
    p_habit1 = habit.probs(np.ones(9, np.int64), np.array([0]))[0]
    assert auc(np.array([p_habit0[0], p_habit1[0]]), np.array([True, False])) == 1.0
    rep = ActionPrior(4, np.array([2, 2, 2, 3, 3, 3]), np.array([1, 1, 1, 0, 0, 0]), n_act)  # item 2: action 1
    p = rep.probs(np.zeros(0, np.int64), np.array([2, 3]))
    assert p[0, 1] > p[1, 1] and p[1, 0] > p[0, 0]


def test_rows_and_actions_must_pair() -> None:
    with pytest.raises(ValueError, match="3 rows but 2 actions"):
        ActionPrior(4, np.array([0, 1, 2]), np.array([0, 1]), 2)


def test_action_indices_equal_a_dict_lookup() -> None:
    """The events' action names to the model's action indices, vectorised (genrec eval reads every train event)."""
    import pyarrow as pa

    from genrec.eval.evaluate import action_indices

    rng = np.random.default_rng(0)
    vocab = ["view", "like", "dislike", "share"]
    actions = ["view", "like", "dislike"]  # "share": not the model's, -1
    names = [vocab[i] for i in rng.integers(0, len(vocab), 300)]
    chunks = pa.chunked_array([names[:100], names[100:100], names[100:]], type=pa.string())
    want = [actions.index(n) if n in actions else -1 for n in names]
    assert action_indices(chunks, actions).tolist() == want


def _slates(rng: np.random.Generator, n: int, n_cat: int, n_act: int, habit: bool = False) -> tuple[list, list]:
    """``n`` slates of one or two logged items (one action each) and 3 sampled negatives, with head probabilities;
    ``habit``: each user logs one action throughout (its history and its logged items), the heads blind to it."""
    from genrec.eval.ranking import Slate

    slates, probs = [], []
    for _ in range(n):
        fav = int(rng.integers(0, n_act))
        hist = np.full(8, fav) if habit else rng.integers(0, n_act + 1, 8)  # n_act: [MASK], not counted
        n_logged = int(rng.integers(1, 3))
        acts = np.full(n_logged, fav) if habit else rng.integers(0, n_act, n_logged)
        cands = rng.integers(0, n_cat, n_logged + 3)
        labels = np.concatenate([1 << acts, np.zeros(3, np.int64)])
        slates.append(Slate(rng.integers(0, n_cat, 8), hist, np.zeros(8, np.int64), np.zeros(8, np.int64), cands,
                            labels, 0, 0, n_sampled=3))
        probs.append(np.repeat(rng.uniform(0.05, 0.95, (len(cands), 1)), n_act, 1) if habit
                     else rng.uniform(0.01, 0.99, (len(cands), n_act)))
    return slates, probs


@pytest.mark.parametrize("seed", range(3))
def test_calibration_is_the_regularised_optimum(seed: int) -> None:
    """Each action's fitted weights zero the gradient of its loss, written item by item (the slow twin)."""
    from genrec.eval.baselines import ClassCalibration

    rng = np.random.default_rng(seed)
    n_cat, n_act, l2 = 20, 3, 1e-2
    prior = ActionPrior(n_cat, rng.integers(0, n_cat, 300), rng.integers(0, n_act, 300), n_act)
    slates, probs = _slates(rng, 60, n_cat, n_act)
    cal = ClassCalibration.fit(probs, slates, prior, l2=l2)
    xs, ys = [], []
    for p, s in zip(probs, slates):
        user, item = prior.parts(s.actions, s.cand_rows)
        for i in range(s.logged.stop):  # the logged items only
            xs.append((ClassCalibration.inputs(p[i:i + 1], user, item[i:i + 1])[0] - cal.mean) / cal.scale)
            ys.append([(int(s.labels[i]) >> c) & 1 for c in range(n_act)])
    for c in range(n_act):
        grad_w, grad_b = np.zeros(len(cal.mean)), 0.0
        for x, y in zip(xs, ys):
            q = 1.0 / (1.0 + np.exp(-(float(x @ cal.weights[c]) + cal.bias[c])))
            grad_w += (q - y[c]) * x / len(xs)
            grad_b += (q - y[c]) / len(xs)
        grad_w += l2 * cal.weights[c]
        assert np.abs(grad_w).max() < 1e-8 and abs(grad_b) < 1e-8


def test_calibration_reads_the_class_among_the_engaged() -> None:
    """Heads that know who engages but not how (the same probability for every action): their AUC per action
    among the logged items is chance; calibrated with the users' habit beside them, fresh slates read near 1."""
    from genrec.eval.baselines import ClassCalibration
    from genrec.eval.ranking import slate_metrics

    rng = np.random.default_rng(0)
    n_cat, n_act = 15, 3
    prior = ActionPrior(n_cat, rng.integers(0, n_cat, 200), rng.integers(0, n_act, 200), n_act)
    fit_on, fit_probs = _slates(rng, 200, n_cat, n_act, habit=True)
    test, test_probs = _slates(rng, 200, n_cat, n_act, habit=True)
    acts, u = [str(c) for c in range(n_act)], np.ones(n_act)
    raw = slate_metrics(test_probs, test, acts, acts, u)["auc"]
    got = slate_metrics(ClassCalibration.fit(fit_probs, fit_on, prior).apply(test_probs, test, prior), test, acts,
                        acts, u)["auc"]
    assert all(abs(raw[a] - 0.5) < 0.1 for a in acts), raw
    assert all(got[a] > 0.95 for a in acts), got


def test_calibration_ignores_the_sampled_negatives() -> None:
    """Fitted on the logged items: the sampled candidates' head probabilities do not move it."""
    from genrec.eval.baselines import ClassCalibration

    rng = np.random.default_rng(1)
    prior = ActionPrior(10, rng.integers(0, 10, 50), rng.integers(0, 2, 50), 2)
    slates, probs = _slates(rng, 30, 10, 2)
    other = [np.concatenate([p[s.logged], rng.uniform(0.01, 0.99, (s.n_sampled, 2))]) for p, s in zip(probs, slates)]
    a, b = ClassCalibration.fit(probs, slates, prior), ClassCalibration.fit(other, slates, prior)
    np.testing.assert_array_equal(a.weights, b.weights)
    with pytest.raises(ValueError, match="no logged items"):
        ClassCalibration.fit([], [], prior)
