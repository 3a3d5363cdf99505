"""Non-neural baselines measured in the same run and split as genrec.

* :class:`Popularity` -- items ranked by their count in the training events; the floor any
  learned model must clear.
* :class:`ActionPrior` -- the action heads' floor: a candidate's chance of each action from counts alone, the
  user's own habit (its history's actions) and the item's (its training events' actions).
"""

from __future__ import annotations

import numpy as np

from genrec.eval.metrics import rank_of_targets


class Popularity:
    """Score every catalogue row by its training-split interaction count."""

    def __init__(self, catalogue_ids: np.ndarray, train_item_ids: np.ndarray) -> None:
        self.catalogue_ids = np.asarray(catalogue_ids, dtype=np.int64)
        order = np.argsort(self.catalogue_ids)
        rows = np.searchsorted(self.catalogue_ids, train_item_ids, sorter=order)
        rows = order[np.clip(rows, 0, len(order) - 1)]
        known = self.catalogue_ids[rows] == train_item_ids
        self.counts = np.bincount(rows[known], minlength=len(self.catalogue_ids)).astype(np.float64)
        # tiny deterministic tie-break so equal counts do not all tie with the target
        self.scores = self.counts + np.linspace(0, 1e-6, len(self.counts))[::-1]

    def score(self, n_cases: int) -> np.ndarray:
        """[n_cases, N] scores (the same row for every case)."""
        return np.broadcast_to(self.scores, (n_cases, len(self.scores)))

    def target_ranks(self, target_rows: np.ndarray) -> np.ndarray:
        """Each case's 0-based rank of its target catalogue row (the metrics' ranks)."""
        rows = np.asarray(target_rows)
        return rank_of_targets(lambda idx: self.score(len(idx)), len(rows), rows)

    def topk(self, k: int) -> np.ndarray:
        return self.catalogue_ids[np.argsort(-self.scores, kind="stable")[:k]]


class ActionPrior:
    """Each action's chance for a candidate from counts, no model: the mean of the user's share of the action
    among its history's actions and the item's share among its training events' actions, each add-one smoothed
    over the ``n_actions`` actions. On slates (:class:`genrec.eval.ranking.Slate`) it tells how much of an
    action head's AUC a user's rating habit and an item's reputation already give."""

    def __init__(self, n_catalog: int, rows: np.ndarray, actions: np.ndarray, n_actions: int) -> None:
        rows, actions = np.asarray(rows, np.int64), np.asarray(actions, np.int64)
        if rows.shape != actions.shape:
            raise ValueError(f"ActionPrior: {len(rows)} rows but {len(actions)} actions")
        ok = (rows >= 0) & (rows < n_catalog) & (actions >= 0) & (actions < n_actions)
        self.n_actions = n_actions
        self.counts = np.zeros((n_catalog, n_actions), np.float64)  # per catalogue row, its events of each action
        np.add.at(self.counts, (rows[ok], actions[ok]), 1.0)

    def _shares(self, counts: np.ndarray) -> np.ndarray:
        return (counts + 1.0) / (counts.sum(-1, keepdims=True) + self.n_actions)

    def probs(self, history_actions: np.ndarray, cand_rows: np.ndarray) -> np.ndarray:
        """``[k, n_actions]`` for the candidates ``cand_rows`` of a user whose history logged ``history_actions``
        (action ids; other values, e.g. the [MASK] class, are not counted)."""
        a = np.asarray(history_actions, np.int64)
        a = a[(a >= 0) & (a < self.n_actions)]
        user = self._shares(np.bincount(a, minlength=self.n_actions).astype(np.float64))
        return 0.5 * (user[None, :] + self._shares(self.counts[np.asarray(cand_rows, np.int64)]))
