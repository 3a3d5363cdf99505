"""SID decoding: beam search with PinGER's prefix-depth diversity penalty, constrained
decoding over the legal-SID trie on device, and the temperature-sampling baseline."""

from genrec.decode.beam import (
    BeamResult,
    BeamState,
    FallbackResult,
    beam_search,
    beam_step,
    fallback_items,
    finalize,
    init_state,
    select_diverse,
    select_topk,
)
from genrec.decode.sampling import temperature_sampling
from genrec.decode.trie_torch import TorchTrie

__all__ = [
    "BeamResult",
    "BeamState",
    "FallbackResult",
    "TorchTrie",
    "beam_search",
    "beam_step",
    "fallback_items",
    "finalize",
    "init_state",
    "select_diverse",
    "select_topk",
    "temperature_sampling",
]
