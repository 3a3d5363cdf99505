"""Attention implementations: a plain-PyTorch reference and fast paths tested against it."""

from genrec.kernels.attention import (
    attention,
    attention_with_lse,
    merge_attention,
    prepare_mask,
    resolve_impl,
)

__all__ = ["attention", "attention_with_lse", "merge_attention", "prepare_mask", "resolve_impl"]
