"""What :class:`genrec.model.genrec_model.GenRecModel` reads and returns: :class:`ModelBatch` (a batch of
right-padded histories and optional candidates), :class:`ModelOutput` (the training forward's logits and
vectors) and :class:`BeamContext` (what a SID beam step reads from one history encoding)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genrec.model.layout import TokenLayout

__all__ = ["BeamContext", "ModelBatch", "ModelOutput"]


@dataclass
class ModelBatch:
    """A batch of right-padded histories (+ optional candidates). Values at padding slots are ignored.

    Exactly one of ``item_feats`` ``[B, n, F]`` / ``item_vecs`` ``[B, n, item_dim]`` is given (same for
    candidates). ``actions`` ``[B, n]`` in ``[0, C]`` (C = [MASK]); ``action_mask`` ``[B, n]`` True =
    replace by [MASK]. ``target_actions`` ``[B, n]`` (C = none) and ``request_surface`` /
    ``request_action`` ``[B]`` feed target conditioning (target of item i = its surface / action;
    target after the last item = the request's). ``timestamps`` ``[B, n]`` (seconds) and
    ``request_ts`` ``[B]`` feed the optional time-gap embedding (gap to the previous item; the
    candidates' gap is ``request_ts`` minus the last item's timestamp).
    """

    actions: torch.Tensor
    surfaces: torch.Tensor
    lengths: torch.Tensor
    sid_codes: torch.Tensor | None = None
    item_feats: torch.Tensor | None = None
    item_vecs: torch.Tensor | None = None
    action_mask: torch.Tensor | None = None
    target_actions: torch.Tensor | None = None
    request_surface: torch.Tensor | None = None
    request_action: torch.Tensor | None = None
    cand_feats: torch.Tensor | None = None
    cand_vecs: torch.Tensor | None = None
    cand_sid_codes: torch.Tensor | None = None
    cand_surface: torch.Tensor | None = None  # [B] or [B, k]
    timestamps: torch.Tensor | None = None
    request_ts: torch.Tensor | None = None
    item_ids: torch.Tensor | None = None  # [B, n] item ids, for the encoder's ID vectors (with item_feats)
    cand_ids: torch.Tensor | None = None  # [B, k] (with cand_feats)
    # positions="end": the item index that gets position id max_items, per row [B] (default ``lengths``:
    # the item after the history, where candidates and beam tokens sit). A training row whose last item
    # is only a target passes ``lengths - 1``, so the item predicting it sits where serving's newest
    # history item does (SASRec trains on s[:-1] -> s[1:]).
    pos_lengths: torch.Tensor | None = None

    @property
    def n_items(self) -> int:
        return self.actions.shape[1]

    @property
    def n_cand(self) -> int:
        for t in (self.cand_vecs, self.cand_feats):
            if t is not None:
                return t.shape[1]
        return 0


@dataclass
class ModelOutput:
    """Training outputs. ``sid_logits[l-1]`` ``[B, n, K_l]`` are the logits for level l of item i
    (valid where ``sid_valid[l-1]``); ``user_vecs[:, i]`` predicts item i+1 (valid where
    ``item_valid``); ``next_sid_logits`` ``[B, K_1]`` / ``next_user_vec`` ``[B, item_dim]`` predict the
    item after the last; ``action_logits`` ``[B, n, C]`` at past positions, ``cand_action_logits``
    ``[B, k, C]``; ``item_vecs`` / ``cand_vecs`` are the L2-normalised vectors of the batch items."""

    hidden: torch.Tensor
    layout: TokenLayout
    item_valid: torch.Tensor
    item_vecs: torch.Tensor
    sid_logits: list[torch.Tensor] | None = None
    sid_valid: list[torch.Tensor] | None = None
    next_sid_logits: torch.Tensor | None = None
    user_vecs: torch.Tensor | None = None
    next_user_vec: torch.Tensor | None = None
    action_logits: torch.Tensor | None = None
    cand_action_logits: torch.Tensor | None = None
    cand_vecs: torch.Tensor | None = None


@dataclass
class BeamContext:
    """What a SID beam step reads from one history encoding, checked once per request: per-layer
    cached K/V ``[B, H, n, Dh]``, the prefix ``hist_len`` ``[B]`` of cached tokens every beam token
    sees (the shared-prefix plan), item counts ``lengths`` ``[B]``, the last history hidden
    ``[B, D]`` and the request target (``[B]`` or None). Steps over it never synchronise with the
    host (:meth:`GenRecModel.sid_logits_ctx`), which is what lets a CUDA graph capture them."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    hist_len: torch.Tensor
    lengths: torch.Tensor
    last_hidden: torch.Tensor
    surface: torch.Tensor | None = None
    action: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.k[0].shape[2]) if self.k else 0
