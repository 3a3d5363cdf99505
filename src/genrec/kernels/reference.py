"""Pure-PyTorch references (the slow, obviously-correct twins) for the genrec attention kernels.

Follows PinGER §3.3.2 (the three mask rules of the interleaved SID/dense training layout) and
§3.3.4 (the item-block kernel whose output these references must match), plus the cascade
attention used by beam-search decoding (shared history KV + per-beam suffix KV).

Non-standard here: the mask is not causal. Token ``s`` of a row is item ``s // T``, slot
``s % T``; slots ``0..T-2`` are SID levels ``1..T-1`` and slot ``T-1`` is the item's dense token.

* a dense token sees the dense tokens of items ``<=`` its own item;
* an SID token of level ``l`` of item ``i`` sees the dense tokens of items ``< i`` and the SID
  tokens of its own item with level ``<= l``;
* nothing else. Items ``>= lengths[b]`` are padding: invisible as keys, and their query rows
  output exactly 0.

Everything is computed in fp32 with an explicit boolean mask and returned in the input dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from genrec.validation import checks_on

__all__ = [
    "item_block_mask",
    "item_block_attention_ref",
    "cascade_attention_ref",
]


def _check_lengths(
    lengths: torch.Tensor | list[int], batch: int, n_items: int, device: torch.device, name: str = "lengths"
) -> torch.Tensor:
    """Validate a per-row count tensor ``[batch]`` with values in ``[0, n_items]``; returns int64."""
    lengths_t = torch.as_tensor(lengths, device=device)
    if lengths_t.dim() != 1 or lengths_t.shape[0] != batch:
        raise ValueError(f"{name}: expected shape [{batch}], got {tuple(lengths_t.shape)}")
    if lengths_t.is_floating_point():
        raise ValueError(f"{name}: expected an integer tensor, got {lengths_t.dtype}")
    if checks_on() and lengths_t.numel() and (int(lengths_t.min()) < 0 or int(lengths_t.max()) > n_items):
        raise ValueError(f"{name}: values must lie in [0, {n_items}], got {lengths_t.tolist()}")
    return lengths_t.to(torch.int64)


def item_block_mask(lengths: torch.Tensor | list[int], n_items: int, T: int) -> torch.Tensor:
    """Boolean visibility mask ``[B, S, S]`` (query, key), ``S = n_items * T``, from the PinGER rules.

    Padding query rows (item >= length) are all False.
    """
    if T < 1:
        raise ValueError(f"T: tokens per item must be >= 1, got {T}")
    lengths_t = torch.as_tensor(lengths)
    if lengths_t.dim() != 1:
        raise ValueError(f"lengths: expected a 1-D tensor [B], got shape {tuple(lengths_t.shape)}")
    device = lengths_t.device
    lengths_t = _check_lengths(lengths_t, lengths_t.shape[0], n_items, device)
    s = torch.arange(n_items * T, device=device)
    item, slot = s // T, s % T  # [S]
    dense = slot == T - 1
    qi, ki = item[:, None], item[None, :]  # [S, 1], [1, S]
    qd, kd = dense[:, None], dense[None, :]
    dense_key = kd & ((qd & (ki <= qi)) | (~qd & (ki < qi)))
    sid_key = ~kd & ~qd & (ki == qi) & (slot[None, :] <= slot[:, None])
    rule = dense_key | sid_key  # [S, S]
    valid = item[None, :] < lengths_t[:, None]  # [B, S]
    return rule[None] & valid[:, :, None] & valid[:, None, :]  # [B, S, S]


def item_block_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    T: int,
    scale: float | None = None,
) -> torch.Tensor:
    """PinGER item-block attention, slow twin. q, k, v: ``[B, H, S, D]``; lengths: int ``[B]``.

    Returns ``[B, H, S, D]`` in q's dtype; padding query rows are 0. Differentiable.
    """
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v: expected equal [B, H, S, D] shapes, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, S, D = q.shape
    if T < 1 or S % T:
        raise ValueError(f"T: sequence length {S} is not a multiple of tokens per item T={T}")
    n_items = S // T
    lengths_t = _check_lengths(lengths, B, n_items, q.device)
    mask = item_block_mask(lengths_t, n_items, T)  # [B, S, S]
    row_ok = mask.any(-1)  # [B, S]
    # Padding rows would be all-masked (NaN in SDPA): let them see themselves, then zero them.
    eye = torch.eye(S, dtype=torch.bool, device=q.device)
    safe = mask | (~row_ok[:, :, None] & eye)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=safe[:, None], scale=scale
    )  # [B, H, S, D]
    out = torch.where(row_ok[:, None, :, None], out, torch.zeros((), device=q.device))
    return out.to(q.dtype)


def cascade_attention_ref(
    q: torch.Tensor,
    k_hist: torch.Tensor,
    v_hist: torch.Tensor,
    k_suf: torch.Tensor,
    v_suf: torch.Tensor,
    hist_len: torch.Tensor | list[int],
    scale: float | None = None,
) -> torch.Tensor:
    """Per-beam attention over ``concat(history KV, own suffix KV)``, slow twin.

    q, k_suf, v_suf: ``[B, W, H, t, D]`` (W beams of t tokens); k_hist, v_hist: ``[B, H, n, D]``
    shared by the W beams of request b; hist_len: int ``[B]`` valid history length. Suffix
    token j of a beam sees all valid history and the beam's own suffix tokens ``<= j``.
    Returns ``[B, W, H, t, D]`` in q's dtype.
    """
    if q.dim() != 5 or k_suf.shape != q.shape or v_suf.shape != q.shape:
        raise ValueError(f"q, k_suf, v_suf: expected equal [B, W, H, t, D] shapes, got {tuple(q.shape)}, {tuple(k_suf.shape)}, {tuple(v_suf.shape)}")
    B, W, H, t, D = q.shape
    if k_hist.dim() != 4 or k_hist.shape != v_hist.shape or k_hist.shape[0] != B or k_hist.shape[1] != H or k_hist.shape[3] != D:
        raise ValueError(f"k_hist, v_hist: expected [B={B}, H={H}, n, D={D}], got {tuple(k_hist.shape)}, {tuple(v_hist.shape)}")
    n = k_hist.shape[2]
    hl = _check_lengths(hist_len, B, n, q.device, name="hist_len")
    k = torch.cat([k_hist[:, None].expand(B, W, H, n, D), k_suf], dim=3).float()  # [B, W, H, n+t, D]
    v = torch.cat([v_hist[:, None].expand(B, W, H, n, D), v_suf], dim=3).float()
    hist_ok = torch.arange(n, device=q.device)[None, :] < hl[:, None]  # [B, n]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()  # [t, t]
    mask = torch.cat([hist_ok[:, None, :].expand(B, t, n), causal[None].expand(B, t, t)], dim=2)  # [B, t, n+t]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = F.scaled_dot_product_attention(q.float(), k, v, attn_mask=mask[:, None, None], scale=scale)
    return out.to(q.dtype)
