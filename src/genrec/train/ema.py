"""An exponential moving average of the model's weights, evaluated and served in their place.

Non-standard here: the average is not a second module (a deep copy of a model that
``model.compile()`` has touched would call the original's compiled forward). It is a list of fp32
shadow tensors, one per trainable parameter, that :meth:`WeightAverage.swapped` copies into the
live parameters for the span of an evaluation or a checkpoint write and then copies back, so
training never sees it: a run with the average on takes exactly the steps of one without.

The decay warms up as in TensorFlow's ``ExponentialMovingAverage(num_updates=...)``: update ``n``
(0-based) uses ``min(decay, (1 + n) / (10 + n))``, so the first updates follow the weights
closely instead of dragging the random initialisation along. Buffers are not averaged: the live
ones are used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["WeightAverage", "ema_decay_at"]


def ema_decay_at(decay: float, n: int) -> float:
    """The decay of update ``n`` (0-based): ``decay`` capped by the warm-up ``(1 + n) / (10 + n)``."""
    return min(decay, (1.0 + n) / (10.0 + n))


class WeightAverage:
    """fp32 EMA of ``model``'s trainable parameters (tied parameters counted once)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay!r}")
        self.decay = decay
        self.updates = 0
        # named_parameters yields a tied parameter once
        trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.names: list[str] = [name for name, _ in trainable]
        self.params: list[nn.Parameter] = [p for _, p in trainable]
        self.shadow = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        """Move the average towards the current weights (call after each optimizer step)."""
        w = 1.0 - ema_decay_at(self.decay, self.updates)
        live = [p.detach() if p.dtype == torch.float32 else p.detach().float() for p in self.params]
        torch._foreach_lerp_(self.shadow, live, w)
        self.updates += 1

    @torch.no_grad()
    def reset(self, updates: int = 0) -> None:
        """Restart the average at the model's current weights, as if ``updates`` updates had been made
        (a resumed run: the checkpoint's served weights are the average it saved)."""
        for s, p in zip(self.shadow, self.params):
            s.copy_(p.detach())
        self.updates = updates

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The average in the model's parameters for the ``with`` block; the live weights after it."""
        with torch.no_grad():
            backup = [p.detach().clone() for p in self.params]
            for p, s in zip(self.params, self.shadow):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, b in zip(self.params, backup):
                    p.copy_(b)
