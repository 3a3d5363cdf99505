"""SID fusion (PinGER §3.3.2 / ablation "SID fusion", the most important component, -27% without).

Before the backbone, each item gets one small causal transformer layer over its own
``[sid_emb_1, ..., sid_emb_L, dense_input]`` (ALL L levels, including the deepest one that the
backbone never sees as a token); the output at the dense slot becomes the item's dense token.
Non-standard: it is a per-item function (no cross-item interaction), so serving can compute it
per candidate on the fly or precompute and cache it per item. Turned off by config, the dense
token is the projected MAM input alone.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from genrec.model.backbone import Block
from genrec.model.config import ModelConfig


class SidFusion(nn.Module):
    """``fuse(sid_emb [..., L, D], dense_in [..., D]) -> dense token [..., D]``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.levels = cfg.sid_levels
        self.block = Block(cfg)
        self.dense_slot = nn.Parameter(torch.zeros(cfg.d_model))
        causal = torch.ones(cfg.sid_levels + 1, cfg.sid_levels + 1, dtype=torch.bool).tril()
        self.register_buffer("causal", causal[None, None], persistent=False)  # [1, 1, L+1, L+1]

    def forward(self, sid_emb: torch.Tensor, dense_in: torch.Tensor) -> torch.Tensor:
        if sid_emb.shape[-2] != self.levels or sid_emb.shape[:-2] != dense_in.shape[:-1]:
            raise ValueError(
                f"SidFusion: sid_emb {tuple(sid_emb.shape)} must be [..., {self.levels}, D] matching dense_in "
                f"{tuple(dense_in.shape)}"
            )
        lead = dense_in.shape[:-1]
        d = dense_in.shape[-1]
        seq = torch.cat([sid_emb, (dense_in + self.dense_slot)[..., None, :]], -2)  # [..., L+1, D]
        seq = seq.reshape(-1, self.levels + 1, d)  # [N, L+1, D]
        out, _, _ = self.block(seq, self.causal)
        return out[:, -1].reshape(*lead, d)
