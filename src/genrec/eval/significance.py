"""Paired bootstrap over evaluation cases: is variant A's metric above variant B's?

Every variant is scored on the SAME cases (users, or feedview slates), so their per-case results
are correlated and the difference of two metrics is far less noisy than either metric: a paired
bootstrap resamples the cases once per round and recomputes every variant's metric on that one
resample. Works for metrics that are not means of per-case values (a pooled AUC, Hit@K over
slates) because the metric is recomputed, not averaged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import permutations

import numpy as np

from genrec.errors import ConfigError
from genrec.eval.metrics import topk_metrics

__all__ = ["PairedDiff", "paired_bootstrap", "paired_topk"]


@dataclass(frozen=True)
class PairedDiff:
    """``metric(a) - metric(b)``: on the full set, its bootstrap percentile interval, and the share
    of resamples in which it is > 0 (ties count half)."""

    observed: float
    low: float
    high: float
    p_greater: float

    @property
    def decided(self) -> bool:
        """The interval excludes 0."""
        return self.low > 0 or self.high < 0

    def cells(self) -> str:
        """Markdown table cells: difference | interval (marked when decided) | P(> 0)."""
        mark = " **decided**" if self.decided else ""
        return f"{self.observed:+.4f} | [{self.low:+.4f}, {self.high:+.4f}]{mark} | {self.p_greater:.3f}"


def paired_bootstrap(metrics: Mapping[str, Callable[[np.ndarray], float]], n_cases: int, *, n_boot: int = 2000,
                     seed: int = 0, level: float = 0.95) -> dict[tuple[str, str], PairedDiff]:
    """``metrics[v](idx)``: variant v's metric on the cases ``idx`` (int array, with repeats).
    Returns a :class:`PairedDiff` for every ordered pair of variants. NaN resamples (e.g. an
    AUC on a resample with one class) are left out of that pair's interval."""
    if n_cases < 1:
        raise ConfigError(f"paired bootstrap needs at least one case, got {n_cases}")
    if n_boot < 1 or not 0 < level < 1:
        raise ConfigError(f"n_boot must be >= 1 and level in (0, 1), got {n_boot}, {level}")
    names = list(metrics)
    full = np.arange(n_cases)
    observed = {v: float(metrics[v](full)) for v in names}
    rng = np.random.default_rng(seed)
    draws = np.empty((n_boot, len(names)))
    for i in range(n_boot):
        idx = rng.integers(0, n_cases, n_cases)
        draws[i] = [metrics[v](idx) for v in names]
    out: dict[tuple[str, str], PairedDiff] = {}
    q = (1 - level) / 2
    for a, b in permutations(range(len(names)), 2):
        d = draws[:, a] - draws[:, b]
        d = d[np.isfinite(d)]
        if len(d) == 0:
            lo = hi = p = float("nan")
        else:
            lo, hi = (float(x) for x in np.quantile(d, [q, 1 - q]))
            p = float(np.mean(d > 0) + 0.5 * np.mean(d == 0))
        out[(names[a], names[b])] = PairedDiff(observed[names[a]] - observed[names[b]], lo, hi, p)
    return out


def paired_topk(ranks: Mapping[str, np.ndarray], metric: str = "recall@10", *, n_boot: int = 2000,
                seed: int = 0) -> dict[tuple[str, str], PairedDiff]:
    """:func:`paired_bootstrap` of a top-K retrieval metric (``recall@K`` / ``ndcg@K``) from every
    variant's per-case 0-based target ranks (-1: not retrieved), all over the same cases."""
    name, _, k = metric.partition("@")
    if name not in ("recall", "ndcg") or not k.isdigit():
        raise ConfigError(f"metric must be recall@K or ndcg@K, got {metric!r}")
    sizes = {len(r) for r in ranks.values()}
    if len(sizes) != 1:
        raise ConfigError(f"every variant needs ranks for the same cases, got lengths {sorted(sizes)}")
    def of(r: np.ndarray) -> Callable[[np.ndarray], float]:
        return lambda idx: topk_metrics(r[idx], (int(k),))[metric]

    return paired_bootstrap({v: of(np.asarray(r)) for v, r in ranks.items()}, sizes.pop(), n_boot=n_boot, seed=seed)
