"""Count-min sketch of item frequency, used for the logQ correction of sampled softmax.

UniPinRec §3.0.1 (eq. 1) scores a candidate as ``λ·uᵀi − log Q(i)`` where ``Q(i)`` is the
estimated probability that ``i`` is drawn as a (in-batch) candidate; the paper estimates it
with a count-min sketch over the stream of training positives. This module is that sketch.

Guarantee (Cormode & Muthukrishnan 2005): with ``width = ceil(e / ε)`` and
``depth = ceil(ln(1 / δ))``, after a stream of total weight ``N`` every estimate satisfies
``true(i) <= est(i)``, and ``est(i) <= true(i) + ε·N`` with probability ``>= 1 − δ``
(per item). The bound needs pairwise-independent row hashes; we use the dot-product family
``h(x) = (a·chunks(x) + b) mod p  mod width`` over the prime field ``p = 2^31 − 1``, where
``chunks`` splits the 64-bit id into three limbs of < 2^22, so every product fits in int64
and the whole hash is vectorised in torch.

The table lives on one device (``to(device)``; the CPU by default): ids are moved there and
``log_q`` answers on the ids' device; on a GPU, updates and queries then need no host
round trip (the total is a device scalar, never read back during training). Non-standard bits: counts are float64 so the sketch supports exponential decay
(:meth:`CountMinSketch.decay`) for streaming/non-stationary frequency, and the total
weight ``N`` decays with it, so ``est / N`` stays a frequency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from genrec.errors import ConfigError

_P = (1 << 31) - 1  # Mersenne prime 2^31 - 1
_LIMB_BITS = (22, 22, 20)  # 64 bits split into limbs, each < _P


def cms_dims(epsilon: float, delta: float) -> tuple[int, int]:
    """``(width, depth)`` giving over-count ``<= ε·N`` with probability ``>= 1 − δ``."""
    if not 0.0 < epsilon < 1.0:
        raise ConfigError(f"epsilon must be in (0, 1), got {epsilon!r}")
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta!r}")
    return math.ceil(math.e / epsilon), math.ceil(math.log(1.0 / delta))


def _limbs(ids: torch.Tensor) -> list[torch.Tensor]:
    """Split int64 ids (two's complement, so negatives are fine) into 3 limbs < 2^22."""
    out = []
    shift = 0
    for bits in _LIMB_BITS:
        out.append((ids >> shift) & ((1 << bits) - 1))  # [N]
        shift += bits
    return out


class CountMinSketch:
    """Vectorised count-min sketch over int64 ids.

    >>> s = CountMinSketch(width=64, depth=3, seed=0)
    >>> s.add(torch.tensor([5, 5, 7]))
    >>> s.estimate(torch.tensor([5, 7])).tolist()
    [2.0, 1.0]
    """

    def __init__(self, width: int, depth: int, seed: int = 0) -> None:
        if not isinstance(width, int) or width < 1:
            raise ConfigError(f"width must be a positive int, got {width!r}")
        if not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"depth must be a positive int, got {depth!r}")
        self.width = width
        self.depth = depth
        self.seed = int(seed)
        g = torch.Generator().manual_seed(self.seed)
        # a: [depth, 3] in [1, p), b: [depth] in [0, p)
        self.hash_a = torch.randint(1, _P, (depth, len(_LIMB_BITS)), generator=g, dtype=torch.int64)
        self.hash_b = torch.randint(0, _P, (depth,), generator=g, dtype=torch.int64)
        self.table = torch.zeros(depth, width, dtype=torch.float64)  # [depth, width]
        self._total = torch.zeros((), dtype=torch.float64)  # a scalar on the table's device

    @property
    def device(self) -> torch.device:
        return self.table.device

    @property
    def total(self) -> float:
        """Total weight counted so far (reads the device scalar back)."""
        return float(self._total)

    @total.setter
    def total(self, value: float) -> None:
        self._total = torch.tensor(float(value), dtype=torch.float64, device=self.device)

    def to(self, device: torch.device | str) -> "CountMinSketch":
        """Move the table, hashes and total to ``device`` (in place); returns self."""
        self.hash_a, self.hash_b = self.hash_a.to(device), self.hash_b.to(device)
        self.table, self._total = self.table.to(device), self._total.to(device)
        return self

    @classmethod
    def from_error(cls, epsilon: float, delta: float, seed: int = 0) -> "CountMinSketch":
        """A sketch sized for the (ε, δ) guarantee documented in the module docstring."""
        width, depth = cms_dims(epsilon, delta)
        return cls(width, depth, seed)

    # ------------------------------------------------------------------ hashing
    def buckets(self, ids: torch.Tensor) -> torch.Tensor:
        """Bucket of each id in each row: ``[depth, N]`` int64 in ``[0, width)``."""
        ids = self._check_ids(ids)
        limbs = _limbs(ids)
        acc = self.hash_b[:, None].expand(self.depth, ids.numel()).clone()  # [depth, N]
        for k, limb in enumerate(limbs):
            # a < 2^31, limb < 2^22 -> product < 2^53: no int64 overflow
            acc = (acc + (self.hash_a[:, k, None] * limb[None, :]) % _P) % _P
        return acc % self.width

    def _check_ids(self, ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            ids = torch.as_tensor(ids)
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise TypeError(f"ids must be an integer tensor, got dtype {ids.dtype}")
        return ids.reshape(-1).to(device=self.device, dtype=torch.int64)

    # ------------------------------------------------------------------ updates
    def add(self, ids: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """Count each id once (or by ``weights``, same length, non-negative)."""
        ids = self._check_ids(ids)
        if ids.numel() == 0:
            return
        if weights is None:
            w = torch.ones(ids.numel(), dtype=torch.float64, device=self.device)
        else:
            w = torch.as_tensor(weights).reshape(-1).to(device=self.device, dtype=torch.float64)
            if w.numel() != ids.numel():
                raise ValueError(f"weights has {w.numel()} entries but ids has {ids.numel()}")
            if bool((w < 0).any()):
                raise ValueError("weights must be non-negative (count-min needs a cash-register stream)")
        b = self.buckets(ids)  # [depth, N]
        flat = b + (torch.arange(self.depth, device=self.device)[:, None] * self.width)  # [depth, N]
        self.table.view(-1).index_add_(0, flat.reshape(-1), w.repeat(self.depth))
        self._total = self._total + w.sum()

    def decay(self, factor: float) -> None:
        """Multiply every count (and the total) by ``factor`` in (0, 1]: exponential forgetting."""
        if not 0.0 < factor <= 1.0:
            raise ValueError(f"decay factor must be in (0, 1], got {factor!r}")
        self.table.mul_(factor)
        self._total = self._total * factor

    def merge(self, other: "CountMinSketch") -> None:
        """Add another sketch with identical shape and hashes (e.g. from another rank)."""
        if (other.width, other.depth, other.seed) != (self.width, self.depth, self.seed):
            raise ValueError("can only merge sketches with the same width, depth and seed")
        self.table.add_(other.table.to(self.device))
        self._total = self._total + other._total.to(self.device)

    # ------------------------------------------------------------------ queries
    def estimate(self, ids: torch.Tensor) -> torch.Tensor:
        """Estimated count of each id (never below the true count): float64 ``[N]``."""
        ids_flat = self._check_ids(ids)
        if ids_flat.numel() == 0:
            return torch.zeros(0, dtype=torch.float64, device=self.device)
        b = self.buckets(ids_flat)  # [depth, N]
        return self.table.gather(1, b).min(dim=0).values  # [N]

    def log_q(self, ids: torch.Tensor, n_sampled: int = 1, *, min_count: float = 1.0) -> torch.Tensor:
        """Log sampling probability for the logQ correction, float32 with the shape of ``ids``.

        ``Q(i) = min(1, n_sampled · max(est(i), min_count) / N)``: the chance that ``i`` shows
        up among ``n_sampled`` draws proportional to frequency (``n_sampled`` = in-batch
        positives per step). ``min_count`` keeps unseen ids finite. Before any ``add`` the
        sketch knows nothing and returns zeros (no correction).
        """
        ids_t = torch.as_tensor(ids)
        shape, device = ids_t.shape, ids_t.device
        if n_sampled < 1:
            raise ValueError(f"n_sampled must be >= 1, got {n_sampled}")
        est = self.estimate(ids_t).clamp_min(min_count)
        total = self._total
        q = (n_sampled * est / total.clamp_min(1e-300)).clamp_max(1.0)
        out = torch.where(total > 0, q.log(), torch.zeros_like(q))  # no sync: decided on the device
        return out.to(dtype=torch.float32, device=device).reshape(shape)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors only (safetensors-safe)."""
        return {
            "table": self.table.detach().cpu().clone(),
            "total": self._total.detach().cpu().reshape(1).clone(),
            "dims": torch.tensor([self.width, self.depth, self.seed], dtype=torch.int64),
            "hash_a": self.hash_a.cpu().clone(),
            "hash_b": self.hash_b.cpu().clone(),
        }

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        for key in ("table", "total", "dims", "hash_a", "hash_b"):
            if key not in state:
                raise KeyError(f"count-min state is missing {key!r}")
        width, depth, seed = (int(v) for v in state["dims"].tolist())
        if (width, depth) != (self.width, self.depth):
            raise ValueError(
                f"state has width={width}, depth={depth}; this sketch has width={self.width}, depth={self.depth}"
            )
        self.seed = seed
        dev = self.device
        self.hash_a = state["hash_a"].to(device=dev, dtype=torch.int64).clone()
        self.hash_b = state["hash_b"].to(device=dev, dtype=torch.int64).clone()
        self.table = state["table"].to(device=dev, dtype=torch.float64).clone()
        self._total = state["total"].reshape(-1)[0].to(device=dev, dtype=torch.float64).clone()

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor]) -> "CountMinSketch":
        width, depth, seed = (int(v) for v in state["dims"].tolist())
        s = cls(width, depth, seed)
        s.load_state_dict(state)
        return s
