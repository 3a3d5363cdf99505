"""The model's name for THE attention predicate (PinGER §3.3.2 rules, M-FALCON candidate rule of UniPinRec §3.1.1).

The predicate and its rules live at the kernel layer, :mod:`genrec.kernels.mask`, because the
kernels sit below the model and derive their masks from it too. The model's reference boolean
mask, FlexAttention ``mask_mod`` and KV-cached decode paths use :func:`allowed` over the tokens'
metadata (:class:`genrec.model.layout.TokenMeta`: ``pos``, ``kind``, ``tok``).
"""

from __future__ import annotations

from genrec.kernels.mask import (
    CAUSAL_LAYOUTS,
    MaskMod,
    allowed,
    flex_block_mask,
    make_mask_mod,
    reference_mask,
)

__all__ = ["CAUSAL_LAYOUTS", "MaskMod", "allowed", "flex_block_mask", "make_mask_mod", "reference_mask"]
