"""Pre-norm transformer backbone whose attention visibility is the one metadata predicate.

Non-standard: no causal flag anywhere — every attention call gets its mask from
:func:`genrec.model.mask.make_mask_mod` over (query metadata, key metadata), so the full
training forward, the KV-cache prefill and the decode steps (SID beams, candidate scoring) are
the same function restricted to different token sets. Positions are learned item-level
embeddings added at the input (not rotary), so cached keys never depend on later tokens.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn as nn

from genrec.kernels.attention import (
    CausalMask,
    ItemBlockMask,
    attention,
    gpu_fast_path,
    kernel_head_dim,
    prepare_mask,
    resolve_impl,
)
from genrec.model.config import ModelConfig
from genrec.model.kv_cache import KVCache
from genrec.model.layout import CAND, DENSE, TokenMeta
from genrec.model.mask import CAUSAL_LAYOUTS, make_mask_mod, reference_mask


def make_norm(cfg: ModelConfig) -> nn.Module:
    return nn.RMSNorm(cfg.d_model) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.d_model)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.h, self.dh = cfg.n_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(
        self, x: torch.Tensor, mask: Any, past: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x ``[B, S, D]`` -> (out ``[B, S, D]``, k, v ``[B, H, S, Dh]`` of these tokens)."""
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)  # 3 x [B, H, S, Dh]
        kk, vv = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        p = self.dropout if self.training else 0.0
        o = attention(q, kk, vv, mask=mask, dropout_p=p)  # [B, H, S, Dh]
        return self.out(o.transpose(1, 2).reshape(b, s, d)), k, v

    def forward_shared(self, x: torch.Tensor, k_hist: torch.Tensor, v_hist: torch.Tensor, hist_len: torch.Tensor,
                       w: int) -> torch.Tensor:
        """Beams over a shared history: x ``[B*W, t, D]`` (W rows per request) attend to their
        request's first ``hist_len`` cached tokens ``[B, H, n, Dh]`` and causally to their own t
        tokens, by cascade attention (the history is read once per request, never copied W times)."""
        from genrec.kernels.cascade import cascade_attention  # local: the module imports triton (Linux only)

        bw, t, d = x.shape
        b = bw // w
        q, k, v = self.qkv(x).view(b, w, t, 3, self.h, self.dh).permute(3, 0, 1, 4, 2, 5)  # 3 x [B, W, H, t, Dh]
        if k_hist.dtype != q.dtype:  # e.g. a float32 cache read under bf16 autocast
            k_hist, v_hist = k_hist.to(q.dtype), v_hist.to(q.dtype)
        o = cascade_attention(q, k_hist, v_hist, k, v, hist_len)  # [B, W, H, t, Dh]
        return self.out(o.permute(0, 1, 3, 2, 4).reshape(bw, t, d))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n1, self.n2 = make_norm(cfg), make_norm(cfg)
        self.attn = SelfAttention(cfg)
        inner: list[nn.Module] = [nn.Dropout(cfg.ffn_dropout)] if cfg.ffn_dropout > 0 else []
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), *inner, nn.Linear(cfg.d_ff, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, x: torch.Tensor, mask: Any, past: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, k, v = self.attn(self.n1(x), mask, past)
        x = x + self.drop(a)
        x = x + self.drop(self.mlp(self.n2(x)))
        return x, k, v

    def forward_shared(self, x: torch.Tensor, k_hist: torch.Tensor, v_hist: torch.Tensor, hist_len: torch.Tensor,
                       w: int) -> torch.Tensor:
        x = x + self.drop(self.attn.forward_shared(self.n1(x), k_hist, v_hist, hist_len, w))
        return x + self.drop(self.mlp(self.n2(x)))


class Backbone(nn.Module):
    """``n_layers`` pre-norm blocks + final norm. All paths take token metadata and a layout name."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg)

    def _mask(self, q_meta: TokenMeta, k_meta: TokenMeta, layout: str, device: torch.device,
              n_cand: int | None = None) -> Any:
        b, sq = q_meta.shape
        sk = k_meta.shape[1]

        def n_cands() -> int:  # trailing candidate tokens; n_cand None: counted here (one host sync)
            return int((q_meta.kind[0] == CAND).sum()) if n_cand is None else n_cand

        if layout in CAUSAL_LAYOUTS and q_meta is k_meta and gpu_fast_path(self.cfg.attn_impl, device):
            # full forward (no cache) of a token-causal layout: causal SDPA when no candidate follows
            if n_cands() == 0:
                return CausalMask()
        impl = resolve_impl(self.cfg.attn_impl, device, b * sq * sk)
        # the item-block kernel covers the full PinGER training layout (no cache), candidates after the history
        # included, at the head dims it takes: under triton, and under auto where the mask is too big to build
        # (flex would fall back to a dense mask under dropout and run out of memory from ~1,000 history items at
        # the preset's batch; the kernel has no attention-probability dropout, the residual and FFN dropout stay)
        if impl == "triton" or (impl == "flex" and gpu_fast_path(self.cfg.attn_impl, device)):
            if layout == "pinger" and q_meta is k_meta and kernel_head_dim(self.cfg.head_dim):
                m, t = n_cands(), self.cfg.sid_levels
                # whole T-token items, as the layout was built: the serving layout, one dense token per item under
                # the same layout name, would pass the divisibility test alone and be read as T-token items
                if (sq - m) % t == 0 and q_meta.item_tokens == t:
                    lengths = (q_meta.kind[:, : sq - m] == DENSE).sum(1)  # [B] valid items
                    return ItemBlockMask(lengths, t, m)
            if impl == "triton":
                impl = "reference"
        if impl == "flex" and self.training and self.cfg.dropout > 0:
            impl = "reference"  # flex has no attention dropout
        return prepare_mask(make_mask_mod(q_meta, k_meta, layout), b, sq, sk, impl, device)

    def forward(self, x: torch.Tensor, meta: TokenMeta, layout: str, n_cand: int | None = None) -> torch.Tensor:
        """Full forward: x ``[B, S, D]`` -> hidden ``[B, S, D]``. ``n_cand``: how many trailing
        candidate tokens every row holds, when the caller knows (saves the attention switch a sync)."""
        return self._run(x, meta, layout, None, n_cand)[0]

    def prefill(self, x: torch.Tensor, meta: TokenMeta, layout: str,
                n_cand: int | None = None) -> tuple[KVCache, torch.Tensor]:
        """Encode history tokens, returning a filled :class:`KVCache` and hidden ``[B, S, D]``.
        ``n_cand``: trailing candidate tokens when the caller knows (0 for a history: no host sync,
        so the encode can be captured in a CUDA graph)."""
        h, ks, vs = self._run(x, meta, layout, None, n_cand)
        return KVCache(layout=layout).prefill(ks, vs, meta), h

    def decode(self, x: torch.Tensor, meta: TokenMeta, cache: KVCache, append: bool = False) -> torch.Tensor:
        """New tokens x ``[B, t, D]`` attend to cache + themselves under the predicate -> hidden ``[B, t, D]``.

        ``append=True`` adds their K/V to the cache (history extension); ``False`` leaves the cache
        untouched (SID beam steps, candidate scoring).
        """
        if cache.meta is None:
            raise ValueError("decode: the KV cache is empty; call prefill first")
        if x.shape[0] != cache.batch_size:
            raise ValueError(f"decode: batch {x.shape[0]} != cache batch {cache.batch_size}")
        h, ks, vs = self._run(x, meta, cache.layout, cache)
        if append:
            cache.append(ks, vs, meta)
        return h

    def shared_prefix_plan(self, meta: TokenMeta, cache: KVCache, w: int) -> torch.Tensor | None:
        """When W beam rows per request (``meta`` ``[B*W, t]``, the same for every beam of a
        request) see, under the predicate, exactly a prefix of their request's cached tokens and
        each other causally: the per-request prefix length ``[B]`` (cascade attention applies).
        Otherwise None (the caller falls back to copying the cache per beam). One host sync."""
        plan = self.shared_prefix_plan_lazy(meta, cache, w)
        if plan is None:
            return None
        hist_len, ok = plan
        return hist_len if bool(ok) else None

    def shared_prefix_plan_lazy(self, meta: TokenMeta, cache: KVCache, w: int
                                ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`shared_prefix_plan` without the sync: (hist_len ``[B]``, ok bool ``[]`` on the
        device), or None when the shapes alone rule it out. The caller decides on ``ok``."""
        if cache.meta is None or meta.shape[0] != cache.batch_size * w:
            return None
        q = TokenMeta(meta.pos[::w], meta.kind[::w], meta.tok[::w])  # [B, t]: one beam per request
        vis_h = reference_mask(q, cache.meta, cache.layout)  # [B, t, n]
        vis_s = reference_mask(q, q, cache.layout)  # [B, t, t]
        n, t = vis_h.shape[2], vis_s.shape[1]
        hist_len = vis_h[:, 0].sum(-1)  # [B]
        prefix = torch.arange(n, device=vis_h.device)[None, None, :] < hist_len[:, None, None]  # [B, 1, n]
        causal = torch.ones(t, t, dtype=torch.bool, device=vis_s.device).tril()
        ok = (vis_h == prefix).all() & (vis_s == causal).all()
        if w > 1:  # and every beam of a request holds its first beam's metadata (w == 1: nothing to compare)
            ok = ok & torch.stack([(a.view(-1, w, a.shape[1]) == a[::w, None]).all()
                                   for a in (meta.pos, meta.kind, meta.tok)]).all()
        return hist_len, ok

    def candidate_plan_lazy(self, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """For M-FALCON candidates over ``cache`` (every query a candidate placed after the cache, as
        :meth:`GenRecModel.rank` builds them): (hist_len ``[B]``, ok bool ``[]``), both on the device,
        no sync. ok: under the predicate a candidate sees exactly the first hist_len cached tokens
        of its row (and itself, never another candidate), so cascade attention over the shared
        history computes the same function (one candidate = one "beam" of one token)."""
        m = cache.meta
        if m is None or cache.lengths is None:
            raise ValueError("candidate_plan_lazy: the cache was not filled by encode_history")
        b, n = m.shape
        dev = m.pos.device
        q = TokenMeta(cache.lengths.to(m.pos.dtype)[:, None], torch.full((b, 1), CAND, dtype=m.kind.dtype, device=dev),
                      torch.full((b, 1), n, dtype=m.tok.dtype, device=dev))
        plan = self.shared_prefix_plan_lazy(q, cache, 1)  # one candidate per row: a one-token beam
        assert plan is not None  # the shapes match by construction
        return plan

    def decode_shared(self, x: torch.Tensor, meta: TokenMeta, cache: KVCache, w: int) -> torch.Tensor:
        """``decode(x, meta, cache.expand(w), append=False)`` without the copy: x ``[B*W, t, D]``
        holds W beam rows per cached row. Uses cascade attention when :meth:`shared_prefix_plan`
        allows (inference only), else falls back to the expanded cache -- the same function."""
        hist_len = None if self.training else self.shared_prefix_plan(meta, cache, w)
        if hist_len is None:
            return self.decode(x, meta, cache.expand(w), append=False)
        return self.decode_planned(x, cache.k, cache.v, hist_len, w)

    def decode_planned(self, x: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], hist_len: torch.Tensor,
                       w: int) -> torch.Tensor:
        """The cascade half of :meth:`decode_shared` for a plan already checked: x ``[B*W, t, D]``
        attend to the first ``hist_len`` ``[B]`` cached tokens of their request (per-layer K/V
        ``[B, H, n, Dh]``, n may exceed hist_len: padding is never read) and causally to
        themselves. No device->host sync, so it can be CUDA-graph captured."""
        for i, blk in enumerate(self.blocks):
            x = cast(Block, blk).forward_shared(x, ks[i], vs[i], hist_len, w)
        return self.norm(x)

    def _run(
        self, x: torch.Tensor, meta: TokenMeta, layout: str, cache: KVCache | None, n_cand: int | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        k_meta = meta if cache is None else cache.meta.cat(meta)  # type: ignore[union-attr]
        mask = self._mask(meta, k_meta, layout, x.device, n_cand)
        ks, vs = [], []
        for i, blk in enumerate(self.blocks):
            past = None if cache is None else (cache.k[i], cache.v[i])
            x, k, v = blk(x, mask, past)
            ks.append(k)
            vs.append(v)
        return self.norm(x), ks, vs
