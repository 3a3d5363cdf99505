"""Input encoders: item vectors, MAM dense inputs, SID embeddings, item-level positions.

Follows UniPinRec §3.0.1 (item MLP -> L2-normalised vector, the vector the ANN index holds and
the sampled softmax scores against) and §3.1.1 (Masked Action Modeling: the action one-hot over
C actions + one [MASK] class goes through a Linear layer and is concatenated with the item vector
on the FEATURE axis, then projected to d_model — no extra tokens), plus PinGER §3.3.2 (one SID
embedding table per level + a level embedding; positions count items, not tokens).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from genrec.model.config import ModelConfig
from genrec.validation import checks_on


class ItemEncoder(nn.Module):
    """MLP([content ‖ engagement]) (+ a learned ID vector) -> L2-normalised item vector ``[..., item_dim]``.

    With ``item_id_vocab > 0`` the encoder also holds one learned vector per item id seen in
    training (``id_keys``, sorted, set by the trainer and saved with the weights), added to the
    MLP output before normalising: the SASRec-style ID embedding, on top of content. It is keyed
    by item **id**, not catalogue row, so a later catalogue (new items, other row order) still
    finds the right vectors; ids outside ``id_keys`` (cold items, padding, ``-1``) get the content
    vector alone.
    """

    id_keys: torch.Tensor  # int64 [item_id_vocab], sorted; unused slots hold int64 max

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.feat_dim = cfg.item_feat_dim
        self.item_dim = cfg.item_dim
        self.normalize = cfg.normalize
        self.mlp: nn.Sequential | None = None
        if cfg.item_content:
            self.mlp = nn.Sequential(
                nn.Linear(cfg.item_feat_dim, cfg.item_hidden), nn.GELU(), nn.Linear(cfg.item_hidden, cfg.item_dim)
            )
        self.id_emb: nn.Embedding | None = None
        if cfg.item_id_vocab > 0:
            self.id_emb = nn.Embedding(cfg.item_id_vocab, cfg.item_dim)
            nn.init.normal_(self.id_emb.weight, std=cfg.id_init_std)
            self.register_buffer("id_keys", torch.full((cfg.item_id_vocab,), torch.iinfo(torch.int64).max))

    def set_id_keys(self, item_ids: torch.Tensor) -> None:
        """The item ids that own a learned vector (at most ``item_id_vocab``; sorted here)."""
        if self.id_emb is None:
            raise ValueError("item_id_vocab is 0: this encoder has no ID vectors")
        ids = torch.unique(item_ids.long().cpu())
        if ids.numel() > self.id_keys.numel():
            raise ValueError(f"item ids: {ids.numel()} distinct ids > item_id_vocab={self.id_keys.numel()}")
        keys = torch.full_like(self.id_keys, torch.iinfo(torch.int64).max)
        keys[: ids.numel()] = ids.to(keys.device)
        self.id_keys.copy_(keys)

    def add_id_vectors(self, item_ids: torch.Tensor, vectors: torch.Tensor) -> None:
        """Give ``item_ids`` ``[m]`` -- ids without a learned vector -- the ID vectors ``vectors`` ``[m, item_dim]``:
        a served model's rows for items added after training (:class:`genrec.infer.catalog_model.CatalogModel`
        imputes them from the items nearest by content). The table becomes the known rows plus these (its unused
        slots dropped); every known id keeps its vector. The config's ``item_id_vocab`` stays the trained size, so
        a model grown so is for serving, not for saving as a checkpoint."""
        if self.id_emb is None:
            raise ValueError("item_id_vocab is 0: this encoder has no ID vectors")
        ids = item_ids.long().reshape(-1).to(self.id_keys.device)
        if vectors.shape != (ids.numel(), self.item_dim):
            raise ValueError(f"vectors: shape {tuple(vectors.shape)}, expected [{ids.numel()}, {self.item_dim}]")
        if torch.unique(ids).numel() != ids.numel() or (self.slots(ids) >= 0).any():
            raise ValueError("item_ids: each id once, and none that already has a learned vector")
        used = self.id_keys != torch.iinfo(torch.int64).max  # the known ids: a sorted prefix of id_keys
        w = self.id_emb.weight
        keys = torch.cat([self.id_keys[used], ids])
        order = torch.argsort(keys)
        table = torch.cat([w.detach()[used], vectors.detach().to(w.device, w.dtype)])[order]
        self.id_emb = nn.Embedding.from_pretrained(table, freeze=not w.requires_grad)
        self.id_keys = keys[order]

    def slots(self, item_ids: torch.Tensor) -> torch.Tensor:
        """Embedding slot of each id (any shape), ``-1`` where the id has no learned vector."""
        if self.id_emb is None:
            return torch.full_like(item_ids, -1, dtype=torch.long)
        ids = item_ids.long()
        s = torch.searchsorted(self.id_keys, ids).clamp(max=self.id_keys.numel() - 1)
        return torch.where(self.id_keys[s] == ids, s, torch.full_like(s, -1))

    def forward(self, feats: torch.Tensor, item_ids: torch.Tensor | None = None) -> torch.Tensor:
        if feats.shape[-1] != self.feat_dim:
            raise ValueError(f"item_feats: last dim must be item_feat_dim={self.feat_dim}, got {tuple(feats.shape)}")
        v = self.mlp(feats.float()) if self.mlp is not None else feats.new_zeros((*feats.shape[:-1], self.item_dim))
        if self.id_emb is not None and item_ids is not None:
            if item_ids.shape != feats.shape[:-1]:
                raise ValueError(f"item_ids: shape {tuple(item_ids.shape)} != item_feats {tuple(feats.shape[:-1])}")
            s = self.slots(item_ids)
            v = v + self.id_emb(s.clamp(min=0)) * (s >= 0).unsqueeze(-1).to(v.dtype)
        return F.normalize(v, dim=-1) if self.normalize else v


def init_embeddings(cfg: ModelConfig, *tables: nn.Embedding) -> None:
    """Re-draw input embedding tables at ``cfg.embed_init_std`` (only when it is not nn.Embedding's own 1.0,
    so the default keeps the random stream of earlier versions)."""
    if cfg.embed_init_std != 1.0:
        for t in tables:
            nn.init.normal_(t.weight, std=cfg.embed_init_std)


def apply_action_mask(actions: torch.Tensor, mask: torch.Tensor | None, mask_class: int) -> torch.Tensor:
    """Replace actions where ``mask`` is True with the [MASK] class (UniPinRec §3.1.1 (2))."""
    if mask is None:
        return actions
    if mask.shape != actions.shape:
        raise ValueError(f"action_mask: shape {tuple(mask.shape)} != actions shape {tuple(actions.shape)}")
    return torch.where(mask, torch.full_like(actions, mask_class), actions)


def random_action_mask(shape: tuple[int, ...], p_mask: float, generator: torch.Generator | None = None,
                       device: torch.device | str = "cpu") -> torch.Tensor:
    """Independent Bernoulli(p_mask) mask over past positions (True = masked)."""
    if not 0.0 <= p_mask <= 1.0:
        raise ValueError(f"p_mask: must lie in [0, 1], got {p_mask}")
    return torch.rand(shape, generator=generator, device=device) < p_mask


class DenseInputEncoder(nn.Module):
    """MAM input: proj([item_vec ‖ Linear(one_hot(action, C+1))]) + surface embedding -> ``[..., d_model]``;
    with ``input_proj`` off: item_vec + Linear(one_hot(action, C+1)) + surface embedding (the concatenation
    with the projection fixed to the identity on the item's half)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_classes = cfg.n_actions + 1
        self.n_surfaces = cfg.n_surfaces
        self.proj: nn.Linear | None = None
        if cfg.input_proj:
            self.action = nn.Linear(self.n_classes, cfg.action_emb_dim)
            self.proj = nn.Linear(cfg.item_dim + cfg.action_emb_dim, cfg.d_model)
        else:
            self.action = nn.Linear(self.n_classes, cfg.d_model, bias=False)
            nn.init.normal_(self.action.weight, std=0.02)
        self.surface = nn.Embedding(cfg.n_surfaces, cfg.d_model)
        init_embeddings(cfg, self.surface)

    def forward(self, item_vec: torch.Tensor, actions: torch.Tensor, surfaces: torch.Tensor) -> torch.Tensor:
        _check_range(actions, self.n_classes, "actions")
        _check_range(surfaces, self.n_surfaces, "surfaces")
        a = self.action(F.one_hot(actions, self.n_classes).to(item_vec.dtype))  # [..., A] (A = d_model unprojected)
        x = item_vec + a if self.proj is None else self.proj(torch.cat([item_vec, a], -1))
        return x + self.surface(surfaces)


class ActionTokenEncoder(nn.Module):
    """HSTU-style action token: Linear(one_hot(action, C+1)) + surface embedding -> ``[..., d_model]``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_classes = cfg.n_actions + 1
        self.action = nn.Linear(self.n_classes, cfg.d_model)
        self.surface = nn.Embedding(cfg.n_surfaces, cfg.d_model)
        init_embeddings(cfg, self.surface)

    def forward(self, actions: torch.Tensor, surfaces: torch.Tensor) -> torch.Tensor:
        _check_range(actions, self.n_classes, "actions")
        return self.action(F.one_hot(actions, self.n_classes).float()) + self.surface(surfaces)


class SidEmbedding(nn.Module):
    """One embedding table per SID level + a level embedding. ``codes`` ``[..., d]`` -> ``[..., d, D]``."""

    offsets: torch.Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.sizes = list(cfg.sid_codebook_sizes)
        self.tables = nn.ModuleList(nn.Embedding(k, cfg.d_model) for k in self.sizes)
        self.level = nn.Embedding(len(self.sizes), cfg.d_model)
        init_embeddings(cfg, *self.tables, self.level)  # type: ignore[arg-type]
        # first row of each level in all_rows(); a buffer, so it follows the module to its device
        offsets = torch.tensor([0, *self.sizes[:-1]]).cumsum(0)
        self.register_buffer("offsets", offsets, persistent=False)  # [L]

    def all_rows(self) -> torch.Tensor:
        """Every code's vector at every level, stacked: ``[sum(sizes), D]``; level l's (0-based) code c
        is row ``offsets[l] + c``, its table row plus the level vector, as :meth:`forward` embeds it."""
        tables: list[nn.Embedding] = list(self.tables)  # type: ignore[arg-type]
        return torch.cat([t.weight + self.level.weight[lvl] for lvl, t in enumerate(tables)])

    def check(self, codes: torch.Tensor, first_level: int = 1) -> None:
        """Raise naming the level whose codes in ``codes`` ``[..., d]`` fall outside its codebook."""
        for j in range(codes.shape[-1]):
            lvl = first_level - 1 + j
            _check_range(codes[..., j], self.sizes[lvl], f"sid_codes[..., level {lvl + 1}]")

    def forward(self, codes: torch.Tensor, first_level: int = 1) -> torch.Tensor:
        """Embed levels ``first_level .. first_level + d - 1`` (1-based) of ``codes`` ``[..., d]``."""
        d = codes.shape[-1]
        if first_level < 1 or first_level + d - 1 > len(self.sizes):
            raise ValueError(f"sid_codes: levels {first_level}..{first_level + d - 1} outside 1..{len(self.sizes)}")
        self.check(codes, first_level)
        outs = [self.tables[first_level - 1 + j](codes[..., j]) + self.level.weight[first_level - 1 + j] for j in range(d)]
        return torch.stack(outs, -2)


class TimeGapEmbedding(nn.Module):
    """Embedding of ``floor(log2(1 + gap_seconds))`` clamped to ``time_buckets - 1`` (negative gaps -> 0)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n = cfg.time_buckets
        self.emb = nn.Embedding(cfg.time_buckets, cfg.d_model)
        init_embeddings(cfg, self.emb)

    @staticmethod
    def bucket(gap: torch.Tensor, n: int) -> torch.Tensor:
        g = gap.clamp(min=0).to(torch.float64)
        return torch.floor(torch.log2(1.0 + g)).to(torch.int64).clamp(0, n - 1)

    def forward(self, gap: torch.Tensor) -> torch.Tensor:
        return self.emb(self.bucket(gap, self.n))


class ItemPositionEmbedding(nn.Module):
    """Learned embedding of the item index (shared by all tokens of an item); ``max_items + 1`` ids.

    ``positions="end"`` looks an item index ``pos`` of a history of ``lengths`` items up at
    ``max_items - lengths + pos``: the next item (``pos == lengths``: candidates, beam tokens) is always
    ``max_items`` and the newest history item ``max_items - 1`` (SASRec's left-padded positions). The
    attention predicate still reads the plain item index; only the embedding lookup moves.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.max_items = cfg.max_items
        self.from_end = cfg.positions == "end"
        self.emb = nn.Embedding(cfg.max_items + 1, cfg.d_model)  # N(0, 1) init
        if cfg.pos_init_std != 1.0:  # (drawn only then: the default keeps the random stream of earlier versions)
            nn.init.normal_(self.emb.weight, std=cfg.pos_init_std)

    def forward(self, pos: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``pos`` ``[B, ...]`` item indices, ``lengths`` ``[B]`` history lengths -> ``[B, ..., D]``."""
        if checks_on() and pos.numel() and int(pos.max()) > self.max_items:
            raise ValueError(f"history too long: item position {int(pos.max())} > max_items={self.max_items}")
        if self.from_end:
            shift = (self.max_items - lengths).view(-1, *([1] * (pos.dim() - 1)))  # [B, 1, ...]
            pos = (pos + shift).clamp(max=self.max_items)  # padding items (pos >= lengths) are zeroed by callers
        return self.emb(pos.clamp(min=0))


def _check_range(x: torch.Tensor, n: int, name: str) -> None:
    if x.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name}: expected an integer tensor, got {x.dtype}")
    if checks_on() and x.numel() and (int(x.min()) < 0 or int(x.max()) >= n):
        raise ValueError(f"{name}: values must lie in [0, {n}), got min {int(x.min())}, max {int(x.max())}")
