"""Training losses: logQ-corrected sampled softmax, Semantic-ID cross-entropy, MAM action BCE.

Follows UniPinRec §3.0.1 (eq. 1, 3) and §3.1.1 (eq. 4), PinGER §3 for the SID term.

* :func:`sampled_softmax_loss` — eq. 1: ``s(u, i) = λ·uᵀi − log Q(i)`` with ``λ = 1/temperature``,
  applied to the positive *and* every negative; negatives are the positives of the other rows
  (in-batch) plus sampled ones. Non-standard: an "accidental hit" (a negative whose id equals
  the row's positive id, e.g. the same item appearing twice in a batch) is masked out instead
  of being pushed down. Averaged over all rows (eq. 3: all history positions with a target).
* :func:`sid_loss` — token cross-entropy per SID level, averaged over valid (row, level) targets.
* :func:`action_loss` — eq. 4 exactly: per action head ``c``, the mean BCE over masked past
  positions plus the mean BCE over candidates, as two separately averaged terms, times ``w_c``.
  An empty set contributes 0 (never NaN).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from genrec.errors import ConfigError


def _acc(x: torch.Tensor) -> torch.Tensor:
    """Accumulate in float32 at least (bf16/fp16 logits are upcast; float64 stays float64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def sampled_softmax_logits(
    user_vecs: torch.Tensor,
    pos_item_vecs: torch.Tensor,
    pos_ids: torch.Tensor,
    neg_item_vecs: torch.Tensor,
    neg_ids: torch.Tensor,
    log_q_pos: torch.Tensor,
    log_q_neg: torch.Tensor,
    temperature: float,
    *,
    remove_accidental_hits: bool = True,
    in_batch_negatives: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrected logits ``[P, 1 + K]`` (column 0 = the positive) and the hit mask ``[P, 1 + K]``.

    ``K = (P − 1 if in_batch_negatives) + M``. Masked entries are ``-inf``.
    """
    P, D = user_vecs.shape
    _check(pos_item_vecs.shape == (P, D), f"pos_item_vecs must be [{P}, {D}], got {tuple(pos_item_vecs.shape)}")
    _check(pos_ids.shape == (P,), f"pos_ids must be [{P}], got {tuple(pos_ids.shape)}")
    _check(log_q_pos.shape == (P,), f"log_q_pos must be [{P}], got {tuple(log_q_pos.shape)}")
    _check(neg_item_vecs.dim() == 2 and neg_item_vecs.shape[1] == D,
           f"neg_item_vecs must be [M, {D}], got {tuple(neg_item_vecs.shape)}")
    M = neg_item_vecs.shape[0]
    _check(neg_ids.shape == (M,), f"neg_ids must be [{M}], got {tuple(neg_ids.shape)}")
    _check(log_q_neg.shape == (M,), f"log_q_neg must be [{M}], got {tuple(log_q_neg.shape)}")
    _check(temperature > 0, f"temperature must be > 0, got {temperature}")
    lam = 1.0 / temperature

    pos_logit = lam * (user_vecs * pos_item_vecs).sum(-1) - log_q_pos  # [P]
    cols = [pos_logit[:, None]]
    masks = [torch.zeros(P, 1, dtype=torch.bool, device=user_vecs.device)]
    if in_batch_negatives and P > 1:
        ib = lam * user_vecs @ pos_item_vecs.T - log_q_pos[None, :]  # [P, P]
        off = ~torch.eye(P, dtype=torch.bool, device=user_vecs.device)  # [P, P]
        ib = ib[off].view(P, P - 1)  # [P, P-1]: row p without column p
        ib_ids = pos_ids[None, :].expand(P, P)[off].view(P, P - 1)  # [P, P-1]
        cols.append(ib)
        masks.append(ib_ids == pos_ids[:, None] if remove_accidental_hits else torch.zeros_like(ib, dtype=torch.bool))
    if M > 0:
        sn = lam * user_vecs @ neg_item_vecs.T - log_q_neg[None, :]  # [P, M]
        cols.append(sn)
        masks.append(neg_ids[None, :] == pos_ids[:, None] if remove_accidental_hits
                     else torch.zeros_like(sn, dtype=torch.bool))
    logits = torch.cat(cols, dim=1)  # [P, 1+K]
    hit = torch.cat(masks, dim=1)  # [P, 1+K]
    logits = logits.masked_fill(hit, float("-inf"))
    return logits, hit


def sampled_softmax_loss(
    user_vecs: torch.Tensor,
    pos_item_vecs: torch.Tensor,
    pos_ids: torch.Tensor,
    neg_item_vecs: torch.Tensor,
    neg_ids: torch.Tensor,
    log_q_pos: torch.Tensor,
    log_q_neg: torch.Tensor,
    temperature: float,
    *,
    remove_accidental_hits: bool = True,
    in_batch_negatives: bool = True,
    reduction: str = "mean",
) -> torch.Tensor:
    """UniPinRec eq. 1 averaged over the ``P`` rows (eq. 3; ``reduction="sum"``: summed). Scalar.

    user_vecs [P, D], pos_item_vecs [P, D], pos_ids [P], neg_item_vecs [M, D], neg_ids [M],
    log_q_pos [P], log_q_neg [M] (log sampling probabilities, e.g. from
    :meth:`genrec.model.sketch.CountMinSketch.log_q`; pass zeros for no correction).
    """
    _check(reduction in ("mean", "sum"), f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if user_vecs.shape[0] == 0:
        return user_vecs.sum() * 0.0
    logits, _ = sampled_softmax_logits(
        user_vecs, pos_item_vecs, pos_ids, neg_item_vecs, neg_ids, log_q_pos, log_q_neg, temperature,
        remove_accidental_hits=remove_accidental_hits, in_batch_negatives=in_batch_negatives,
    )
    # -log softmax at column 0 = logsumexp(row) - logit_pos
    logits = _acc(logits)
    nll = torch.logsumexp(logits, dim=1) - logits[:, 0]  # [P]
    return nll.sum() if reduction == "sum" else nll.mean()


def sid_loss(
    logits: Sequence[torch.Tensor] | torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy over SID levels, averaged over valid (row, level) targets. Scalar.

    logits: a list of ``L`` tensors ``[N, V_l]`` (vocab may differ per level) or one ``[N, L, V]``;
    targets: ``[N, L]`` int64 codes; mask: ``[N]`` or ``[N, L]`` bool (True = counts), default all.
    """
    if isinstance(logits, torch.Tensor):
        _check(logits.dim() == 3, f"logits tensor must be [N, L, V], got {tuple(logits.shape)}")
        levels = list(logits.unbind(1))
    else:
        levels = list(logits)
    _check(targets.dim() == 2, f"targets must be [N, L], got {tuple(targets.shape)}")
    N, L = targets.shape
    _check(len(levels) == L, f"got {len(levels)} levels of logits but targets has {L} levels")
    if mask is None:
        mask = torch.ones(N, L, dtype=torch.bool, device=targets.device)
    elif mask.dim() == 1:
        _check(mask.shape == (N,), f"mask must be [{N}] or [{N}, {L}], got {tuple(mask.shape)}")
        mask = mask[:, None].expand(N, L)
    _check(mask.shape == (N, L), f"mask must be [{N}] or [{N}, {L}], got {tuple(mask.shape)}")
    mask = mask.bool()
    total = _acc(levels[0]).new_zeros(()) if L else torch.zeros((), device=targets.device)
    for lvl, lg in enumerate(levels):
        _check(lg.dim() == 2 and lg.shape[0] == N, f"level {lvl} logits must be [{N}, V], got {tuple(lg.shape)}")
        tgt = targets[:, lvl].masked_fill(~mask[:, lvl], 0)  # [N]
        _check(bool(((tgt >= 0) & (tgt < lg.shape[1])).all()),
               f"level {lvl} targets out of range [0, {lg.shape[1]})")
        ce = F.cross_entropy(_acc(lg), tgt, reduction="none")  # [N]
        total = total + (ce * mask[:, lvl]).sum()
    count = mask.sum()
    return total / count.clamp_min(1)


def masked_bce_sums(logits: torch.Tensor, labels: torch.Tensor,
                    mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head BCE summed over masked rows, and the rows counted: ``([C], [C])``.

    The mean is ``sum / count.clamp_min(1)``; split so that a batch split over processes can divide
    every process's sum by the count over all of them (the whole batch's mean, not a mean of means).
    """
    R, C = logits.shape
    _check(labels.shape == (R, C), f"labels must be [{R}, {C}], got {tuple(labels.shape)}")
    if mask is None:
        m = torch.ones(R, C, dtype=torch.bool, device=logits.device)
    elif mask.dim() == 1:
        _check(mask.shape == (R,), f"mask must be [{R}] or [{R}, {C}], got {tuple(mask.shape)}")
        m = mask.bool()[:, None].expand(R, C)
    else:
        _check(mask.shape == (R, C), f"mask must be [{R}] or [{R}, {C}], got {tuple(mask.shape)}")
        m = mask.bool()
    logits = _acc(logits)
    bce = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")  # [R, C]
    bce = bce.masked_fill(~m, 0.0)
    return bce.sum(0), m.sum(0)  # [C], [C]


def _masked_mean_bce(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Per-head mean BCE over masked rows: ``[C]`` (0 where a head has no valid row)."""
    total, count = masked_bce_sums(logits, labels, mask)
    return total / count.clamp_min(1)  # [C]


def _check_action_args(logits_past: torch.Tensor, logits_cand: torch.Tensor,
                       weights: torch.Tensor | Sequence[float]) -> torch.Tensor:
    C = logits_past.shape[-1]
    _check(logits_past.dim() == 2 and logits_cand.dim() == 2, "action logits must be 2-D [rows, C]")
    _check(logits_cand.shape[-1] == C, f"logits_cand has {logits_cand.shape[-1]} heads, logits_past has {C}")
    w = torch.as_tensor(weights, device=logits_past.device).to(_acc(logits_past).dtype)
    _check(w.shape == (C,), f"weights must be [{C}], got {tuple(w.shape)}")
    return w


def action_loss(
    logits_past: torch.Tensor,
    labels_past: torch.Tensor,
    mask_past: torch.Tensor | None,
    logits_cand: torch.Tensor,
    labels_cand: torch.Tensor,
    mask_cand: torch.Tensor | None,
    weights: torch.Tensor | Sequence[float],
) -> torch.Tensor:
    """UniPinRec eq. 4. Scalar.

    logits_past/labels_past [P, C] with mask_past [P] or [P, C] (True = a masked past position,
    i.e. in ``M_past``); logits_cand/labels_cand [Q, C] with mask_cand [Q] or [Q, C] (True = a
    real candidate, False = padding); weights [C] = ``w_c``.
    """
    w = _check_action_args(logits_past, logits_cand, weights)
    past = _masked_mean_bce(logits_past, labels_past, mask_past)  # [C]
    cand = _masked_mean_bce(logits_cand, labels_cand, mask_cand)  # [C]
    return (w * (past + cand)).sum()


def action_loss_sums(
    logits_past: torch.Tensor,
    labels_past: torch.Tensor,
    mask_past: torch.Tensor | None,
    logits_cand: torch.Tensor,
    labels_cand: torch.Tensor,
    mask_cand: torch.Tensor | None,
    weights: torch.Tensor | Sequence[float],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`action_loss` before its means: ``(past_sum, past_count, cand_sum, cand_count)``, each ``[C]``,
    the sums already weighted by ``w_c``; ``action_loss`` is ``Σ_c past_sum/past_count + cand_sum/cand_count``
    (counts clamped to 1). Same arguments."""
    w = _check_action_args(logits_past, logits_cand, weights)
    ps, pc = masked_bce_sums(logits_past, labels_past, mask_past)
    cs, cc = masked_bce_sums(logits_cand, labels_cand, mask_cand)
    return w * ps, pc, w * cs, cc


@dataclass(frozen=True)
class JointLossWeights:
    """``L = w_sid·L_sid + w_item·L_item + w_action·L_action`` (the joint objective)."""

    sid: float = 1.0
    item: float = 1.0
    action: float = 1.0

    def __post_init__(self) -> None:
        for name in ("sid", "item", "action"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0 or v != v:
                raise ConfigError(f"loss weight {name!r} must be a non-negative number, got {v!r}")

    def combine(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Weighted sum of the terms present among ``{"sid", "item", "action"}``.

        Unknown keys raise (a typo would otherwise silently drop a loss term).
        """
        unknown = set(terms) - {"sid", "item", "action"}
        if unknown:
            raise KeyError(f"unknown loss terms {sorted(unknown)}; expected sid/item/action")
        if not terms:
            raise ValueError("no loss terms to combine")
        return sum(getattr(self, k) * v for k, v in terms.items())  # type: ignore[return-value]
