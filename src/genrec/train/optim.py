"""The optimiser and its schedule, and the seeds: AdamW over two parameter groups (no decay on biases, norms
and embedding tables), linear warm-up then cosine / linear decay (by steps, or by the wall-time budget used),
and the per-(seed, rank, step) seed every training step is re-seeded from (what makes resume exact)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from genrec.train.config import TrainConfig

__all__ = ["build_optimizer", "lr_multiplier", "param_groups", "seed_everything", "step_seed"]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: decay on ≥2-D weights; none on biases, norms, and embedding tables.

    A model may name more no-decay parameters via ``model.no_weight_decay() -> set[str]``.
    """
    emb_params: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, (nn.Embedding, nn.EmbeddingBag)):
            emb_params.update(id(p) for p in mod.parameters(recurse=False))
        elif "norm" in type(mod).__name__.lower():
            emb_params.update(id(p) for p in mod.parameters(recurse=False))
    nwd = getattr(model, "no_weight_decay", None)
    extra: set[str] = set(nwd()) if callable(nwd) else set()
    decay, no_decay = [], []
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.dim() < 2 or id(p) in emb_params or name in extra:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def lr_multiplier(cfg: TrainConfig, time_progress: Callable[[], float] | None = None) -> Callable[[int], float]:
    """Linear warm-up to 1 over ``warmup_steps``, then cosine/linear decay to ``min_lr_ratio``.

    With ``time_progress`` (the fraction of the wall-time budget used; see ``TrainConfig.decay_by``)
    the decay's progress is the larger of the step and time fractions; warm-up stays step-based.
    """
    warm, total, floor, kind = cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio, cfg.decay

    def mult(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if kind == "constant":
            return 1.0
        progress = (step - warm) / max(1, total - warm)
        if time_progress is not None:
            progress = max(progress, time_progress())
        progress = min(1.0, max(0.0, progress))
        if kind == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return floor + (1 - floor) * (1 - progress)

    return mult


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    fused = all(p.is_cuda for p in model.parameters()) and any(True for _ in model.parameters())
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]),
                             eps=cfg.eps, **({"fused": True} if fused else {}))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def step_seed(seed: int, rank: int, step: int) -> int:
    """Deterministic per-(seed, rank, step) seed (a simple 64-bit mix)."""
    x = (seed * 0x9E3779B97F4A7C15 + rank * 0xBF58476D1CE4E5B9 + step * 0x94D049BB133111EB) % (2**64)
    x ^= x >> 31
    return x % (2**63 - 1)
