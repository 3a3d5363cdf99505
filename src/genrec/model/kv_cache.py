"""Explicit KV cache of the backbone (gpt-fast / nanochat style), with the keys' token metadata.

Non-standard: besides per-layer K/V ``[layers][B, H, n, Dh]`` the cache keeps each cached
token's metadata (``pos``, ``kind``, ``tok``), because visibility is decided by the one
predicate over metadata (:mod:`genrec.model.mask`) rather than by cache length. That is what
lets SID beam steps (PinGER serving) and candidate scoring (UniPinRec §3.3.3, M-FALCON) both be a
"decode over the cached history". ``lengths`` / ``last_hidden`` carry the per-row valid item count
and the hidden state of the last history token (the next-item query).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from genrec.model.layout import TokenMeta


@dataclass
class KVCache:
    """Per-layer keys/values ``[B, H, n, Dh]`` + metadata ``[B, n]`` of the cached tokens."""

    k: list[torch.Tensor] = field(default_factory=list)
    v: list[torch.Tensor] = field(default_factory=list)
    meta: TokenMeta | None = None
    lengths: torch.Tensor | None = None  # [B] valid history items
    last_hidden: torch.Tensor | None = None  # [B, D] hidden at the last history token
    layout: str = "pinger"
    last_ts: torch.Tensor | None = None  # [B] timestamp of the last history item (time-gap inputs)
    # facts derived from the cached tokens, memoised by readers (e.g. the shared-prefix plan of
    # SID beams); cleared whenever the contents change
    plans: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def n_layers(self) -> int:
        return len(self.k)

    @property
    def n_tokens(self) -> int:
        return 0 if self.meta is None else self.meta.shape[1]

    @property
    def batch_size(self) -> int:
        if self.meta is None:
            raise ValueError("KVCache is empty: call prefill first")
        return self.meta.shape[0]

    def prefill(self, ks: list[torch.Tensor], vs: list[torch.Tensor], meta: TokenMeta) -> "KVCache":
        """Replace the contents with a fresh history encoding."""
        if len(ks) != len(vs):
            raise ValueError(f"KVCache.prefill: {len(ks)} key layers but {len(vs)} value layers")
        for t in ks:
            if t.shape[0] != meta.shape[0] or t.shape[2] != meta.shape[1]:
                raise ValueError(f"KVCache.prefill: keys {tuple(t.shape)} do not match metadata {meta.shape}")
        self.k, self.v, self.meta = list(ks), list(vs), meta
        self.plans = {}
        return self

    def append(self, ks: list[torch.Tensor], vs: list[torch.Tensor], meta: TokenMeta) -> "KVCache":
        """Append new tokens' K/V (``[B, H, t, Dh]`` per layer) and metadata ``[B, t]``."""
        if self.meta is None:
            return self.prefill(ks, vs, meta)
        if len(ks) != self.n_layers:
            raise ValueError(f"KVCache.append: got {len(ks)} layers, cache has {self.n_layers}")
        self.k = [torch.cat([a, b], 2) for a, b in zip(self.k, ks)]
        self.v = [torch.cat([a, b], 2) for a, b in zip(self.v, vs)]
        self.meta = self.meta.cat(meta)
        self.plans = {}
        return self

    def reset(self) -> None:
        self.k, self.v, self.meta, self.lengths, self.last_hidden, self.last_ts = [], [], None, None, None, None
        self.plans = {}

    def row(self, b: int) -> "KVCache":
        """Row ``b`` as a cache of batch 1 (views of this one's tensors, no copy)."""
        if self.meta is None:
            raise ValueError("KVCache is empty: call prefill first")
        one = lambda t: None if t is None else t[b:b + 1]  # noqa: E731
        m = self.meta
        return KVCache([t[b:b + 1] for t in self.k], [t[b:b + 1] for t in self.v],
                       TokenMeta(m.pos[b:b + 1], m.kind[b:b + 1], m.tok[b:b + 1], m.item_tokens),
                       one(self.lengths), one(self.last_hidden), self.layout, one(self.last_ts))

    @staticmethod
    def stack(caches: "list[KVCache]") -> "KVCache":
        """Filled caches of the same layers, token count and layout as one batch, their rows in order (the
        inverse of :meth:`row` over a batch's rows)."""
        if not caches or any(c.meta is None for c in caches):
            raise ValueError("KVCache.stack: needs one or more filled caches")
        first = caches[0]
        if any(c.n_tokens != first.n_tokens or c.n_layers != first.n_layers or c.layout != first.layout
               for c in caches):
            raise ValueError("KVCache.stack: the caches differ in token count, layers or layout")
        cat = lambda ts: None if any(t is None for t in ts) else torch.cat(ts, 0)  # noqa: E731
        metas = [c.meta for c in caches]
        return KVCache([torch.cat([c.k[i] for c in caches], 0) for i in range(first.n_layers)],
                       [torch.cat([c.v[i] for c in caches], 0) for i in range(first.n_layers)],
                       TokenMeta(torch.cat([m.pos for m in metas], 0), torch.cat([m.kind for m in metas], 0),  # type: ignore[union-attr]
                                 torch.cat([m.tok for m in metas], 0)),  # type: ignore[union-attr]
                       cat([c.lengths for c in caches]), cat([c.last_hidden for c in caches]), first.layout,
                       cat([c.last_ts for c in caches]))

    def expand(self, w: int) -> "KVCache":
        """A new cache with every row repeated ``w`` times (row b -> rows b*w .. b*w+w-1), for beams."""
        if self.meta is None:
            raise ValueError("KVCache is empty: call prefill first")
        rep = lambda t: None if t is None else t.repeat_interleave(w, 0)  # noqa: E731
        return KVCache(
            [t.repeat_interleave(w, 0) for t in self.k],
            [t.repeat_interleave(w, 0) for t in self.v],
            self.meta.repeat_interleave(w),
            rep(self.lengths),
            rep(self.last_hidden),
            self.layout,
            rep(self.last_ts),
        )
