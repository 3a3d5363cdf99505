"""genrec.model: the backbone (PinGER interleaved layout + UniPinRec MAM inputs/heads), one attention
predicate, SID fusion, KV-cached serving paths. Losses live in ``genrec.model.losses``."""

from genrec.model.config import PRESETS, ModelConfig
from genrec.model.genrec_model import GenRecModel, ModelBatch, ModelOutput
from genrec.model.kv_cache import KVCache
from genrec.model.layout import ACTION, CAND, DENSE, PAD, TokenLayout, TokenMeta, build_layout
from genrec.model.mask import allowed, flex_block_mask, make_mask_mod, reference_mask

__all__ = [
    "ACTION", "CAND", "DENSE", "PAD", "PRESETS", "GenRecModel", "KVCache", "ModelBatch", "ModelConfig",
    "ModelOutput", "TokenLayout", "TokenMeta", "allowed", "build_layout", "flex_block_mask",
    "make_mask_mod", "reference_mask",
]
