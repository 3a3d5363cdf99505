"""A trained model with the catalogue tensors it reads: what inference holds of a run.

Training wraps the model in its objective (:class:`genrec.train.objective.JointObjective`), which holds
the catalogue tensors (item features, ids, SID codes) beside its loss state. Inference needs the model and
those tensors only: :class:`CatalogModel` holds them, computes the catalogue's item vectors and gathers a
collated batch's model inputs as the objective does outside training (no action masking, no engagement
dropout: the model is in eval mode there), so the same weights give the same numbers. The weights come
from the checkpoint through :func:`genrec.model.checkpoint_io.load_checkpoint`, which reads the
objective's state into the bare model.

Items ``genrec sid assign`` added after training (``catalog.added``) are served as their content neighbours
suggest: the catalogue imputes their engagement block (:func:`genrec.catalog.load_catalog`), and where the model
has learned ID vectors, :class:`CatalogModel` gives each such item one, imputed the same way
(:func:`genrec.sid.source.impute_from_neighbours` over the trained rows). Every other item's vector is the
model's own.
"""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np
import torch
from torch import nn

from genrec.catalog import ItemCatalog
from genrec.model.genrec_model import GenRecModel, ModelBatch
from genrec.sid.source import impute_from_neighbours

__all__ = ["CatalogModel", "HistoryBatch", "impute_id_vectors", "model_codes"]


def model_codes(codes: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """The SID codes ``[N, L]`` as the model reads them: a code past its level's codebook -- a final code that
    `genrec sid assign` added when the disambiguation level grew beyond the model's -- is read as code 0 of that
    level (the first item of the same prefix: the level numbers the items of a prefix and carries no content).
    The catalogue keeps the real codes; retrieval reaches such items through their prefix
    (:mod:`genrec.decode.prefix`)."""
    if codes.shape[1] == 0 or codes.shape[1] != len(sizes):
        return codes
    k = torch.tensor(sizes, dtype=codes.dtype, device=codes.device)  # [L]
    return torch.where(codes < k, codes, torch.zeros_like(codes))


def impute_id_vectors(model: GenRecModel, catalog: ItemCatalog) -> tuple[np.ndarray, np.ndarray]:
    """The items of ``catalog`` that ``genrec sid assign`` added and ``model`` has no ID vector for, and an ID
    vector for each, f32 ``[m, item_dim]``: the similarity-weighted mean of the trained ID vectors of the items
    nearest by content (:func:`genrec.sid.source.impute_from_neighbours`, the rule a new item's engagement block
    is imputed by), among the catalogue's items that have one. Content: the features' first ``F - n_engagement``
    columns. No ID vectors, or none to impute from: nothing."""
    enc = model.item_encoder
    none = (np.zeros(0, np.int64), np.zeros((0, model.config.item_dim), np.float32))
    if enc.id_emb is None or catalog.added is None:
        return none
    ids = torch.from_numpy(np.asarray(catalog.item_ids, dtype=np.int64)).to(enc.id_keys.device)
    slots = enc.slots(ids).cpu().numpy()  # [N], -1: no trained ID vector
    new, known = catalog.added & (slots < 0), slots >= 0
    dc = int(catalog.feats.shape[1]) - int(catalog.n_engagement)
    if not new.any() or not known.any() or dc <= 0:
        return none
    content = catalog.feats[:, :dc].float().cpu().numpy()  # [N, dc]
    rows = enc.id_emb.weight.detach().float().cpu().numpy()[slots[known]]  # [n_known, item_dim]
    vecs = impute_from_neighbours(content[new], content[known], rows, what="ID")
    return np.asarray(catalog.item_ids, dtype=np.int64)[new], vecs


class HistoryBatch(Protocol):
    """The padded index tensors of a collated batch (:class:`genrec.train.batches.TrainBatch` has them):
    catalogue rows, actions, surfaces and times of the history, and the candidates' rows, if any."""

    rows: torch.Tensor  # [B, n]
    actions: torch.Tensor  # [B, n]
    surfaces: torch.Tensor  # [B, n]
    timestamps: torch.Tensor  # [B, n]
    lengths: torch.Tensor  # [B]
    cand_rows: torch.Tensor | None  # [B, k]
    cand_surface: torch.Tensor | None  # [B]
    request_ts: torch.Tensor | None  # [B]


class CatalogModel(nn.Module):
    """A :class:`GenRecModel` (``model``) with the catalogue tensors it reads, aligned by catalogue row.

    When the model has learned ID vectors, each item ``genrec sid assign`` added (``catalog.added``) without one
    gets the similarity-weighted mean of the trained ID vectors of the ``IMPUTE_NEIGHBOURS`` catalogue items
    nearest to it by content (:func:`impute_id_vectors`), added to ``model``'s ID table: without it, the new item's
    vector would lack the collaborative part every trained item's has. The mean is kept as it is (not rescaled):
    the ID vector is added to the content MLP's output, and neighbours that disagree give a shorter one, a
    weaker claim."""

    feats: torch.Tensor  # [N, F] buffer
    item_ids: torch.Tensor  # [N] buffer
    codes: torch.Tensor  # [N, L] buffer (L = 0 without SIDs): the codes the model reads (model_codes)

    def __init__(self, model: GenRecModel, catalog: ItemCatalog) -> None:
        super().__init__()
        self.model = model
        # not in the state dict: the catalogue is rebuilt from the run's features and SIDs, as in training
        self.register_buffer("feats", catalog.feats.float(), persistent=False)
        self.register_buffer("item_ids", torch.from_numpy(np.asarray(catalog.item_ids, dtype=np.int64)),
                             persistent=False)
        codes = catalog.codes if catalog.codes is not None else torch.zeros(len(catalog), 0, dtype=torch.long)
        self.register_buffer("codes", model_codes(codes.long(), model.config.sid_codebook_sizes), persistent=False)
        ids, vecs = impute_id_vectors(model, catalog)  # none without ID vectors or added items
        if len(ids):
            model.item_encoder.add_id_vectors(torch.from_numpy(ids), torch.from_numpy(vecs))

    def catalogue_vectors(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Item vectors of catalogue rows ``start:stop`` (features + ID vectors): ``[rows, item_dim]``."""
        return self.model.item_vectors(self.feats[start:stop], self.item_ids[start:stop])

    @torch.no_grad()
    def all_catalogue_vectors(self, chunk: int = 8192) -> torch.Tensor:
        """Every catalogue row's item vector, f32 ``[N, item_dim]``, computed ``chunk`` rows at a time: what
        the ANN index holds (:class:`genrec.infer.recommender.Recommender`'s ``item_vecs``) and what
        ``genrec sid build --source model`` quantises."""
        n = int(self.item_ids.shape[0])
        if n == 0:
            return torch.zeros(0, self.model.config.item_dim, device=self.feats.device)
        return torch.cat([self.catalogue_vectors(i, i + chunk).float() for i in range(0, n, chunk)])

    def model_batch(self, b: HistoryBatch, *, mask_actions: Literal[False] = False) -> tuple[ModelBatch, torch.Tensor]:
        """The model's inputs for batch ``b`` and its valid-history mask ``[B, n]``. ``mask_actions`` is
        the objective's argument (evaluation calls either with it): masking is training only, so False."""
        if mask_actions:
            raise ValueError("mask_actions: inference never masks history actions (a training-time corruption)")
        cfg = self.model.config
        n = b.rows.shape[1]
        valid = torch.arange(n, device=b.rows.device)[None, :] < b.lengths[:, None]  # [B, n]
        cand_rows = b.cand_rows
        has_c = cand_rows is not None
        mb = ModelBatch(
            actions=b.actions, surfaces=b.surfaces, lengths=b.lengths,
            sid_codes=self.codes[b.rows] if cfg.uses_sids else None,
            item_feats=self.feats[b.rows], action_mask=torch.zeros_like(valid), item_ids=self.item_ids[b.rows],
            cand_feats=self.feats[cand_rows] if cand_rows is not None else None,
            cand_ids=self.item_ids[cand_rows] if cand_rows is not None else None,
            cand_sid_codes=self.codes[cand_rows] if cand_rows is not None and cfg.uses_sids else None,
            cand_surface=b.cand_surface if has_c else None,
            timestamps=b.timestamps, request_ts=b.request_ts if has_c else None,
        )
        return mb, valid
