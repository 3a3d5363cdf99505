"""Model configuration: one dataclass with named presets (gpt-fast style).

Non-standard: ``max_items`` counts ITEMS, not tokens — every token of an item shares the item's
position id (PinGER §3.3.2), so a PinGER training row of n items has n*L tokens but only n+1
position ids (the +1 is the shared candidate / next-item position). ``layout`` picks the token
layout of PinGER (interleaved SID + dense), TIGER (SID tokens only), dense-only (SASRec-like,
UniPinRec §3.1.1 input format) or HSTU (interleaved item / action tokens).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from genrec.errors import ConfigError

LAYOUTS = ("pinger", "tiger", "dense", "hstu")
ATTN_IMPLS = ("auto", "reference", "flex", "triton")


@dataclass
class ModelConfig:
    """Shapes and switches of :class:`genrec.model.GenRecModel`.

    ``n_actions`` is C, the action vocabulary; the model adds one extra [MASK] class (index C)
    internally. ``item_feat_dim`` is the width of the item feature [content ‖ engagement];
    ``item_dim`` the width of the L2-normalised item / user vectors.
    """

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.0
    max_items: int = 256
    sid_levels: int = 3
    sid_codebook_sizes: list[int] = field(default_factory=lambda: [64, 64, 64])
    n_actions: int = 4
    n_surfaces: int = 4
    item_feat_dim: int = 32
    item_dim: int = 32
    layout: str = "pinger"
    sid_fusion: bool = True
    target_condition: bool = False
    attn_impl: str = "auto"
    norm: str = "rmsnorm"
    action_emb_dim: int = 16
    item_hidden: int = 128
    time_buckets: int = 0  # >0: add a log2-bucketed time-gap embedding to dense tokens
    item_id_vocab: int = 0  # >0: a learned per-item-id vector added to the content MLP (see ItemEncoder)
    # False: no content MLP, the item vector is the learned ID vector alone (SASRec's item tower; needs
    # item_id_vocab > 0, and items without an ID vector -- cold ones -- get a zero vector)
    item_content: bool = True
    # dropout on the summed input tokens (item + position) in training, as SASRec applies to its embeddings
    input_dropout: float = 0.0
    # item position ids: "start" counts items from the oldest in the context (0, 1, ...); "end" counts
    # back from the next item (which always gets max_items), SASRec's left-padded positions: the newest
    # history item has the same position id whatever the history's length
    positions: str = "start"
    # std of the position embedding's init (nn.Embedding's default is 1.0: position noise that drowns the
    # unit-norm item vectors at the first layer; SASRec inits at 0.02)
    pos_init_std: float = 1.0
    # user tower on the last hidden state: "mlp" (Linear-GELU-Linear), "linear", or "identity" (the
    # final-norm hidden itself, SASRec's; needs item_dim == d_model); the result is L2-normalised
    user_head: str = "mlp"
    # True: item and user vectors are L2-normalised (cosine scores over the objective's temperature: PinRec);
    # False: raw vectors scored by their dot product (SASRec's; set objective.temperature=1): an item's norm
    # can then carry its popularity and a user vector's norm its confidence
    normalize: bool = True
    # std of the item ID vectors' init. With normalize on, only their direction counts and Adam's step is fixed in
    # size, so a small init turns each step into a large rotation (a high effective learning rate)
    id_init_std: float = 0.02
    # std of the input embedding tables' init: surfaces, SID codes and levels, time gaps (nn.Embedding's default 1.0
    # makes the surface a constant offset of norm ~sqrt(d_model) on every dense token of one-surface data, which
    # input dropout turns into noise of that size over the unit-norm item vector)
    embed_init_std: float = 1.0
    # False: a dense token is the item vector itself plus an action and a surface embedding (the item enters as it is
    # scored: SASRec's tied embedding; needs item_dim == d_model) instead of proj([item vector ‖ action]) + surface
    input_proj: bool = True
    # dropout inside the FFN, after its activation (torch's TransformerEncoderLayer, hence SASRec's, has it)
    ffn_dropout: float = 0.0

    def __post_init__(self) -> None:
        self.sid_codebook_sizes = [int(k) for k in self.sid_codebook_sizes]
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad key."""

        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"model config {key!r}: {why} (got {getattr(self, key)!r})")

        for key in ("d_model", "n_layers", "n_heads", "d_ff", "max_items", "n_actions",
                    "n_surfaces", "item_feat_dim", "item_dim", "action_emb_dim", "item_hidden"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise bad(key, "must be a positive integer")
        if self.d_model % self.n_heads != 0:
            raise bad("d_model", f"must be divisible by n_heads={self.n_heads}")
        if not isinstance(self.time_buckets, int) or self.time_buckets < 0:
            raise bad("time_buckets", "must be an integer >= 0 (0 = no time-gap embedding)")
        if not isinstance(self.item_id_vocab, int) or self.item_id_vocab < 0:
            raise bad("item_id_vocab", "must be an integer >= 0 (0 = content-only item vectors)")
        if not 0.0 <= self.dropout < 1.0:
            raise bad("dropout", "must lie in [0, 1)")
        if not 0.0 <= self.input_dropout < 1.0:
            raise bad("input_dropout", "must lie in [0, 1)")
        if not self.item_content and self.item_id_vocab < 1:
            raise bad("item_content", "an item tower without content needs item ID vectors (item_id_vocab > 0)")
        if self.positions not in ("start", "end"):
            raise bad("positions", "must be 'start' or 'end'")
        if not self.id_init_std > 0:
            raise bad("id_init_std", "must be > 0")
        if not self.embed_init_std > 0:
            raise bad("embed_init_std", "must be > 0")
        if not 0.0 <= self.ffn_dropout < 1.0:
            raise bad("ffn_dropout", "must lie in [0, 1)")
        if not self.pos_init_std > 0:
            raise bad("pos_init_std", "must be > 0")
        if not self.input_proj and self.item_dim != self.d_model:
            raise bad("input_proj", f"false needs item_dim == d_model (item_dim={self.item_dim}, d_model={self.d_model})")
        if self.user_head not in ("mlp", "linear", "identity"):
            raise bad("user_head", "must be 'mlp', 'linear' or 'identity'")
        if self.user_head == "identity" and self.item_dim != self.d_model:
            raise bad("user_head", f"'identity' needs item_dim == d_model (item_dim={self.item_dim}, d_model={self.d_model})")
        if self.layout not in LAYOUTS:
            raise bad("layout", f"must be one of {LAYOUTS}")
        if self.attn_impl not in ATTN_IMPLS:
            raise bad("attn_impl", f"must be one of {ATTN_IMPLS}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise bad("norm", "must be 'rmsnorm' or 'layernorm'")
        if self.layout == "pinger" and self.sid_levels < 2:
            raise bad("sid_levels", "PinGER needs at least 2 SID levels")
        if self.sid_levels < 1:
            raise bad("sid_levels", "must be >= 1")
        if len(self.sid_codebook_sizes) != self.sid_levels:
            raise bad("sid_codebook_sizes", f"needs one size per level (sid_levels={self.sid_levels})")
        if any(k < 1 for k in self.sid_codebook_sizes):
            raise bad("sid_codebook_sizes", "sizes must be positive")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def mask_action(self) -> int:
        """Index of the [MASK] action class (== n_actions)."""
        return self.n_actions

    @property
    def uses_sids(self) -> bool:
        """Whether the model consumes SID codes (inputs, fusion or heads)."""
        return self.layout in ("pinger", "tiger") or self.sid_fusion

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"model config: unknown key(s) {unknown}; known keys: {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "ModelConfig":
        """A named preset, with data-dependent fields (codebooks, actions, dims) as overrides."""
        if name not in PRESETS:
            raise ConfigError(f"model preset {name!r}: unknown; choose one of {sorted(PRESETS)}")
        d = dict(PRESETS[name])
        d.update(overrides)
        if "sid_levels" in overrides and "sid_codebook_sizes" not in overrides:
            d["sid_codebook_sizes"] = [d["sid_codebook_sizes"][0]] * int(d["sid_levels"])
        return cls.from_dict(d)


PRESETS: dict[str, dict[str, Any]] = {
    # unit tests: tiny and fast on 2 CPU cores
    "tiny": dict(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_items=16, sid_levels=3,
                 sid_codebook_sizes=[8, 8, 8], item_feat_dim=12, item_dim=16,
                 action_emb_dim=8, item_hidden=32),
    # laptop-scale experiments (MovieLens-1M on CPU)
    "cpu-small": dict(d_model=64, n_layers=2, n_heads=4, d_ff=256, max_items=200, sid_levels=3,
                      sid_codebook_sizes=[256, 256, 256], item_dim=64, dropout=0.1),
    # one GPU
    "gpu-base": dict(d_model=256, n_layers=4, n_heads=8, d_ff=1024, max_items=512, sid_levels=4,
                     sid_codebook_sizes=[256, 256, 256, 256], item_dim=128, dropout=0.1,
                     item_hidden=512, action_emb_dim=32),
    # the PinGER paper's backbone shape (4 layers, width 768, L = 5)
    "pinger-paper": dict(d_model=768, n_layers=4, n_heads=12, d_ff=3072, max_items=1024,
                         sid_levels=5, sid_codebook_sizes=[256] * 5, item_dim=256, dropout=0.1,
                         item_hidden=1024, action_emb_dim=64, target_condition=True),
}
