"""Preference tuning of the SID head (PinGER §post-training): DPO on pairs from the same request.

A pair is two items of one logged feedview (or impression slate): the **chosen** one engaged with a
positive action, the **rejected** one disliked -- or, when the slate has no disliked item, shown and not
engaged (a logged label-0 item or a sampled impression-only candidate). Both are scored as the next item
after the same history, the one cut at that request, by the log-probability of their whole SID under the
policy (the model being trained) and under a frozen reference (the model the stage started from):

    L_dpo = -log sigmoid(beta * ((log pi(w) - log ref(w)) - (log pi(l) - log ref(l))))

(Rafailov et al. 2023). Non-standard: the sequence log-probability is taken by teacher forcing on the
training layout -- the history with the candidate appended as its next item, the SID levels' logits read at
that item -- which is the same function as the serving beam's (history SID tokens can be dropped: tested in
tests/model), on the training forward every attention path can differentiate.

The pair choice is a pure function of the batch (a hash of request and item), so resume replays it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genrec.model.genrec_model import GenRecModel, ModelBatch

__all__ = ["preference_pairs", "sid_sequence_logprob", "dpo_loss"]


def _keys(rows: torch.Tensor, salt: torch.Tensor) -> torch.Tensor:
    """Pseudo-random int keys in [0, 2^20) from item rows and a per-row salt (deterministic, no RNG state)."""
    x = (rows * 2654435761 + salt[:, None] * 40503 + 12345) % 1048573
    return (x * 69069 + 1) % 1048576


def preference_pairs(cand_rows: torch.Tensor, cand_labels: torch.Tensor, cand_valid: torch.Tensor,
                     positive: torch.Tensor, negative: torch.Tensor,
                     salt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One (chosen, rejected) pair per slate that has both -> ``(row_index [P], chosen [P], rejected [P])``
    (catalogue rows). ``cand_labels [B, k, C]`` action bits, ``positive`` / ``negative`` ``[C]`` bool: the
    actions that make an item chosen (any positive bit) or rejected first (a negative bit, e.g. dislike);
    without a negative item a valid candidate with no positive bit is rejected. Among several, the one with
    the smallest hash key of ``(salt[b], row)`` is taken."""
    lab = cand_labels > 0  # [B, k, C]
    pos = (lab & positive).any(-1) & cand_valid  # [B, k]
    neg = (lab & negative).any(-1) & cand_valid & ~pos
    other = cand_valid & ~pos & ~neg
    big = 1 << 22
    key = _keys(cand_rows, salt)  # [B, k]
    kc = torch.where(pos, key, big)
    kr = torch.where(neg, key, torch.where(other, key + big // 2, big))  # a disliked item before a skipped one
    ci, ri = kc.argmin(1), kr.argmin(1)  # [B]
    ok = (kc.gather(1, ci[:, None])[:, 0] < big) & (kr.gather(1, ri[:, None])[:, 0] < big)
    b = ok.nonzero()[:, 0]
    return b, cand_rows[b, ci[b]], cand_rows[b, ri[b]]


def sid_sequence_logprob(model: GenRecModel, mb: ModelBatch, codes: torch.Tensor) -> torch.Tensor:
    """``log P(SID of the item at position lengths-1 | the items before it)`` per row: ``[B]``.

    ``mb`` holds each row's history with the scored item appended as its last item (``lengths`` counts
    it; ``pos_lengths`` must be ``lengths - 1`` so that item is the training target serving predicts);
    ``codes [B, L]`` its SID."""
    out = model(mb)
    assert out.sid_logits is not None, "sid_sequence_logprob needs a model with SID heads"
    last = (mb.lengths - 1)[:, None]  # [B, 1]
    total = codes.new_zeros(codes.shape[0], dtype=torch.float32)
    for lvl, lg in enumerate(out.sid_logits):  # level l's logits of item i sit at position i
        lp = F.log_softmax(lg.float(), dim=-1)  # [B, n, K]
        at = lp.gather(1, last[..., None].expand(-1, 1, lp.shape[-1]))[:, 0]  # [B, K]
        total = total + at.gather(1, codes[:, lvl:lvl + 1])[:, 0]
    return total


def dpo_loss(pi_w: torch.Tensor, pi_l: torch.Tensor, ref_w: torch.Tensor, ref_l: torch.Tensor,
             beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pair: the DPO loss ``[P]`` and whether its implicit reward ranks the chosen item first (0/1 ``[P]``)."""
    margin = beta * ((pi_w - ref_w) - (pi_l - ref_l))
    return -F.logsigmoid(margin), (margin > 0).float().detach()
