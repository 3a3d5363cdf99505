"""GenRecModel: one backbone for SID generation (PinGER), dense retrieval and MAM ranking (UniPinRec).

Training ``forward`` lays out a batch per ``config.layout`` (PinGER interleaved SID + dense tokens,
TIGER, dense-only, HSTU) plus M-FALCON candidates, runs the backbone once and returns logits and
vectors (no losses — see ``genrec.model.losses``). Serving methods reuse the SAME token builders
and the same attention predicate over a KV cache:

* ``encode_history``  PinGER serving layout (history SID tokens removed: one token per item),
  prefill -> (cache, user vector, last hidden);
* ``sid_logits_next`` one beam-search step: the W beams' SID tokens of the next item attend to the
  cached history + their own shallower SID tokens (cache expanded per beam; cascade comes later);
* ``rank``            candidates with action [MASK] at position n attend to the cached history;
* ``item_vectors``    item MLP for the ANN index.

Non-standard: the target-condition embedding is added after the backbone (heads only), so one
cache serves every target; candidates' and SID tokens' inputs are built by the same helpers in
training and serving, which is what the equivalence tests pin down.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from genrec.errors import ConfigError
from genrec.kernels.attention import gpu_fast_path
from genrec.model.backbone import Backbone
from genrec.model.config import ModelConfig
from genrec.model.encoders import (
    ActionTokenEncoder,
    DenseInputEncoder,
    ItemEncoder,
    ItemPositionEmbedding,
    SidEmbedding,
    TimeGapEmbedding,
    apply_action_mask,
)
from genrec.model.fusion import SidFusion
from genrec.model.heads import ActionHead, SidHeads, TargetCondition, UserHead
from genrec.model.kv_cache import KVCache
from genrec.validation import checks_on, trusted_inputs
from genrec.model.layout import ACTION, CAND, DENSE, PAD, TokenLayout, TokenMeta, build_layout
from genrec.model.types import BeamContext, ModelBatch, ModelOutput

__all__ = ["BeamContext", "GenRecModel", "ModelBatch", "ModelOutput"]  # the types live in genrec.model.types


def _gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x ``[B, S, D]``, idx ``[B]`` -> ``[B, D]``."""
    return x[torch.arange(x.shape[0], device=x.device), idx]


class GenRecModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        config.validate()
        self.config = cfg = config
        self.item_encoder = ItemEncoder(cfg)
        self.dense_input = DenseInputEncoder(cfg)
        self.position = ItemPositionEmbedding(cfg)
        self.sid_emb = SidEmbedding(cfg) if cfg.uses_sids else None
        self.fusion = SidFusion(cfg) if cfg.sid_fusion else None
        self.action_tokens = ActionTokenEncoder(cfg) if cfg.layout == "hstu" else None
        self.time_gap = TimeGapEmbedding(cfg) if cfg.time_buckets > 0 else None
        self.backbone = Backbone(cfg)
        self.sid_heads = SidHeads(cfg) if cfg.layout in ("pinger", "tiger") else None
        self.user_head = UserHead(cfg) if cfg.layout != "tiger" else None
        self.action_head = ActionHead(cfg) if cfg.layout != "tiger" else None
        self.target = TargetCondition(cfg) if cfg.target_condition else None
        # beam steps attend to the shared history by cascade attention (False: copy the cache
        # per beam, the plain reference path; both compute the same function)
        self.shared_beam_decode = True

    # ------------------------------------------------------------------ shared token builders
    def item_vectors(self, item_feats: torch.Tensor, item_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, F]`` (or ``[..., F]``) -> L2-normalised ``[N, item_dim]`` (what the ANN index holds).

        ``item_ids`` (shape ``[N]`` / ``[...]``) adds the learned ID vectors when the model has them
        (``item_id_vocab > 0``); without ids every item gets its content vector only.
        """
        return self.item_encoder(item_feats, item_ids)

    def _vecs(self, feats: torch.Tensor | None, vecs: torch.Tensor | None, name: str,
              ids: torch.Tensor | None = None) -> torch.Tensor:
        if (feats is None) == (vecs is None):
            raise ValueError(f"{name}: pass exactly one of {name}_feats / {name}_vecs")
        if vecs is not None:
            if vecs.shape[-1] != self.config.item_dim:
                raise ValueError(f"{name}_vecs: last dim must be item_dim={self.config.item_dim}, got {tuple(vecs.shape)}")
            return vecs.float()
        return self.item_encoder(feats, ids)  # type: ignore[arg-type]

    def dense_tokens(
        self, item_vecs: torch.Tensor, actions: torch.Tensor, surfaces: torch.Tensor, sid_codes: torch.Tensor | None,
        time_gaps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-item dense token (MAM input [+ time gap], then SID fusion of ``sid_codes`` ``[..., L]`` if
        on): ``[..., D]``. A per-item function (no cross-item interaction)."""
        x = self.dense_input(item_vecs, actions, surfaces)  # [..., D]
        if self.time_gap is not None:
            if time_gaps is None:
                raise ValueError("timestamps: required when time_buckets > 0 (request_ts too for candidates)")
            x = x + self.time_gap(time_gaps)
        if self.fusion is not None:
            if sid_codes is None:
                raise ValueError("sid_codes: required when sid_fusion is on")
            x = self.fusion.forward_codes(sid_codes, self.sid_emb, x)  # type: ignore[arg-type]
        return x

    def _cand_tokens(self, cand_vecs: torch.Tensor, cand_sid: torch.Tensor | None, cand_surface: torch.Tensor | None,
                     lengths: torch.Tensor, gap: torch.Tensor | None = None,
                     pos_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Candidate tokens ``[B, k, D]``: action [MASK], position ``lengths[b]``, time gap ``gap`` ``[B]``."""
        b, k = cand_vecs.shape[:2]
        if cand_surface is None:
            raise ValueError("cand_surface: required with candidates ([B] request surface or [B, k])")
        surf = cand_surface[:, None].expand(b, k) if cand_surface.dim() == 1 else cand_surface
        acts = torch.full((b, k), self.config.mask_action, dtype=torch.int64, device=cand_vecs.device)
        gaps = None if gap is None else gap[:, None].expand(b, k)
        x = self.dense_tokens(cand_vecs, acts, surf, cand_sid, gaps)
        return x + self.position(lengths, lengths if pos_lengths is None else pos_lengths)[:, None, :]

    def _time_gaps(self, batch: ModelBatch, lengths: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """-> (history gaps ``[B, n]`` (item 0: 0), candidate gap ``[B]`` or None)."""
        if self.time_gap is None:
            return None, None
        ts = batch.timestamps
        if ts is None or ts.shape != batch.actions.shape:
            got = None if ts is None else tuple(ts.shape)
            raise ValueError(f"batch.timestamps: expected shape {tuple(batch.actions.shape)} (time_buckets > 0), got {got}")
        gaps = torch.cat([torch.zeros_like(ts[:, :1]), ts[:, 1:] - ts[:, :-1]], 1)
        cand_gap = None
        if batch.request_ts is not None:
            cand_gap = batch.request_ts - _gather_rows(ts[..., None], (lengths - 1).clamp(min=0))[:, 0]
        return gaps, cand_gap

    @staticmethod
    def _pos_lengths(batch: ModelBatch, lengths: torch.Tensor) -> torch.Tensor:
        return lengths if batch.pos_lengths is None else batch.pos_lengths.to(lengths.device)

    def _check_batch(self, batch: ModelBatch) -> None:
        b, n = batch.actions.shape
        for name in ("surfaces", "action_mask", "target_actions"):
            t = getattr(batch, name)
            if t is not None and t.shape != (b, n):
                raise ValueError(f"batch.{name}: expected shape {(b, n)}, got {tuple(t.shape)}")
        if batch.lengths.shape != (b,):
            raise ValueError(f"batch.lengths: expected shape ({b},), got {tuple(batch.lengths.shape)}")
        if n > self.config.max_items:
            raise ValueError(f"batch: {n} item slots > max_items={self.config.max_items}")
        if self.config.uses_sids:
            L = self.config.sid_levels
            if batch.sid_codes is None or batch.sid_codes.shape != (b, n, L):
                got = None if batch.sid_codes is None else tuple(batch.sid_codes.shape)
                raise ValueError(f"batch.sid_codes: expected shape {(b, n, L)}, got {got}")

    def _history_tokens(self, batch: ModelBatch, serving: bool, n_cand: int
                        ) -> tuple[torch.Tensor, TokenLayout, torch.Tensor, torch.Tensor]:
        """-> (x ``[B, S, D]`` incl. positions (no candidates yet), layout, item_vecs, clean surfaces)."""
        self._check_batch(batch)
        cfg = self.config
        lay = build_layout(batch.lengths.to(batch.actions.device), batch.n_items, cfg.layout, cfg.sid_levels,
                           n_cand, serving)
        valid = lay.item_valid  # [B, n]
        zero = torch.zeros_like(batch.actions)
        acts = torch.where(valid, apply_action_mask(batch.actions, batch.action_mask, cfg.mask_action), zero)
        surf = torch.where(valid, batch.surfaces, zero)
        codes = sid_tok = None  # codes [B, n, L] (padding items: 0); the SID tokens' embeddings [B, n, l, D]
        if batch.sid_codes is not None and cfg.uses_sids:
            codes = torch.where(valid[..., None], batch.sid_codes, torch.zeros_like(batch.sid_codes))
            deepest = max(lay.slot_kinds)  # the SID slots are the levels 1..deepest (kind = level)
            if deepest > 0:
                sid_tok = self.sid_emb(codes[..., :deepest])  # type: ignore[misc]
        gaps, _ = self._time_gaps(batch, lay.lengths)
        vecs = self._vecs(batch.item_feats, batch.item_vecs, "item", batch.item_ids)  # [B, n, Di]
        b, n = acts.shape
        slots: list[torch.Tensor] = []
        for kind in lay.slot_kinds:
            if kind == DENSE:
                # HSTU's item token carries no action (the action sits in its own, later token)
                a = torch.full_like(acts, cfg.mask_action) if cfg.layout == "hstu" else acts
                slots.append(self.dense_tokens(vecs, a, surf, codes, gaps))
            elif kind == ACTION:
                slots.append(self.action_tokens(acts, surf))  # type: ignore[misc]
            else:
                slots.append(sid_tok[:, :, kind - 1])  # type: ignore[index]
        x = torch.stack(slots, 2).reshape(b, n * lay.tokens_per_item, -1)  # [B, n*T, D]
        x = x + self.position(lay.meta.pos[:, : x.shape[1]], self._pos_lengths(batch, lay.lengths))
        if self.config.input_dropout > 0 and self.training:
            x = F.dropout(x, self.config.input_dropout)
        x = x * (lay.meta.kind[:, : x.shape[1], None] != PAD)
        return x, lay, vecs, surf

    def _cond(self, h: torch.Tensor, surface: torch.Tensor | None, action: torch.Tensor | None) -> torch.Tensor:
        if self.target is None:
            return h
        cfg = self.config
        lead = h.shape[:-1]
        s = torch.full(lead, cfg.n_surfaces, dtype=torch.int64, device=h.device) if surface is None else surface.expand(lead)
        a = torch.full(lead, cfg.n_actions, dtype=torch.int64, device=h.device) if action is None else action.expand(lead)
        return self.target(h, s, a)

    def _context_slot(self) -> int:
        """Kind of the token whose hidden state predicts the NEXT item (level 1 / user vector)."""
        return {"pinger": DENSE, "dense": DENSE, "hstu": ACTION, "tiger": self.config.sid_levels}[self.config.layout]

    # ------------------------------------------------------------------ training forward
    def forward(self, batch: ModelBatch, serving_layout: bool = False) -> ModelOutput:
        """One forward over the training layout (``serving_layout=True``: PinGER without history SID tokens)."""
        cfg = self.config
        k = batch.n_cand
        if k and cfg.layout == "tiger":
            raise ConfigError("layout 'tiger' has no dense tokens: it cannot score candidates (use pinger/dense/hstu)")
        x, lay, vecs, surf = self._history_tokens(batch, serving_layout, k)
        cand_vecs = None
        if k:
            cand_vecs = self._vecs(batch.cand_feats, batch.cand_vecs, "cand", batch.cand_ids)
            _, cand_gap = self._time_gaps(batch, lay.lengths)
            if self.time_gap is not None and cand_gap is None:
                raise ValueError("batch.request_ts: required for candidates when time_buckets > 0")
            cand = self._cand_tokens(cand_vecs, batch.cand_sid_codes, batch.cand_surface, lay.lengths, cand_gap,
                                     self._pos_lengths(batch, lay.lengths))
            x = torch.cat([x, cand], 1)
        h = self.backbone(x, lay.meta, cfg.layout, n_cand=k)  # [B, S, D]
        b, n = batch.actions.shape
        valid = lay.item_valid
        out = ModelOutput(hidden=h, layout=lay, item_valid=valid, item_vecs=vecs, cand_vecs=cand_vecs)

        # targets: of item i (its own surface/action) and of the item after i (shifted; last -> request)
        none_s = torch.full((b, 1), cfg.n_surfaces, dtype=torch.int64, device=h.device)
        none_a = torch.full((b, 1), cfg.n_actions, dtype=torch.int64, device=h.device)
        t_surf = torch.where(valid, surf, none_s)  # [B, n]
        t_act = (torch.where(valid, batch.target_actions, none_a) if batch.target_actions is not None
                 else none_a.expand(b, n))
        req_s = none_s[:, 0] if batch.request_surface is None else batch.request_surface
        req_a = none_a[:, 0] if batch.request_action is None else batch.request_action
        last = (lay.lengths - 1).clamp(min=0)  # [B]
        nxt_s = torch.cat([t_surf[:, 1:], none_s], 1)
        nxt_a = torch.cat([t_act[:, 1:], none_a], 1)
        ar = torch.arange(b, device=h.device)
        nxt_s[ar, last] = req_s
        nxt_a[ar, last] = req_a

        ctx_idx = lay.slot_index(self._context_slot())  # [n]
        h_ctx = self._cond(h[:, ctx_idx], nxt_s, nxt_a)  # [B, n, D] conditioned on the NEXT item's target
        if self.user_head is not None:
            out.user_vecs = self.user_head(h_ctx)
            out.next_user_vec = _gather_rows(out.user_vecs, last)
        if self.action_head is not None:
            out.action_logits = self.action_head(h[:, lay.dense_index])
            if k:
                out.cand_action_logits = self.action_head(h[:, lay.cand_index])
        if self.sid_heads is not None and not serving_layout:
            lvl1 = self.sid_heads(h_ctx, 1)  # [B, n, K1]: level 1 of item i+1
            out.next_sid_logits = _gather_rows(lvl1, last)
            logits = [torch.cat([torch.zeros_like(lvl1[:, :1]), lvl1[:, :-1]], 1)]
            ar_n = torch.arange(n, device=h.device)[None, :]
            valids = [valid & (ar_n >= 1)]
            for level in range(2, cfg.sid_levels + 1):
                h_sid = self._cond(h[:, lay.slot_index(level - 1)], t_surf, t_act)  # [B, n, D]
                logits.append(self.sid_heads(h_sid, level))
                valids.append(valid)
            out.sid_logits, out.sid_valid = logits, valids
        return out

    # ------------------------------------------------------------------ serving
    def encode_history(
        self, batch: ModelBatch, target_surface: torch.Tensor | None = None, target_action: torch.Tensor | None = None
    ) -> tuple[KVCache, torch.Tensor | None, torch.Tensor]:
        """Prefill the serving layout -> (cache, user_vec ``[B, item_dim]`` or None for TIGER, last hidden ``[B, D]``)."""
        if checks_on() and batch.lengths.numel() and int(batch.lengths.min()) < 1:
            raise ValueError("encode_history: every row needs at least one history item (lengths >= 1)")
        x, lay, _, _ = self._history_tokens(batch, serving=True, n_cand=0)
        cache, h = self.backbone.prefill(x, lay.meta, self.config.layout, n_cand=0)
        last_tok = lay.slot_index(self._context_slot())[lay.lengths - 1]  # [B]
        last_h = _gather_rows(h, last_tok)  # [B, D]
        cache.lengths, cache.last_hidden = lay.lengths, last_h
        if batch.timestamps is not None:
            cache.last_ts = _gather_rows(batch.timestamps[..., None], lay.lengths - 1)[:, 0]
        user = None
        if self.user_head is not None:
            user = self.user_head(self._cond(last_h, target_surface, target_action))
        return cache, user, last_h

    def sid_logits_next(
        self, cache: KVCache, prefix_codes: torch.Tensor,
        target_surface: torch.Tensor | None = None, target_action: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Beam step: prefix_codes ``[B, W, d]`` (levels 1..d of the next item) -> logits ``[B, W, K_{d+1}]``."""
        cfg = self.config
        if self.sid_heads is None:
            raise ConfigError(f"layout {cfg.layout!r} has no SID heads")
        if cache.last_hidden is None or cache.lengths is None:
            raise ValueError("sid_logits_next: cache was not filled by encode_history")
        if prefix_codes.dim() != 3 or prefix_codes.shape[0] != cache.batch_size:
            raise ValueError(f"prefix_codes: expected [B={cache.batch_size}, W, d], got {tuple(prefix_codes.shape)}")
        b, w, d = prefix_codes.shape
        if d >= cfg.sid_levels:
            raise ValueError(f"prefix_codes: depth {d} must be < sid_levels={cfg.sid_levels}")
        if self.shared_beam_decode and d > 0 and not self.training:
            ctx = self.beam_context(cache, target_surface, target_action)
            if ctx is not None:  # cascade attention over the one history copy, plan checked once
                return self.sid_logits_ctx(ctx, prefix_codes)
        ts = None if target_surface is None else target_surface[:, None]
        ta = None if target_action is None else target_action[:, None]
        if d == 0:
            h1 = self._cond(cache.last_hidden, target_surface, target_action)
            return self.sid_heads(h1, 1)[:, None, :].expand(b, w, -1)
        pos = cache.lengths.repeat_interleave(w)  # [B*W]
        x = self.sid_emb(prefix_codes.reshape(b * w, d), first_level=1)  # type: ignore[misc]  # [B*W, d, D]
        x = x + self.position(pos, pos)[:, None, :]
        h = self.backbone.decode(x, self._beam_meta(cache, w, d), cache.expand(w), append=False)  # [B*W, d, D]: the cache copied per beam
        h_last = self._cond(h[:, -1].view(b, w, -1), ts, ta)
        return self.sid_heads(h_last, d + 1)

    def _beam_meta(self, cache: KVCache, w: int, d: int) -> TokenMeta:
        """Metadata of the d SID tokens of W beams per cached row: ``[B*W, d]``."""
        assert cache.lengths is not None
        pos = cache.lengths.repeat_interleave(w)  # [B*W]
        dev = pos.device
        return TokenMeta(
            pos[:, None].expand(pos.shape[0], d).contiguous(),
            torch.arange(1, d + 1, device=dev)[None, :].expand(pos.shape[0], d).contiguous(),
            (cache.n_tokens + torch.arange(d, device=dev))[None, :].expand(pos.shape[0], d).contiguous(),
        )

    def beam_context(
        self, cache: KVCache, target_surface: torch.Tensor | None = None, target_action: torch.Tensor | None = None,
    ) -> BeamContext | None:
        """Check once per encoding that SID beam tokens of every depth 1..L-1 see exactly a prefix
        of their request's cache and each other causally (:meth:`Backbone.shared_prefix_plan`; the
        result is memoised on the cache) and validate the target; None where the plan does not hold
        (then beams must copy the cache, see :meth:`sid_logits_next`)."""
        if self.sid_heads is None or cache.meta is None or cache.lengths is None or cache.last_hidden is None:
            return None
        if "hist_len" not in cache.plans:
            cache.plans["hist_len"] = self._shared_plan(cache)
        hist_len = cache.plans["hist_len"]
        if hist_len is None:
            return None
        if self.target is not None:  # validate once here; the steps skip it
            self._cond(cache.last_hidden[:, None], None if target_surface is None else target_surface[:, None],
                       None if target_action is None else target_action[:, None])
        assert hist_len is not None
        return BeamContext(cache.k, cache.v, hist_len, cache.lengths, cache.last_hidden, target_surface, target_action)

    def _shared_plan(self, cache: KVCache) -> torch.Tensor | None:
        """One ``hist_len`` ``[B]`` valid for beam tokens of every depth 1..L-1, or None. One host sync."""
        plan = self.shared_plan_lazy(cache)
        return None if plan is None or not bool(plan[1]) else plan[0]

    def shared_plan_lazy(self, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`_shared_plan` without the sync -- (hist_len ``[B]``, ok bool ``[]`` on the device),
        or None when the shapes alone rule it out -- so it can run inside a CUDA graph (the graphed
        encoder computes it with the cache and memoises it, see :meth:`beam_context`)."""
        if self.sid_heads is None or cache.meta is None or cache.lengths is None:
            return None
        depth = self.config.sid_levels - 1
        if depth == 0:  # one SID level: no beam token ever attends
            dev = cache.meta.pos.device
            return torch.zeros(cache.batch_size, dtype=torch.int64, device=dev), torch.ones((), dtype=torch.bool, device=dev)
        # The deepest depth's plan alone (1 beam stands for all W): depth d's tokens are the first d of depth L-1's
        # (same metadata), and the predicate is elementwise, so depth d's masks are the top rows (and the top-left
        # block) of depth L-1's, and its hist_len is read from the same first row: the deepest plan holding implies
        # every shallower one with the same hist_len (a third of the launches at four levels; tests/model check it
        # against planning every depth)
        return self.backbone.shared_prefix_plan_lazy(self._beam_meta(cache, 1, depth), cache, 1)

    def sid_logits_ctx(self, ctx: BeamContext, prefix_codes: torch.Tensor) -> torch.Tensor:
        """Beam step over a :class:`BeamContext`: prefix_codes ``[B, W, d]`` -> logits ``[B, W, K_{d+1}]``,
        by cascade attention over the shared history; the same function as :meth:`sid_logits_next`
        with no device->host sync (inputs are trusted: beam codes are valid by construction)."""
        with trusted_inputs():
            return self._sid_logits_ctx(ctx, prefix_codes)

    def _sid_logits_ctx(self, ctx: BeamContext, prefix_codes: torch.Tensor) -> torch.Tensor:
        assert self.sid_heads is not None
        b, w, d = prefix_codes.shape
        ts = None if ctx.surface is None else ctx.surface[:, None]
        ta = None if ctx.action is None else ctx.action[:, None]
        if d == 0:
            h1 = self._cond(ctx.last_hidden, ctx.surface, ctx.action)
            return self.sid_heads(h1, 1)[:, None, :].expand(b, w, -1)
        pos = ctx.lengths.repeat_interleave(w)  # [B*W]
        x = self.sid_emb(prefix_codes.reshape(b * w, d), first_level=1)  # type: ignore[misc]  # [B*W, d, D]
        x = x + self.position(pos, pos)[:, None, :]
        h = self.backbone.decode_planned(x, ctx.k, ctx.v, ctx.hist_len, w)  # [B*W, d, D]
        h_last = self._cond(h[:, -1].view(b, w, -1), ts, ta)
        return self.sid_heads(h_last, d + 1)

    def candidate_plan_ok(self, cache: KVCache, plan: tuple[torch.Tensor, torch.Tensor] | None = None) -> bool:
        """Do :meth:`rank`'s candidates see exactly a prefix of their row's cache
        (:meth:`Backbone.candidate_plan_lazy`, or ``plan`` when already computed)? One host sync per cache
        contents, memoised on the cache."""
        ok = cache.plans.get("cand_ok")
        if ok is None:
            plan = plan or self.backbone.candidate_plan_lazy(cache)
            ok = cache.plans["cand_ok"] = bool(plan[1])
            if ok:  # the plan's hist_len too, so the ranking (graphed or not) need not plan again
                cache.plans["cand_hist_len"] = plan[0]
        return bool(ok)

    def rank_by_cascade(self, cache: KVCache) -> bool:
        """Will :meth:`rank` run cascade attention over this cache: the GPU fast path is on and
        :meth:`candidate_plan_ok` holds (one sync at most, memoised)?"""
        return (cache.meta is not None and gpu_fast_path(self.config.attn_impl, cache.meta.pos.device)
                and self.candidate_plan_ok(cache))

    def _candidate_plan(self, cache: KVCache) -> torch.Tensor | None:
        """hist_len ``[B]`` when :meth:`rank` may run cascade attention (the GPU fast path, under the one
        attention switch; the candidates see a prefix of the cache), else None (the masked decode, the
        same function). Inside a CUDA-graph capture or a compiled trace nothing may sync, so there the
        decision must already be memoised (:class:`GraphedRanker` does; an eager call does)."""
        if cache.meta is None or not gpu_fast_path(self.config.attn_impl, cache.meta.pos.device):
            return None
        ok = cache.plans.get("cand_ok")
        if ok is False or (ok is None and not checks_on()):
            return None
        if ok and cache.plans.get("cand_hist_len") is not None:  # memoised with the decision
            return cache.plans["cand_hist_len"]
        plan = self.backbone.candidate_plan_lazy(cache)
        return plan[0] if self.candidate_plan_ok(cache, plan) else None  # undecided: one sync here, memoised

    def rank(
        self, cache: KVCache, cand_vecs: torch.Tensor, cand_sid_codes: torch.Tensor | None = None,
        cand_surface: torch.Tensor | None = None, request_ts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """M-FALCON scoring over the cached history: cand_vecs ``[B, k, item_dim]`` -> action logits ``[B, k, C]``.

        ``cand_sid_codes`` ``[B, k, L]`` is needed when SID fusion is on; ``cand_surface`` is the
        request surface ``[B]`` (or ``[B, k]``); ``request_ts`` ``[B]`` when ``time_buckets > 0``.
        """
        if self.action_head is None:
            raise ConfigError(f"layout {self.config.layout!r} cannot rank candidates")
        if cache.lengths is None:
            raise ValueError("rank: cache was not filled by encode_history")
        b, k = cand_vecs.shape[:2]
        if b != cache.batch_size:
            raise ValueError(f"cand_vecs: batch {b} != cache batch {cache.batch_size}")
        gap = None
        if self.time_gap is not None:
            if request_ts is None or cache.last_ts is None:
                raise ValueError("rank: request_ts (and history timestamps) are required when time_buckets > 0")
            gap = request_ts - cache.last_ts
        x = self._cand_tokens(cand_vecs.float(), cand_sid_codes, cand_surface, cache.lengths, gap)  # [B, k, D]
        hist_len = self._candidate_plan(cache) if k else None  # no candidates: nothing to group into beams
        if hist_len is not None:  # each candidate one beam of one token: the history read once per row
            # hist_len was derived here from the cache, so the kernel's range check (two syncs a layer,
            # which made the eager call host-bound: 17.1 against 9.1 ms for the masked decode on an H200,
            # B 8 x 992 items, 656 candidates, 12 layers) has nothing to catch; no ContextVar under compile
            trusted = contextlib.nullcontext() if torch.compiler.is_compiling() else trusted_inputs()
            with trusted:
                h = self.backbone.decode_planned(x.reshape(b * k, 1, x.shape[-1]), cache.k, cache.v, hist_len, k)
            return self.action_head(h.view(b, k, -1))
        dev = x.device
        meta = TokenMeta(
            cache.lengths[:, None].expand(b, k).contiguous(),
            torch.full((b, k), CAND, dtype=torch.int64, device=dev),
            (cache.n_tokens + torch.arange(k, device=dev))[None, :].expand(b, k).contiguous(),
        )
        h = self.backbone.decode(x, meta, cache, append=False)
        return self.action_head(h)
