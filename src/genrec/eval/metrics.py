"""Top-K and ranking metrics with the field's definitions (RecBole / SASRec / TIGER / HSTU).

Leave-one-out has exactly one held-out target per case, so Recall@K == HR@K and
NDCG@K = 1 / log2(rank + 1) when the target's 0-based rank < K (else 0); MRR = 1/(rank+1)
over the full list. Full-catalogue scoring is done in user chunks
(:func:`rank_of_targets`) so no users × items matrix is ever held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def rank_of_targets(
    score_fn: Callable[[np.ndarray], np.ndarray],
    n_cases: int,
    targets: np.ndarray,
    *,
    chunk: int = 1024,
    exclude: Callable[[np.ndarray], list[np.ndarray]] | None = None,
) -> np.ndarray:
    """0-based rank of each case's target among all catalogue rows.

    ``score_fn(case_idx[c]) -> float[c, n_items]`` scores a chunk of cases. Ties count
    against the target (pessimistic: rank = number of items scoring >= target, minus one),
    so a constant scorer never looks good. ``exclude`` may return, per case, item rows to
    drop from the ranking (not used by the TIGER protocol, where history items stay in).
    """
    ranks = np.empty(n_cases, dtype=np.int64)
    for lo in range(0, n_cases, chunk):
        idx = np.arange(lo, min(lo + chunk, n_cases))
        s = np.asarray(score_fn(idx), dtype=np.float64)  # [c, N]
        t = targets[idx]
        ts = s[np.arange(len(idx)), t][:, None]
        if exclude is not None:
            for r, rows in enumerate(exclude(idx)):
                rows = rows[rows != t[r]]
                s[r, rows] = -np.inf
        ranks[idx] = (s >= ts).sum(axis=1) - 1
    return ranks


def rank_in_list(retrieved: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """0-based position of each target in its retrieved list, or -1 if absent.

    ``retrieved``: int[c, K] item ids (rows may be padded with -1)."""
    hit = retrieved == targets[:, None]
    pos = np.where(hit.any(axis=1), hit.argmax(axis=1), -1)
    return pos.astype(np.int64)


def place_target(top: np.ndarray, ranks: np.ndarray, targets: np.ndarray, k: int) -> np.ndarray:
    """Each case's ranked top-``k`` list, with its target at exactly its metric rank.

    ``top``: int[c, m] rows in descending score order, ``m >= k + 1`` (or the whole catalogue),
    ties in any order; ``ranks``: the pessimistic 0-based ranks of :func:`rank_of_targets` (every
    item scoring >= the target ahead of it). The target is taken out and put back at its rank
    (left out when that is >= ``k``), so the list ranks ties against the target as the metric
    does and a scorer of the list finds the metric's rank. int[c, k], -1 padded."""
    out = np.full((len(top), k), -1, dtype=np.int64)
    for i in range(len(top)):
        t, r = int(targets[i]), int(ranks[i])
        lst = [int(x) for x in top[i] if x != t and x >= 0]
        if 0 <= r < k:
            lst.insert(r, t)
        lst = lst[:k]
        out[i, :len(lst)] = lst
    return out


def topk_metrics(ranks: np.ndarray, ks: Sequence[int] = (5, 10, 20)) -> dict[str, float]:
    """Recall@K (= HR@K with one target), NDCG@K and MRR from 0-based ranks (-1 = not found).

    MRR is truncated at the largest K (a target ranked past it counts 0), so that a path ranking the
    whole catalogue (ANN, popularity) and one returning a K-item list (SID beams, L0+L1) are measured
    alike (audit: the untruncated column had ordered ANN above L0+L1, the truncated one the reverse)."""
    ranks = np.asarray(ranks)
    found = ranks >= 0
    out: dict[str, float] = {}
    n = max(len(ranks), 1)
    for k in ks:
        inside = found & (ranks < k)
        out[f"recall@{k}"] = float(inside.sum() / n)
        out[f"ndcg@{k}"] = float((1.0 / np.log2(ranks[inside] + 2.0)).sum() / n)
    top = found & (ranks < max(ks)) if len(ks) else found
    out["mrr"] = float((1.0 / (ranks[top] + 1.0)).sum() / n)
    out["n"] = float(len(ranks))
    return out


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC via the rank-sum (Mann-Whitney U) statistic, ties averaged. NaN if one class is absent."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    n_pos = int(labels.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s_sorted = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    i = 0
    while i < len(s_sorted):
        j = i
        while j + 1 < len(s_sorted) and s_sorted[j + 1] == s_sorted[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def hit_at_k_per_slate(scores: Sequence[np.ndarray], labels: Sequence[np.ndarray], k: int = 3) -> np.ndarray:
    """Each slate's term of :func:`hit_at_k_slates`: (#positives among the k highest-scored items)
    / min(k, #positives); NaN for a slate without positives. Ties count against the positives."""
    vals = np.full(len(labels), np.nan)
    for i, (s, y) in enumerate(zip(scores, labels)):
        y = np.asarray(y).astype(bool)
        if y.any():
            top = np.lexsort((y, -np.asarray(s, dtype=np.float64)))[:k]  # by score, then negatives first
            vals[i] = y[top].sum() / min(k, int(y.sum()))
    return vals


def hit_at_k_slates(scores: Sequence[np.ndarray], labels: Sequence[np.ndarray], k: int = 3) -> float:
    """UniPinRec's Hit@k over slates: the share of positives that the model ranks in its top k.

    For each slate with at least one positive: (#positives among the k highest-scored items)
    / min(k, #positives) (:func:`hit_at_k_per_slate`); averaged over such slates. Ties count
    against the positives (among equal scores the negatives rank first), so a constant scorer
    scores its chance level or less.
    """
    vals = hit_at_k_per_slate(scores, labels, k)
    vals = vals[np.isfinite(vals)]
    return float(vals.mean()) if len(vals) else float("nan")
