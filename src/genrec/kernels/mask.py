"""The ONE attention predicate (PinGER §3.3.2 rules, M-FALCON candidate rule of UniPinRec §3.1.1).

Everything that needs visibility — the model's reference boolean mask and FlexAttention
``mask_mod`` (:mod:`genrec.model.mask` re-exports them), the KV-cached decode paths, the item-block
kernels' slow twin (:func:`genrec.kernels.reference.item_block_mask`), the kernel benchmark's Flex
mask and the kernel tests — derives from :func:`allowed`, a pure elementwise function of the
query's and key's metadata (``pos``, ``kind``, ``tok``; see :mod:`genrec.model.layout`).
Non-standard: the PinGER rules never look at token order, only at item positions and kinds, which
is why removing history SID tokens (or moving tokens into a KV cache) cannot change what a dense
token sees.

Rules (PinGER layout):
1. a dense history token sees dense history tokens of items <= its own item, never an SID token;
2. a level-l SID token of item i sees dense tokens of items < i and SID tokens of item i with
   level <= l;
3. nothing else.
Candidates (all layouts): see every history token readable across items (PinGER / dense:
dense tokens; TIGER / HSTU: every history token) and themselves; never another candidate; no
history token sees a candidate. TIGER / dense / HSTU history: causal over token order.
Padding keys are never visible; a padding query sees only itself (so no row is empty: no NaN).

The item-block kernels' grid (:func:`item_block_token`): token ``s`` of a row is item ``s // T``,
slot ``s % T``; slots ``0..T-2`` are SID levels ``1..T-1`` and slot ``T-1`` is the item's dense
token -- the PinGER training layout without candidates. There, items ``>= lengths[b]`` are
padding whose query rows see nothing (the kernels output 0 there).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

DENSE = 0  # token kinds (``kind``): dense history token (HSTU: item token); 1..L: SID token of that level
CAND = -1  # candidate dense token
PAD = -2  # padding
ACTION = -3  # HSTU action token

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
CAUSAL_LAYOUTS = ("tiger", "dense", "hstu")  # history causal over token order


class Meta(Protocol):
    """Per-token metadata, each ``[B, S]`` int64 (e.g. :class:`genrec.model.layout.TokenMeta`)."""

    pos: torch.Tensor
    kind: torch.Tensor
    tok: torch.Tensor


def allowed(
    q_pos: torch.Tensor,
    q_kind: torch.Tensor,
    q_tok: torch.Tensor,
    k_pos: torch.Tensor,
    k_kind: torch.Tensor,
    k_tok: torch.Tensor,
    layout: str,
) -> torch.Tensor:
    """May the query token see the key token? Broadcastable elementwise torch ops only."""
    same = q_tok == k_tok
    q_pad = q_kind == PAD
    k_pad = k_kind == PAD
    q_cand = q_kind == CAND
    k_cand = k_kind == CAND
    if layout == "pinger":
        q_dense = q_kind == DENSE
        k_dense = k_kind == DENSE
        q_sid = q_kind >= 1
        k_sid = k_kind >= 1
        rule1 = q_dense & k_dense & (k_pos <= q_pos)
        rule2 = q_sid & ((k_dense & (k_pos < q_pos)) | (k_sid & (k_pos == q_pos) & (k_kind <= q_kind)))
        cand = q_cand & (k_dense | same)
        ok = rule1 | rule2 | cand
    elif layout in CAUSAL_LAYOUTS:
        q_hist = ~(q_pad | q_cand)
        k_hist = ~(k_pad | k_cand)
        ok = (q_hist & k_hist & (k_tok <= q_tok)) | (q_cand & (k_hist | same))
    else:
        raise ValueError(f"layout {layout!r}: unknown; choose pinger, tiger, dense or hstu")
    return (ok & ~k_pad) | (q_pad & same)


def make_mask_mod(q_meta: Meta, k_meta: Meta, layout: str) -> MaskMod:
    """``mask_mod(b, h, q_idx, kv_idx)`` for FlexAttention: index lookups + :func:`allowed`."""
    qp, qk, qt = q_meta.pos, q_meta.kind, q_meta.tok
    kp, kk, kt = k_meta.pos, k_meta.kind, k_meta.tok

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return allowed(qp[b, q_idx], qk[b, q_idx], qt[b, q_idx], kp[b, kv_idx], kk[b, kv_idx], kt[b, kv_idx], layout)

    return mask_mod


def reference_mask(q_meta: Meta, k_meta: Meta | None = None, layout: str = "pinger") -> torch.Tensor:
    """Boolean visibility ``[B, Sq, Sk]`` (True = may attend), from :func:`allowed`."""
    k_meta = q_meta if k_meta is None else k_meta
    return allowed(
        q_meta.pos[:, :, None], q_meta.kind[:, :, None], q_meta.tok[:, :, None],
        k_meta.pos[:, None, :], k_meta.kind[:, None, :], k_meta.tok[:, None, :],
        layout,
    )


def flex_block_mask(q_meta: Meta, k_meta: Meta | None = None, layout: str = "pinger") -> Any:  # -> BlockMask
    """FlexAttention ``BlockMask`` whose ``mask_mod`` is the same predicate."""
    from torch.nn.attention.flex_attention import create_block_mask  # local: FlexAttention is only needed here

    k_meta = q_meta if k_meta is None else k_meta
    b, sq = q_meta.pos.shape
    sk = k_meta.pos.shape[1]
    return create_block_mask(make_mask_mod(q_meta, k_meta, layout), b, None, sq, sk,
                             device=str(q_meta.pos.device))


# ---------------------------------------------------------------- the item-block kernels' grid


def item_block_token(idx: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pos, kind, tok) of token index ``idx`` on the kernels' grid of ``T`` tokens per item (no padding)."""
    slot = idx % T
    return idx // T, torch.where(slot == T - 1, DENSE, slot + 1), idx


def item_block_rule(n_items: int, T: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean ``[S, S]`` (query, key), ``S = n_items * T``: :func:`allowed` on a full row of the grid."""
    s = torch.arange(n_items * T, device=device)
    q, k = item_block_token(s[:, None], T), item_block_token(s[None, :], T)
    return allowed(*q, *k, "pinger")


def item_block_mask_mod(lengths: torch.Tensor, T: int) -> MaskMod:
    """FlexAttention ``mask_mod`` of the kernels' grid: :func:`allowed` between the row's valid items
    (``< lengths[b]``); padding queries see nothing."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        n = lengths[b]
        rule = allowed(*item_block_token(q_idx, T), *item_block_token(kv_idx, T), "pinger")
        return rule & (q_idx // T < n) & (kv_idx // T < n)

    return mask_mod
