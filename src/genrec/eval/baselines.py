"""Non-neural baselines measured in the same run and split as genrec.

* :class:`Popularity` -- items ranked by their count in the training events; the floor any
  learned model must clear.
* :class:`ActionPrior` -- the action heads' floor: a candidate's chance of each action from counts alone, the
  user's own habit (its history's actions) and the item's (its training events' actions).
* :class:`ClassCalibration` -- the heads' reading of an action *among the engaged items*, calibrated on validation
  slates with those counts beside them: what an action's AUC over the logged items asks, which the raw heads (each
  folding in the chance of engaging at all) answer only in part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from genrec.eval.metrics import rank_of_targets

if TYPE_CHECKING:
    from genrec.eval.ranking import Slate


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

    def parts(self, history_actions: np.ndarray, cand_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The user's shares ``[n_actions]`` (its history's ``history_actions``: action ids; other values, e.g. the
        [MASK] class, are not counted) and the candidates' (``cand_rows``) item shares ``[k, n_actions]``."""
        a = np.asarray(history_actions, np.int64)
        a = a[(a >= 0) & (a < self.n_actions)]
        user = self._shares(np.bincount(a, minlength=self.n_actions).astype(np.float64))
        return user, self._shares(self.counts[np.asarray(cand_rows, np.int64)])

    def probs(self, history_actions: np.ndarray, cand_rows: np.ndarray) -> np.ndarray:
        """``[k, n_actions]`` for the candidates ``cand_rows`` of a user whose history logged ``history_actions``:
        the mean of the user's and the item's shares (:meth:`parts`)."""
        user, item = self.parts(history_actions, cand_rows)
        return 0.5 * (user[None, :] + item)


class ClassCalibration:
    """Each action's chance among the engaged items, from the heads and the counts: per action, a logistic
    regression (L2, standardised inputs) on the candidates' head logits, the heads' shares ``p_c / sum p`` (log),
    and the user's and the item's action shares of :class:`ActionPrior` (log), ``4 * n_actions`` inputs, fitted on
    the LOGGED items of slates (:class:`genrec.eval.ranking.Slate`; the sampled negatives engaged with nothing) with
    their actions as labels. Fit it on validation slates, apply it to test: the heads' AUC among the engaged, with
    the user's habit and the item's reputation handed to it, against the counts floor alone."""

    def __init__(self, weights: np.ndarray, bias: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> None:
        self.weights, self.bias, self.mean, self.scale = weights, bias, mean, scale  # [C, F], [C], [F], [F]

    @staticmethod
    def inputs(probs: np.ndarray, user: np.ndarray, item: np.ndarray) -> np.ndarray:
        """``[k, 4C]``: logit p, log(p / sum p), log user share, log item share (``probs``: ``[k, C]`` sigmoids)."""
        p = np.clip(np.asarray(probs, np.float64), 1e-6, 1 - 1e-6)
        k = len(p)
        return np.concatenate([np.log(p / (1 - p)), np.log(p / p.sum(1, keepdims=True)),
                               np.log(np.broadcast_to(user, (k, len(user)))), np.log(item)], 1)

    @classmethod
    def fit(cls, probs: Sequence[np.ndarray], slates: Sequence["Slate"], prior: ActionPrior, *, l2: float = 1e-3,
            steps: int = 50) -> "ClassCalibration":
        """Newton steps on each action's mean log loss + ``l2 / 2 * |w|^2`` over the slates' logged items."""
        if not any(s.logged.stop > 0 for s in slates):
            raise ValueError("ClassCalibration.fit: the slates hold no logged items")
        x = np.concatenate([cls.inputs(p[s.logged], *prior.parts(s.actions, s.cand_rows[s.logged]))
                            for p, s in zip(probs, slates)])
        bits = 1 << np.arange(prior.n_actions)
        y = (np.concatenate([s.labels[s.logged] for s in slates])[:, None] & bits) > 0
        mean, scale = x.mean(0), x.std(0) + 1e-9
        z = np.concatenate([(x - mean) / scale, np.ones((len(x), 1))], 1)  # the last column: the bias
        reg = np.full(z.shape[1], l2)
        reg[-1] = 0.0
        w = np.zeros((prior.n_actions, z.shape[1]))
        for c in range(prior.n_actions):
            for _ in range(steps):
                q = 1.0 / (1.0 + np.exp(-(z @ w[c])))
                grad = z.T @ (q - y[:, c]) / len(z) + reg * w[c]
                hess = (z * (q * (1 - q))[:, None]).T @ z / len(z) + np.diag(reg + 1e-9)
                step = np.linalg.solve(hess, grad)
                w[c] -= step
                if np.abs(step).max() < 1e-10:
                    break
        return cls(w[:, :-1], w[:, -1], mean, scale)

    def apply(self, probs: Sequence[np.ndarray], slates: Sequence["Slate"], prior: ActionPrior) -> list[np.ndarray]:
        """Per slate, ``[k, C]``: each candidate's calibrated chance of each action among the engaged (``prior``:
        the counts of the slates' own split)."""
        out = []
        for p, s in zip(probs, slates):
            z = (self.inputs(p, *prior.parts(s.actions, s.cand_rows)) - self.mean) / self.scale
            out.append(1.0 / (1.0 + np.exp(-(z @ self.weights.T + self.bias))))
        return out
