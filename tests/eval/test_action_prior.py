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
