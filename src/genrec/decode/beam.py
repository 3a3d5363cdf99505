"""SID beam search with PinGER's prefix-depth diversity penalty and trie-constrained decoding.

Follows PinGER §decoding ("beam 为什么要加多样性惩罚", "约束解码"). Beams grow one SID
level at a time with cumulative log-probabilities. What is non-standard:

* **Diverse selection.** Plain beam search keeps the top-W (beam, code) candidates, which
  piles all W beams under a few first-level codes. With ``diversity_lambda = λ > 0`` the W
  survivors are picked ONE AT A TIME: after each pick, every remaining candidate is
  penalised by λ × (number of leading SID levels it shares with the picked one), and the
  next pick is the best *penalised* score. Penalties from successive picks **add up**
  (``penalty="sum"``, the default): the write-up says each pick "adds a penalty" (每挑一条，
  就给和它共享前缀的其他候选加罚分). Its worked example — parents A=(12,7), B=(12,9),
  C=(40,3); after a child of A is picked, B's children pay λ×1, C's nothing, A's other
  children λ×2 — involves a single earlier pick, where sum and max agree, so
  ``penalty="max"`` (penalty = λ × max shared depth over picked beams) is offered too and
  both reproduce the example (tests/decode/test_decode_beam.py). Penalties only steer the
  selection: a kept beam carries its raw cumulative log-probability, and penalties start
  from zero again at every level. λ = 0 is exactly plain top-W beam search.
  The penalty is a per-*parent-beam* quantity: beams have distinct prefixes, so a
  candidate (beam w, code k) shares exactly as many levels with the pick as beam w's
  prefix shares with the pick's parent (for w = the parent itself that is all d levels:
  A's other children pay λ×2 in the example; the +1 for an equal code would only apply
  to the pick itself). Hence each parent's children are consumed in raw-score order and
  a pick only compares the Wc parents' best remaining child: the greedy loop runs over
  the W picks, each pick is a few [B, Wc] / [B, K] / [B, Wc, d] tensor ops for all rows
  at once, with no loop over rows or candidates and no pruning (with summed penalties
  a candidate far below the W-th raw score can still be picked, so no cut by raw score
  is safe). :func:`select_diverse_reference` is the rescan-everything twin it is tested
  against, ties included.
* **Constrained decoding.** With a :class:`~genrec.decode.trie_torch.TorchTrie` and
  ``constrain=True``, codes that leave the trie get −inf before selection, so every
  finite-score result is a real SID. With ``constrain=False`` the trie is only used to
  report ``valid``; :func:`fallback_items` implements the paper's coarse-prefix fallback
  for invalid SIDs (look the deepest existing prefix up in the index instead).
* The step is exposed on its own (:func:`init_state`, :func:`beam_step`) and returns the
  parent index of every kept beam so a model can reorder its per-beam KV cache.

Result conventions: beams are returned in selection order (= descending score when
λ = 0). Slots that could not be filled with a finite-score beam (fewer legal paths than W,
or all candidates −inf) have score −inf, codes −1 and ``valid = False``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError

StepFn = Callable[[torch.Tensor], torch.Tensor]
"""step_fn(prefix int64 [B, W_cur, d]) -> log-probs float [B, W_cur, K_{d+1}]."""

Selector = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""select(cand [B, Wc, K], prefix [B, Wc, d], n_keep) -> flat candidate indices [B, n_keep]."""

NEG_INF = float("-inf")


@dataclass
class BeamResult:
    """Decoded SIDs. codes int64 [B, W, L] (-1 in unfilled slots); scores float [B, W]
    (cumulative log-prob, -inf in unfilled slots); valid bool [B, W] (finite score and,
    when a trie was given, the SID exists)."""

    codes: torch.Tensor
    scores: torch.Tensor
    valid: torch.Tensor


@dataclass
class BeamState:
    """Beams after ``depth`` levels. prefix int64 [B, Wc, depth]; scores float [B, Wc];
    nodes int64 [B, Wc] trie node of each prefix (-1 = not in trie) or None without a trie.
    ``nan``: one bool [] device flag per level decoded so far, True where that level's
    step_fn gave NaN log-probs; checked once by :func:`raise_on_nan` (never per step, so the
    levels run without a device->host sync and can be CUDA-graph captured)."""

    prefix: torch.Tensor
    scores: torch.Tensor
    nodes: torch.Tensor | None
    nan: list[torch.Tensor] = field(default_factory=list)

    @property
    def depth(self) -> int:
        return int(self.prefix.shape[2])


def init_state(batch_size: int, device: torch.device | str = "cpu", *, trie: TorchTrie | None = None) -> BeamState:
    """One empty beam per row, at the trie root."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    dev = torch.device(device)
    return BeamState(
        prefix=torch.zeros(batch_size, 1, 0, dtype=torch.int64, device=dev),  # [B, 1, 0]
        scores=torch.zeros(batch_size, 1, dtype=torch.float32, device=dev),  # [B, 1]
        nodes=None if trie is None else torch.zeros(batch_size, 1, dtype=torch.int64, device=dev),
    )


# ---------------------------------------------------------------------------- selection
def select_topk(cand: torch.Tensor, prefix: torch.Tensor, n_keep: int) -> torch.Tensor:
    """Plain beam search: the n_keep best candidates by raw score. cand [B, Wc, K] -> [B, n_keep]."""
    return torch.topk(cand.reshape(cand.shape[0], -1), n_keep, dim=1).indices


def select_diverse(
    cand: torch.Tensor,
    prefix: torch.Tensor,
    n_keep: int,
    diversity_lambda: float,
    penalty: Literal["sum", "max"] = "sum",
) -> torch.Tensor:
    """Greedy one-at-a-time selection with the prefix-depth penalty (module docstring).

    cand: [B, Wc, K] candidate scores (beam score + next-code log-prob; -inf = illegal).
    prefix: int64 [B, Wc, d] the parent beams' codes, distinct within a row (always true
    for beams produced by this module). Returns flat indices [B, n_keep] into Wc*K, in
    pick order; identical to :func:`select_diverse_reference`, ties included.

    On CUDA the whole loop is one Triton launch
    (:func:`genrec.kernels.beam_select.select_diverse_triton`, same result) unless
    ``GENREC_BEAM_SELECT=torch`` is set or the call is outside the kernel's limits; the
    torch loop below runs otherwise (and always on CPU).

    All children of one parent carry the same penalty, so each pick only compares the Wc
    parents' best remaining ("head") keys; the picked parent's child is then its first
    untaken child with the winning key (usually the head child; a lower code when two raw
    scores round to the same penalised key, as the reference's argmax would take), and
    only that parent's head is recomputed ([B, K] work). Per pick: O(B * (Wc * d + K))
    instead of O(B * Wc * K).
    """
    if cand.is_cuda and os.environ.get("GENREC_BEAM_SELECT", "").lower() != "torch":
        try:
            from genrec.kernels import beam_select  # local: triton, needed only on CUDA
        except ImportError:  # no triton installed: the torch loop
            beam_select = None  # type: ignore[assignment]
        if beam_select is not None and beam_select.supports(cand, prefix, n_keep, diversity_lambda):
            return beam_select.select_diverse_triton(cand, prefix, n_keep, diversity_lambda, penalty)
    b, wc, k = cand.shape
    dev = cand.device
    rows = torch.arange(b, device=dev)  # [B]
    head = cand.amax(dim=2)  # [B, Wc] best untaken raw score per parent
    pen = torch.zeros(b, wc, dtype=cand.dtype, device=dev)  # [B, Wc] accumulated shared depth
    n_taken = torch.zeros(b, wc, dtype=torch.int64, device=dev)  # [B, Wc]
    taken = torch.zeros(b, wc, k, dtype=torch.bool, device=dev)  # [B, Wc, K]
    true = torch.ones(b, dtype=torch.bool, device=dev)  # [B] a device value: `= True` copies from the host (no CUDA graph)
    picks = []
    for _ in range(n_keep):
        open_ = n_taken < k  # [B, Wc] parents with children left
        key = (head - diversity_lambda * pen).masked_fill(~open_, NEG_INF)  # [B, Wc]
        w = key.argmax(dim=1)  # [B] first max = lowest flat index among tied heads
        w = torch.where(open_[rows, w], w, open_.to(torch.int8).argmax(dim=1))  # only -inf left: first open parent
        # the picked parent's children, keyed exactly as the reference keys them
        left = taken[rows, w]  # [B, K]
        ckey = (cand[rows, w] - diversity_lambda * pen[rows, w][:, None]).masked_fill(left, NEG_INF)  # [B, K]
        code = ckey.argmax(dim=1)  # [B] first max
        first_untaken = (~left).to(torch.int8).argmax(dim=1)  # [B]
        code = torch.where(left[rows, code], first_untaken, code)  # only -inf left: first untaken child
        picks.append(w * k + code)
        taken[rows, w, code] = true
        n_taken[rows, w] += 1
        # refresh the picked parent's head
        head[rows, w] = cand[rows, w].masked_fill(taken[rows, w], NEG_INF).amax(dim=1)
        # penalty: leading levels each parent shares with the picked one's parent
        same = prefix == prefix[rows, w][:, None, :]  # [B, Wc, d]
        shared = same.to(torch.int64).cumprod(dim=2).sum(dim=2).to(cand.dtype)  # [B, Wc]
        pen = pen + shared if penalty == "sum" else torch.maximum(pen, shared)
    return torch.stack(picks, dim=1)  # [B, n_keep]


def select_diverse_reference(
    cand: torch.Tensor,
    prefix: torch.Tensor,
    n_keep: int,
    diversity_lambda: float,
    penalty: Literal["sum", "max"] = "sum",
) -> torch.Tensor:
    """Slow, obviously-correct twin of :func:`select_diverse`: every pick rescans all
    Wc*K candidates (ties -> lowest flat index; once only -inf is left, the lowest
    untaken flat index). Same arguments and result."""
    b, wc, k = cand.shape
    pen = torch.zeros(b, wc, dtype=cand.dtype, device=cand.device)  # [B, Wc] accumulated shared depth
    taken = torch.zeros(b, wc * k, dtype=torch.bool, device=cand.device)  # [B, C]
    rows = torch.arange(b, device=cand.device)  # [B]
    picks = []
    for _ in range(n_keep):
        key = (cand - diversity_lambda * pen[:, :, None]).reshape(b, wc * k)  # [B, C]
        key = key.masked_fill(taken, NEG_INF)
        j = key.argmax(dim=1)  # [B]
        # Once every untaken candidate is -inf, argmax may land on a taken one: take the
        # first untaken instead (the slot will be reported as unfilled anyway).
        first_free = (~taken).to(torch.int8).argmax(dim=1)  # [B]
        j = torch.where(taken[rows, j], first_free, j)
        taken[rows, j] = True
        picks.append(j)
        picked_prefix = prefix[rows, j // k]  # [B, d]
        same = prefix == picked_prefix[:, None, :]  # [B, Wc, d]
        shared = same.to(torch.int64).cumprod(dim=2).sum(dim=2).to(cand.dtype)  # [B, Wc] leading levels in common
        pen = pen + shared if penalty == "sum" else torch.maximum(pen, shared)
    return torch.stack(picks, dim=1)  # [B, n_keep]


# ---------------------------------------------------------------------------- one step
def advance_state(
    state: BeamState,
    logprobs: torch.Tensor,
    beam_width: int,
    select: Selector,
    *,
    trie: TorchTrie | None = None,
    constrain: bool = True,
) -> tuple[BeamState, torch.Tensor]:
    """Extend every beam by one level and keep ``min(beam_width, Wc*K)`` candidates chosen by
    ``select``. Returns the new state and parent indices int64 [B, W'] into the old beams."""
    b, wc, d = state.prefix.shape
    if logprobs.ndim != 3 or logprobs.shape[:2] != (b, wc):
        raise ConfigError(
            f"step_fn returned shape {tuple(logprobs.shape)}, expected [{b}, {wc}, K] for prefix {tuple(state.prefix.shape)}"
        )
    k = logprobs.shape[2]
    if trie is not None and trie.codebook_sizes[d] != k:
        raise ConfigError(f"level {d + 1}: step_fn gave {k} codes, the trie's codebook has {trie.codebook_sizes[d]}")
    if not logprobs.is_floating_point():
        raise ConfigError(f"level {d + 1}: step_fn must return float log-probs, got {logprobs.dtype}")
    scores = state.scores.to(logprobs.dtype)
    cand = scores[:, :, None] + logprobs  # [B, Wc, K]
    if trie is not None and state.nodes is None:
        raise ConfigError("a trie was given but the state has no trie nodes: build it with init_state(..., trie=trie)")
    if trie is not None and constrain:
        assert state.nodes is not None
        legal = trie.valid_mask(d, state.nodes.reshape(-1)).reshape(b, wc, k)  # [B, Wc, K]
        cand = cand.masked_fill(~legal, NEG_INF)
    n_keep = min(beam_width, wc * k)
    idx = select(cand, state.prefix, n_keep)  # [B, n_keep]
    parent, code = idx // k, idx % k  # [B, n_keep]
    new_prefix = torch.cat(
        [torch.gather(state.prefix, 1, parent[:, :, None].expand(b, n_keep, d)), code[:, :, None]], dim=2
    )  # [B, n_keep, d+1]
    new_scores = torch.gather(cand.reshape(b, -1), 1, idx)  # [B, n_keep]
    # topk/argmax rank NaN first, so a NaN anywhere legal shows up among the kept scores
    nan = [*state.nan, torch.isnan(new_scores).any()]
    new_nodes = None
    if trie is not None and state.nodes is not None:
        parent_nodes = torch.gather(state.nodes, 1, parent)  # [B, n_keep]
        new_nodes = trie.advance(d, parent_nodes.reshape(-1), code.reshape(-1)).reshape(b, n_keep)
    return BeamState(new_prefix, new_scores, new_nodes, nan), parent


def beam_step(
    state: BeamState,
    logprobs: torch.Tensor,
    beam_width: int,
    *,
    diversity_lambda: float = 0.0,
    penalty: Literal["sum", "max"] = "sum",
    trie: TorchTrie | None = None,
    constrain: bool = True,
) -> tuple[BeamState, torch.Tensor]:
    """One beam-search level. logprobs [B, Wc, K] for the beams in ``state``.
    Returns (new state, parent indices int64 [B, W'])."""
    _check_lambda(diversity_lambda, penalty)
    if diversity_lambda == 0.0:
        select: Selector = select_topk
    else:

        def select(cand: torch.Tensor, prefix: torch.Tensor, n: int) -> torch.Tensor:
            return select_diverse(cand, prefix, n, diversity_lambda, penalty)

    return advance_state(state, logprobs, beam_width, select, trie=trie, constrain=constrain)


# ---------------------------------------------------------------------------- full decode
def beam_search(
    step_fn: StepFn,
    batch_size: int,
    levels: int,
    codebook_sizes: Sequence[int],
    beam_width: int,
    *,
    diversity_lambda: float = 0.0,
    penalty: Literal["sum", "max"] = "sum",
    trie: TorchTrie | None = None,
    constrain: bool = True,
    device: torch.device | str = "cpu",
) -> BeamResult:
    """Decode ``levels`` SID levels for ``batch_size`` requests with ``beam_width`` beams.

    ``step_fn(prefix [B, W_cur, d]) -> log-probs [B, W_cur, K_{d+1}]``; at d = 0, W_cur = 1 and
    the prefix is empty. ``trie`` with ``constrain=True`` forbids codes outside the trie;
    with ``constrain=False`` it only fills ``valid``.
    """
    _check_args(levels, codebook_sizes, beam_width, trie)
    _check_lambda(diversity_lambda, penalty)
    state = run_levels(step_fn, batch_size, levels, beam_width, diversity_lambda=diversity_lambda, penalty=penalty,
                       trie=trie, constrain=constrain, device=device)
    raise_on_nan(state)
    return finalize(state, beam_width, trie=trie)


def run_levels(
    step_fn: StepFn,
    batch_size: int,
    levels: int,
    beam_width: int,
    *,
    diversity_lambda: float = 0.0,
    penalty: Literal["sum", "max"] = "sum",
    trie: TorchTrie | None = None,
    constrain: bool = True,
    device: torch.device | str = "cpu",
) -> BeamState:
    """The ``levels`` beam steps of :func:`beam_search`, arguments unchecked, with no device->host
    synchronisation when ``step_fn`` has none (what a CUDA graph captures). NaN is only flagged."""
    state = init_state(batch_size, device, trie=trie)
    for _ in range(levels):
        logprobs = step_fn(state.prefix)
        state, _ = beam_step(
            state,
            logprobs,
            beam_width,
            diversity_lambda=diversity_lambda,
            penalty=penalty,
            trie=trie,
            constrain=constrain,
        )
    return state


_DEFERRED: ContextVar[list[torch.Tensor] | None] = ContextVar("genrec_deferred_nan_checks", default=None)


@contextmanager
def deferred_nan_checks() -> Iterator[list[torch.Tensor]]:
    """Inside the block :func:`raise_on_nan` reads nothing back: each search's NaN flags ([levels] bool, on the
    device) are appended to the list yielded, for the caller to copy back with its own results and check with
    :func:`check_nan_flags` (one host sync for the whole batch, not one per search)."""
    pending: list[torch.Tensor] = []
    token = _DEFERRED.set(pending)
    try:
        yield pending
    finally:
        _DEFERRED.reset(token)


def check_nan_flags(bad: Iterable[Any]) -> None:
    """ConfigError naming the first level whose flag is set (flags on the host, one per level)."""
    flags = [bool(x) for x in bad]
    if any(flags):
        raise ConfigError(f"level {flags.index(True) + 1}: step_fn returned NaN log-probs")


def raise_on_nan(state: BeamState | list[torch.Tensor]) -> None:
    """ConfigError naming the first level whose step_fn returned NaN log-probs (one host sync; none inside
    :func:`deferred_nan_checks`, which keeps the flags for its caller)."""
    flags = state.nan if isinstance(state, BeamState) else state
    if not flags:
        return
    pending = _DEFERRED.get()
    if pending is not None:
        pending.append(torch.stack(flags))
        return
    check_nan_flags(torch.stack(flags).cpu())  # [levels]


def finalize(state: BeamState, beam_width: int, *, trie: TorchTrie | None = None) -> BeamResult:
    """Pad to ``beam_width`` slots, blank unfilled slots, compute ``valid``."""
    b, wc, n_levels = state.prefix.shape
    codes, scores = state.prefix, state.scores
    if wc < beam_width:
        pad = beam_width - wc
        codes = torch.cat([codes, codes.new_full((b, pad, n_levels), -1)], dim=1)  # [B, W, L]
        scores = torch.cat([scores, scores.new_full((b, pad), NEG_INF)], dim=1)  # [B, W]
    alive = torch.isfinite(scores)  # [B, W]
    codes = codes.masked_fill(~alive[:, :, None], -1)
    valid = alive
    if trie is not None:
        valid = alive & trie.contains(codes.clamp(min=0))
    return BeamResult(codes=codes, scores=scores, valid=valid)


# ---------------------------------------------------------------------------- fallback
@dataclass
class FallbackResult:
    """items int64 [B, k] (-1 padded); depth int64 [B, W]: prefix length each beam was
    looked up at (L = exact SID, smaller = coarse-prefix fallback, 0 = nothing found)."""

    items: torch.Tensor
    depth: torch.Tensor


def fallback_items(
    codes: torch.Tensor,
    index_lookup_fn: Callable[[tuple[int, ...]], Sequence[int]],
    k: int,
    *,
    min_depth: int = 1,
) -> FallbackResult:
    """Turn decoded SIDs into up to ``k`` distinct items per row (PinGER's coarse-prefix fallback).

    codes: int64 [B, W, L] in rank order (slots with a code < 0 are skipped).
    ``index_lookup_fn(prefix)`` returns the items under a SID prefix (empty if the prefix
    does not exist). A beam whose full SID has no items backs off to its longest prefix
    (down to ``min_depth`` levels) that has some, and contributes those items in the
    order the index gives them. Runs on the CPU: the index is a host-side structure.
    """
    if codes.ndim != 3:
        raise ConfigError(f"codes must be [B, W, L], got shape {tuple(codes.shape)}")
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    b, w, n_levels = codes.shape
    if not 1 <= min_depth <= n_levels:
        raise ConfigError(f"min_depth must be in 1..{n_levels}, got {min_depth}")
    rows = codes.detach().cpu().tolist()
    cache: dict[tuple[int, ...], Sequence[int]] = {}
    items = torch.full((b, k), -1, dtype=torch.int64)
    depth = torch.zeros(b, w, dtype=torch.int64)
    for r, beams in enumerate(rows):
        out: list[int] = []
        seen: set[int] = set()
        for j, sid in enumerate(beams):
            if len(out) >= k:
                break
            if any(c < 0 for c in sid):
                continue
            for dd in range(n_levels, min_depth - 1, -1):
                key = tuple(sid[:dd])
                if key not in cache:
                    cache[key] = index_lookup_fn(key)
                found = cache[key]
                if len(found):
                    depth[r, j] = dd
                    for it in found:
                        it = int(it)
                        if it not in seen:
                            seen.add(it)
                            out.append(it)
                            if len(out) >= k:
                                break
                    break
        items[r, : len(out)] = torch.tensor(out, dtype=torch.int64)
    return FallbackResult(items=items, depth=depth)


# ---------------------------------------------------------------------------- checks
def _check_args(levels: int, codebook_sizes: Sequence[int], beam_width: int, trie: TorchTrie | None) -> None:
    if levels < 1:
        raise ConfigError(f"levels must be >= 1, got {levels}")
    if len(codebook_sizes) != levels:
        raise ConfigError(f"codebook_sizes has {len(codebook_sizes)} entries, levels = {levels}")
    if beam_width < 1:
        raise ConfigError(f"beam_width must be >= 1, got {beam_width}")
    if trie is not None and list(trie.codebook_sizes) != list(codebook_sizes):
        raise ConfigError(f"trie codebook_sizes {trie.codebook_sizes} != codebook_sizes {list(codebook_sizes)}")


def _check_lambda(diversity_lambda: float, penalty: str) -> None:
    if not diversity_lambda >= 0.0:
        raise ConfigError(f"diversity_lambda must be >= 0, got {diversity_lambda}")
    if penalty not in ("sum", "max"):
        raise ConfigError(f"penalty must be 'sum' or 'max', got {penalty!r}")
