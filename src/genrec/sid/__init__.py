"""Semantic IDs (PinGER / TIGER): residual k-means codes, collision level, CSR prefix trie,
memory-mapped SID->items index, and versioned builds with an atomic ``CURRENT`` pointer."""

from genrec.sid.build import (SidBuild, assign_sids, build_sids, default_codebook, default_levels, open_current,
                              open_version)
from genrec.sid.disambiguate import Disambiguated, collision_rate, disambiguate, extend_disambiguation
from genrec.sid.index import SidIndex
from genrec.sid.rqkmeans import ResidualKMeans
from genrec.sid.trie import SidTrie

__all__ = [
    "Disambiguated",
    "ResidualKMeans",
    "SidBuild",
    "SidIndex",
    "SidTrie",
    "assign_sids",
    "build_sids",
    "collision_rate",
    "default_codebook",
    "default_levels",
    "disambiguate",
    "extend_disambiguation",
    "open_current",
    "open_version",
]
