"""Output heads: SID heads (PinGER), user-vector head (PinRec / UniPinRec retrieval), action heads
(UniPinRec MAM ranking), and optional target conditioning (PinGER ablation "target condition").

Non-standard: the target-condition embedding (the request's target surface / action) is added to
the hidden state only BEFORE the SID and user heads — never inside the backbone — so one KV cache
serves every target and serving equivalence holds. Heads return logits / vectors, not losses.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from genrec.model.config import ModelConfig
from genrec.validation import checks_on


def _mlp(d_in: int, d_hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_out))


class SidHeads(nn.Module):
    """One Linear ``d_model -> K_l`` per SID level l (1-based)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(cfg.d_model, k) for k in cfg.sid_codebook_sizes)

    def forward(self, h: torch.Tensor, level: int) -> torch.Tensor:
        if not 1 <= level <= len(self.heads):
            raise ValueError(f"SidHeads: level {level} outside 1..{len(self.heads)}")
        return self.heads[level - 1](h)


class UserHead(nn.Module):
    """MLP (or Linear, or identity: ``config.user_head``) of the hidden state -> user vector ``[..., item_dim]``,
    L2-normalised unless ``config.normalize`` is off (scored by dot with item vectors)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.mlp: nn.Module = {"mlp": lambda: _mlp(cfg.d_model, cfg.d_model, cfg.item_dim),
                               "linear": lambda: nn.Linear(cfg.d_model, cfg.item_dim),
                               "identity": nn.Identity}[cfg.user_head]()
        self.normalize = cfg.normalize

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        u = self.mlp(h)
        return F.normalize(u, dim=-1) if self.normalize else u


class ActionHead(nn.Module):
    """One MLP -> C logits (one binary logit per action type)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.mlp = _mlp(cfg.d_model, cfg.d_model, cfg.n_actions)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.mlp(h)


class TargetCondition(nn.Module):
    """Embedding of the request target (surface, optional action) added to hidden before SID/user heads.

    Index ``n_surfaces`` (surface) / ``n_actions`` (action) means "no target".
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_surfaces, self.n_actions = cfg.n_surfaces, cfg.n_actions
        self.surface = nn.Embedding(cfg.n_surfaces + 1, cfg.d_model)
        self.action = nn.Embedding(cfg.n_actions + 1, cfg.d_model)
        nn.init.normal_(self.surface.weight, std=0.02)
        nn.init.normal_(self.action.weight, std=0.02)

    def forward(self, h: torch.Tensor, surface: torch.Tensor | None, action: torch.Tensor | None) -> torch.Tensor:
        """h ``[..., D]``; surface / action broadcastable to ``h.shape[:-1]`` (or None). The range
        checks are skipped inside ``trusted_inputs`` (they sync with the host)."""
        check = checks_on()
        if surface is not None:
            if check and surface.numel() and (int(surface.min()) < 0 or int(surface.max()) > self.n_surfaces):
                raise ValueError(f"target_surface: values must lie in [0, {self.n_surfaces}]")
            h = h + self.surface(surface)
        if action is not None:
            if check and action.numel() and (int(action.min()) < 0 or int(action.max()) > self.n_actions):
                raise ValueError(f"target_action: values must lie in [0, {self.n_actions}]")
            h = h + self.action(action)
        return h
