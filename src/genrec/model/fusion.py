"""SID fusion (PinGER §3.3.2 / ablation "SID fusion", the most important component, -27% without).

Before the backbone, each item gets one small causal transformer layer over its own
``[sid_emb_1, ..., sid_emb_L, dense_input]`` (ALL L levels, including the deepest one that the
backbone never sees as a token); the output at the dense slot becomes the item's dense token.
Non-standard: it is a per-item function (no cross-item interaction), so serving can compute it
per candidate on the fly or precompute and cache it per item. Turned off by config, the dense
token is the projected MAM input alone.

Only the dense slot's output is used, and under the causal mask the dense slot (last) sees all
L + 1 tokens. So :meth:`SidFusion.forward` computes just that row: keys and values for the L + 1
tokens, one query, one softmax over L + 1 scores, the output projection and the MLP on one token
instead of L + 1. The same parameters and the same function as running the whole layer and
taking its last row (:meth:`SidFusion.forward_reference`, the slow twin, tested equal); on the
training layout it skips one (L + 1)-token attention call and ~L/(L+1) of a backbone layer's
MLP per step.

A SID token's key and value depend on its (level, code) alone: its input is the level's table row
plus the level vector, normalised row by row, then projected. :meth:`SidFusion.forward_codes`
therefore projects each codebook once per call (sum of the codebook sizes rows, 1,024 for four
levels of 256) and gathers the rows of the batch's codes, instead of projecting L tokens per item
(32,768 at 8 x 1,024 items). Same function again; used whenever the batch has more SID tokens than
the codebooks have rows. On CUDA (attention implementation ``auto`` or ``triton``, see
:func:`genrec.kernels.attention.gpu_fast_path`) its attention then runs as one Triton kernel per pass
that gathers the rows itself (:mod:`genrec.kernels.sid_fusion`), instead of PyTorch's elementwise
passes over the gathered ``[N, L+1, 2D]`` keys and values; not under deterministic algorithms (the
kernel's backward adds the rows' gradients with atomics).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from genrec.kernels.attention import gpu_fast_path
from genrec.model.backbone import Block
from genrec.model.config import ModelConfig
from genrec.model.encoders import SidEmbedding


class SidFusion(nn.Module):
    """``fuse(sid_emb [..., L, D], dense_in [..., D]) -> dense token [..., D]``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.levels = cfg.sid_levels
        self.attn_impl = cfg.attn_impl
        self.block = Block(cfg)
        self.dense_slot = nn.Parameter(torch.zeros(cfg.d_model))
        causal = torch.ones(cfg.sid_levels + 1, cfg.sid_levels + 1, dtype=torch.bool).tril()
        self.register_buffer("causal", causal[None, None], persistent=False)  # [1, 1, L+1, L+1]

    def _seq(self, sid_emb: torch.Tensor, dense_in: torch.Tensor) -> torch.Tensor:
        """-> ``[N, L+1, D]``: each item's SID embeddings then its dense input (+ the slot marker)."""
        if sid_emb.shape[-2] != self.levels or sid_emb.shape[:-2] != dense_in.shape[:-1]:
            raise ValueError(
                f"SidFusion: sid_emb {tuple(sid_emb.shape)} must be [..., {self.levels}, D] matching dense_in "
                f"{tuple(dense_in.shape)}"
            )
        seq = torch.cat([sid_emb, (dense_in + self.dense_slot)[..., None, :]], -2)  # [..., L+1, D]
        return seq.reshape(-1, self.levels + 1, dense_in.shape[-1])

    def forward(self, sid_emb: torch.Tensor, dense_in: torch.Tensor) -> torch.Tensor:
        seq = self._seq(sid_emb, dense_in)  # [N, L+1, D]
        n, t, d = seq.shape
        att = self.block.attn
        h = self.block.n1(seq)
        kv = F.linear(h, att.qkv.weight[d:], att.qkv.bias[d:])  # [N, L+1, 2D]
        return self._fuse(seq[:, -1], h[:, -1], kv).reshape(*dense_in.shape[:-1], d)

    def forward_codes(self, codes: torch.Tensor, embed: SidEmbedding, dense_in: torch.Tensor) -> torch.Tensor:
        """``forward(embed(codes), dense_in)``, with the SID tokens' keys and values projected once per
        codebook row and gathered by ``codes`` ``[..., L]`` (when the batch has more SID tokens than
        the codebooks have rows; otherwise it projects the batch's tokens, as ``forward`` does)."""
        lead, d = dense_in.shape[:-1], dense_in.shape[-1]
        if codes.shape != (*lead, self.levels):
            raise ValueError(f"SidFusion: sid_codes {tuple(codes.shape)} must be [..., {self.levels}] matching dense_in "
                             f"{tuple(dense_in.shape)}")
        n = codes[..., 0].numel()
        if n * self.levels <= sum(embed.sizes):
            return self.forward(embed(codes), dense_in)
        embed.check(codes)
        blk, att = self.block, self.block.attn
        w, bias = att.qkv.weight[d:], att.qkv.bias[d:]
        rows = codes.reshape(n, self.levels) + embed.offsets  # [N, L]: rows of embed.all_rows()
        kv_rows = F.linear(blk.n1(embed.all_rows()), w, bias)  # [R, 2D], R = sum of the codebook sizes
        x = (dense_in + self.dense_slot).reshape(n, d)
        h = blk.n1(x)
        kv_dense = F.linear(h, w, bias)  # [N, 2D]
        if self._use_kernel(x):
            from genrec.kernels.sid_fusion import dropout_keep, fusion_attention  # local: imports triton

            q = F.linear(h, att.qkv.weight[:d], att.qkv.bias[:d])
            p = att.dropout if self.training else 0.0
            keep = dropout_keep(n, att.h, self.levels, p, x.device) if p > 0 else None
            o = fusion_attention(q, kv_rows, rows, kv_dense, att.h, keep, p, check_rows=False)  # checked as codes
            return self._finish(x, o).reshape(*lead, d)
        kv = torch.cat([F.embedding(rows, kv_rows), kv_dense[:, None]], 1)  # [N, L+1, 2D]
        return self._fuse(x, h, kv).reshape(*lead, d)

    def _use_kernel(self, x: torch.Tensor) -> bool:
        """The Triton attention of :mod:`genrec.kernels.sid_fusion`: on CUDA under the fast-path
        switch, with a power-of-two head dim, and not under deterministic algorithms."""
        dh = self.block.attn.dh
        return (gpu_fast_path(self.attn_impl, x.device) and not dh & (dh - 1)
                and not torch.are_deterministic_algorithms_enabled())

    def _fuse(self, x: torch.Tensor, h: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """The dense slot's row of the layer: its input ``x`` ``[N, D]``, normalised ``h`` ``[N, D]``, and
        the keys and values of all L + 1 tokens ``kv`` ``[N, L+1, 2D]``."""
        blk, att = self.block, self.block.attn
        n, t, d = kv.shape[0], kv.shape[1], x.shape[-1]
        q = F.linear(h, att.qkv.weight[:d], att.qkv.bias[:d]).view(n, 1, att.h, att.dh)  # the dense slot's query only
        k, v = kv.view(n, t, 2, att.h, att.dh).unbind(2)  # [N, L+1, H, Dh]
        s = (q.float() * k.float()).sum(-1) * (1.0 / math.sqrt(att.dh))  # [N, L+1, H]
        p = s.softmax(1)
        if self.training and att.dropout > 0:
            p = F.dropout(p, att.dropout)  # attention-probability dropout, as the layer's attention has
        o = (p[..., None] * v.float()).sum(1).to(v.dtype)  # [N, H, Dh]
        return self._finish(x, o.reshape(n, d))

    def _finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The rest of the layer after the dense slot's attention output ``o`` ``[N, D]``."""
        blk = self.block
        x = x + blk.drop(blk.attn.out(o))
        return x + blk.drop(blk.mlp(blk.n2(x)))

    def forward_reference(self, sid_emb: torch.Tensor, dense_in: torch.Tensor) -> torch.Tensor:
        """Slow twin: the whole causal layer over all L + 1 tokens, then the dense slot's row."""
        seq = self._seq(sid_emb, dense_in)
        out, _, _ = self.block(seq, self.causal)
        return out[:, -1].reshape(*dense_in.shape[:-1], dense_in.shape[-1])
