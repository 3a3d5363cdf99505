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

__all__ = ["PairedDiff", "paired_bootstrap", "paired_ratio", "paired_topk"]


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
    observed, draws = _resample(metrics, n_cases, n_boot, seed)
    out: dict[tuple[str, str], PairedDiff] = {}
    for a, b in permutations(range(len(names)), 2):
        out[(names[a], names[b])] = _interval(observed[a] - observed[b], draws[:, a] - draws[:, b], 0.0, level)
    return out


def _resample(metrics: Mapping[str, Callable[[np.ndarray], float]], n_cases: int, n_boot: int,
              seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Every variant's metric on all cases [V] and on ``n_boot`` resamples of them, one per row [n_boot, V]."""
    names = list(metrics)
    full = np.arange(n_cases)
    observed = np.array([float(metrics[v](full)) for v in names])
    rng = np.random.default_rng(seed)
    draws = np.empty((n_boot, len(names)))
    for i in range(n_boot):
        idx = rng.integers(0, n_cases, n_cases)
        draws[i] = [metrics[v](idx) for v in names]
    return observed, draws


def _interval(observed: float, d: np.ndarray, above: float, level: float) -> PairedDiff:
    """The percentile interval of the finite resampled statistics ``d`` and the share above ``above``."""
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return PairedDiff(observed, float("nan"), float("nan"), float("nan"))
    q = (1 - level) / 2
    lo, hi = (float(x) for x in np.quantile(d, [q, 1 - q]))
    return PairedDiff(observed, lo, hi, float(np.mean(d > above) + 0.5 * np.mean(d == above)))


def paired_ratio(a: np.ndarray, b: np.ndarray, metric: str = "recall@10", *, n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> PairedDiff:
    """``metric(a) / metric(b)`` of two systems' per-case 0-based target ranks over the same cases (-1: not
    retrieved): the ratio on all cases, its paired bootstrap percentile interval, and the share of resamples in
    which it is > 1. "A reaches 1.10x B" is decided when ``low >= 1.10``. Resamples where B scores 0 are left out."""
    f = _topk_metric(metric)
    a, b = np.asarray(a), np.asarray(b)
    if len(a) != len(b):
        raise ConfigError(f"a ratio needs ranks for the same cases, got {len(a)} and {len(b)}")
    observed, draws = _resample({"a": lambda i: f(a[i]), "b": lambda i: f(b[i])}, len(a), n_boot, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = observed[0] / observed[1] if observed[1] else float("nan")
        return _interval(float(ratio), draws[:, 0] / draws[:, 1], 1.0, level)


def _topk_metric(metric: str) -> Callable[[np.ndarray], float]:
    """``recall@K`` / ``ndcg@K`` of an array of per-case 0-based ranks."""
    name, _, k = metric.partition("@")
    if name not in ("recall", "ndcg") or not k.isdigit():
        raise ConfigError(f"metric must be recall@K or ndcg@K, got {metric!r}")
    return lambda r: topk_metrics(r, (int(k),))[metric]


def paired_topk(ranks: Mapping[str, np.ndarray], metric: str = "recall@10", *, n_boot: int = 2000,
                seed: int = 0) -> dict[tuple[str, str], PairedDiff]:
    """:func:`paired_bootstrap` of a top-K retrieval metric (``recall@K`` / ``ndcg@K``) from every
    variant's per-case 0-based target ranks (-1: not retrieved), all over the same cases."""
    f = _topk_metric(metric)
    sizes = {len(r) for r in ranks.values()}
    if len(sizes) != 1:
        raise ConfigError(f"every variant needs ranks for the same cases, got lengths {sorted(sizes)}")
    def of(r: np.ndarray) -> Callable[[np.ndarray], float]:
        return lambda idx: f(r[idx])

    return paired_bootstrap({v: of(np.asarray(r)) for v, r in ranks.items()}, sizes.pop(), n_boot=n_boot, seed=seed)
