"""Token layouts and per-token metadata (PinGER §3.3.2, UniPinRec §3.1.1 / M-FALCON).

Non-standard: rows are laid out on a fixed grid of ``T`` tokens per item slot, so item ``i`` slot
``j`` is always token ``i*T + j`` and the ``k`` candidates are tokens ``n*T .. n*T+k-1`` of every
row. Items past a row's valid length become padding tokens *inside* the row (before the
candidates); the attention predicate makes padding invisible, so this costs nothing in
correctness and makes every layout a pure reshape. Per-token metadata:

* ``pos``  item index = position id. Every token of item i has pos i; candidates all share pos
  ``lengths[b]`` (the next position).
* ``kind`` ``DENSE`` (0) dense history token (HSTU: item token), ``1..L`` SID token of that level,
  ``CAND`` (-1) candidate dense token, ``PAD`` (-2) padding, ``ACTION`` (-3) HSTU action token.
* ``tok``  token order index (unique in a row; used for "self" and for token-causal layouts).

PinGER training slots per item: SID levels 1..L-1 then the dense token (the deepest level is not
an input). PinGER serving: the dense token only. TIGER: SID levels 1..L. Dense: the dense token.
HSTU: item token then action token.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

import torch

from genrec.validation import checks_on

from genrec.errors import ConfigError
from genrec.kernels.mask import ACTION, CAND, DENSE, PAD  # the token kinds the one predicate reads

__all__ = ["ACTION", "CAND", "DENSE", "PAD", "TokenLayout", "TokenMeta", "build_layout", "slot_kinds"]


@dataclass
class TokenMeta:
    """Per-token metadata, each ``[B, S]`` int64."""

    pos: torch.Tensor
    kind: torch.Tensor
    tok: torch.Tensor
    # tokens per history item of the one layout that built these tokens (build_layout; 0: not known, e.g. after
    # cat): read where a fast path needs whole T-token items, without a host sync a compiled forward would break on
    item_tokens: int = 0

    def cat(self, other: "TokenMeta") -> "TokenMeta":
        """Concatenate along the token axis (cache keys + new tokens)."""
        return TokenMeta(
            torch.cat([self.pos, other.pos], 1),
            torch.cat([self.kind, other.kind], 1),
            torch.cat([self.tok, other.tok], 1),
        )

    def repeat_interleave(self, w: int) -> "TokenMeta":
        return TokenMeta(self.pos.repeat_interleave(w, 0), self.kind.repeat_interleave(w, 0),
                         self.tok.repeat_interleave(w, 0))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.pos.shape)  # type: ignore[return-value]

    @property
    def is_cand(self) -> torch.Tensor:
        """``[B, S]`` bool: candidate tokens."""
        return self.kind == CAND

    @property
    def is_pad(self) -> torch.Tensor:
        """``[B, S]`` bool: padding tokens."""
        return self.kind == PAD


@dataclass
class TokenLayout:
    """A batch's token layout: metadata plus the index maps between items and tokens."""

    meta: TokenMeta
    layout: str
    slot_kinds: list[int]  # kind of each of the T slots of an item
    n_items: int
    n_cand: int
    lengths: torch.Tensor  # [B]

    @property
    def tokens_per_item(self) -> int:
        return len(self.slot_kinds)

    def slot_index(self, kind: int) -> torch.Tensor:
        """Token index of slot ``kind`` for every item i: ``[n]`` (same for all rows)."""
        if kind not in self.slot_kinds:
            raise ValueError(f"layout {self.layout!r} has no slot of kind {kind} (slots {self.slot_kinds})")
        j = self.slot_kinds.index(kind)
        t = self.tokens_per_item
        return torch.arange(self.n_items, device=self.lengths.device) * t + j

    @property
    def dense_index(self) -> torch.Tensor:
        """Token index of item i's dense token, ``[n]``."""
        return self.slot_index(DENSE)

    @property
    def cand_index(self) -> torch.Tensor:
        """Token index of candidate j, ``[k]``."""
        start = self.n_items * self.tokens_per_item
        return torch.arange(start, start + self.n_cand, device=self.lengths.device)

    @property
    def item_valid(self) -> torch.Tensor:
        """``[B, n]`` bool: item slot i holds a real item."""
        return torch.arange(self.n_items, device=self.lengths.device)[None, :] < self.lengths[:, None]


def slot_kinds(layout: str, sid_levels: int, serving: bool = False) -> list[int]:
    """Kinds of the T token slots of one item for ``layout``."""
    if layout == "pinger":
        return [DENSE] if serving else list(range(1, sid_levels)) + [DENSE]
    if layout == "tiger":
        return list(range(1, sid_levels + 1))
    if layout == "dense":
        return [DENSE]
    if layout == "hstu":
        return [DENSE, ACTION]
    raise ConfigError(f"layout {layout!r}: unknown; choose pinger, tiger, dense or hstu")


@functools.lru_cache(maxsize=64)
def _kinds_tensor(kinds: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The slot kinds as a device tensor, made once per (kinds, device): a host-to-device copy
    cannot run inside a CUDA-graph capture, and the capture's warm-up call creates this first."""
    return torch.tensor(kinds, dtype=torch.int64, device=device)


def build_layout(
    lengths: torch.Tensor,
    n_items: int,
    layout: str,
    sid_levels: int,
    n_cand: int = 0,
    serving: bool = False,
) -> TokenLayout:
    """Layout for a batch of right-padded histories (``lengths`` [B] valid items, ``n_items`` slots)."""
    if lengths.dim() != 1:
        raise ValueError(f"lengths: expected shape [B], got {tuple(lengths.shape)}")
    lengths = lengths.to(torch.int64)
    if checks_on() and lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > n_items):
        raise ValueError(f"lengths: values must lie in [0, {n_items}], got {lengths.tolist()}")
    if n_cand < 0:
        raise ValueError(f"n_cand: must be >= 0, got {n_cand}")
    kinds = slot_kinds(layout, sid_levels, serving)
    dev = lengths.device
    b, t = lengths.shape[0], len(kinds)
    item = torch.arange(n_items, device=dev)  # [n]
    pos_h = item[None, :, None].expand(b, n_items, t)  # [B, n, T]
    # traced by torch.compile the constant is built in the graph (no cache needed there)
    make_kinds = _kinds_tensor.__wrapped__ if torch.compiler.is_compiling() else _kinds_tensor
    kind_h = make_kinds(tuple(kinds), dev)[None, None, :].expand(b, n_items, t)
    valid = (item[None, :] < lengths[:, None])[:, :, None]  # [B, n, 1]
    kind_h = torch.where(valid, kind_h, torch.full_like(kind_h, PAD))
    pos_c = lengths[:, None].expand(b, n_cand)  # [B, k]
    kind_c = torch.full((b, n_cand), CAND, device=dev, dtype=torch.int64)
    pos = torch.cat([pos_h.reshape(b, n_items * t), pos_c], 1)  # [B, S]
    kind = torch.cat([kind_h.reshape(b, n_items * t), kind_c], 1)
    tok = torch.arange(pos.shape[1], device=dev)[None, :].expand(b, -1)
    return TokenLayout(TokenMeta(pos.contiguous(), kind.contiguous(), tok.contiguous(), t), layout,
                       kinds, n_items, n_cand, lengths)
