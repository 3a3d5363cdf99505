"""Non-neural baselines measured in the same run and split as genrec.

* :class:`Popularity` -- items ranked by their count in the training events; the floor any
  learned model must clear.
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
