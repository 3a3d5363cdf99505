"""Pure-PyTorch references (the slow, obviously-correct twins) for the genrec attention kernels.

Follows PinGER §3.3.2 (the three mask rules of the interleaved SID/dense training layout) and
§3.3.4 (the item-block kernel whose output these references must match), plus the cascade
attention used by beam-search decoding (shared history KV + per-beam suffix KV).

Non-standard here: the mask is not causal. It is the one predicate of :mod:`genrec.kernels.mask`
on the kernels' grid: token ``s`` of a row is item ``s // T``, slot ``s % T``; slots ``0..T-2``
are SID levels ``1..T-1`` and slot ``T-1`` is the item's dense token. Items ``>= lengths[b]`` are
padding: invisible as keys, and their query rows output exactly 0.

Everything is computed in fp32 with an explicit boolean mask and returned in the input dtype.

Also the twin of SID fusion's attention kernel (``sid_fusion``; PinGER §3.3.2), which the model runs
itself wherever the kernel is off.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from genrec.kernels.mask import item_block_rule
from genrec.validation import checks_on

__all__ = [
    "item_block_mask",
    "item_block_attention_ref",
    "cascade_attention_ref",
    "check_fusion_inputs",
    "dropout_keep",
    "fusion_attention_torch",
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
    lengths_t = lengths_t.to(torch.int64)
    if checks_on() and lengths_t.numel():
        lo, hi = torch.stack(torch.aminmax(lengths_t)).tolist()  # one device->host sync, not two
        if lo < 0 or hi > n_items:
            raise ValueError(f"{name}: values must lie in [0, {n_items}], got {lengths_t.tolist()}")
    return lengths_t


def item_block_mask(lengths: torch.Tensor | list[int], n_items: int, T: int) -> torch.Tensor:
    """Boolean visibility mask ``[B, S, S]`` (query, key), ``S = n_items * T``, from the PinGER rules
    (:func:`genrec.kernels.mask.item_block_rule`: the one predicate on the kernels' grid).

    Padding query rows (item >= length) are all False.
    """
    if T < 1:
        raise ValueError(f"T: tokens per item must be >= 1, got {T}")
    lengths_t = torch.as_tensor(lengths)
    if lengths_t.dim() != 1:
        raise ValueError(f"lengths: expected a 1-D tensor [B], got shape {tuple(lengths_t.shape)}")
    device = lengths_t.device
    lengths_t = _check_lengths(lengths_t, lengths_t.shape[0], n_items, device)
    rule = item_block_rule(n_items, T, device)  # [S, S]
    valid = torch.arange(n_items * T, device=device)[None, :] // T < lengths_t[:, None]  # [B, S]
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


# ---------------------------------------------------------------- SID fusion


def check_fusion_inputs(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, kv_dense: torch.Tensor,
                        heads: int, keep: torch.Tensor | None) -> tuple[int, int, int]:
    """SID fusion attention's inputs (see :func:`fusion_attention_torch`): -> (N, D, L)."""
    if q.dim() != 2:
        raise ValueError(f"fusion_attention: q must be [N, D], got {tuple(q.shape)}")
    n, d = q.shape
    if heads < 1 or d % heads:
        raise ValueError(f"fusion_attention: heads={heads} must divide D={d}")
    if kv_rows.dim() != 2 or kv_rows.shape[1] != 2 * d:
        raise ValueError(f"fusion_attention: kv_rows must be [R, 2D={2 * d}], got {tuple(kv_rows.shape)}")
    if kv_dense.shape != (n, 2 * d):
        raise ValueError(f"fusion_attention: kv_dense must be [N={n}, 2D={2 * d}], got {tuple(kv_dense.shape)}")
    if rows.dim() != 2 or rows.shape[0] != n or rows.dtype.is_floating_point:
        raise ValueError(f"fusion_attention: rows must be an integer [N={n}, L] tensor, got {tuple(rows.shape)} "
                         f"{rows.dtype}")
    levels = rows.shape[1]
    if keep is not None and keep.shape != (n, heads, levels + 1):
        raise ValueError(f"fusion_attention: keep must be [N={n}, H={heads}, L+1={levels + 1}], got {tuple(keep.shape)}")
    return n, d, levels


def dropout_keep(n: int, heads: int, levels: int, p: float, device: torch.device) -> torch.Tensor:
    """A keep mask ``[N, H, L+1]`` (bool) for attention-probability dropout at rate ``p``."""
    return torch.rand(n, heads, levels + 1, device=device) >= p


def fusion_attention_torch(q: torch.Tensor, kv_rows: torch.Tensor, rows: torch.Tensor, kv_dense: torch.Tensor,
                           heads: int, keep: torch.Tensor | None = None, p_drop: float = 0.0) -> torch.Tensor:
    """The slow twin: gather each item's L SID keys/values, append its dense one, softmax in fp32.

    q ``[N, D]``, kv_rows ``[R, 2D]``, rows int ``[N, L]`` (row of each SID level in kv_rows),
    kv_dense ``[N, 2D]`` -> ``[N, D]`` in q's dtype. ``keep`` ``[N, H, L+1]`` with ``p_drop``:
    probabilities dropped where keep is False, the rest scaled by ``1 / (1 - p_drop)``."""
    n, d, levels = check_fusion_inputs(q, kv_rows, rows, kv_dense, heads, keep)
    dh = d // heads
    kv = torch.cat([kv_rows[rows.long()], kv_dense[:, None]], 1)  # [N, L+1, 2D]
    k, v = kv.view(n, levels + 1, 2, heads, dh).float().unbind(2)  # [N, L+1, H, Dh]
    s = torch.einsum("nhd,nlhd->nhl", q.view(n, heads, dh).float(), k) / math.sqrt(dh)
    p = s.softmax(-1)  # [N, H, L+1]
    if keep is not None:
        p = torch.where(keep, p / (1.0 - p_drop), 0.0)
    return torch.einsum("nhl,nlhd->nhd", p, v).reshape(n, d).to(q.dtype)
