"""Coarse-prefix SID retrieval (PinGER's index lookup at a shallower depth): the one implementation that the
serving Recommender and the offline evaluation share.

Full-code SID retrieval returns an item only when the model gives its whole code a high probability. A new
item (``genrec sid assign``) shares its semantic levels with the items it resembles; its last code -- the
disambiguation level, which numbers the items of one prefix -- is new: a code the model never saw a positive
for under that prefix, or, when the level grew, one past its last-level head. So full-code beams reach no such
item. Here:

1. beams run over the semantic levels 1..L-1 only (the same trie-constrained, diverse beam search, on the
   trie cut at depth L-1);
2. every item under each kept prefix is read out of the trie's last level on the device: [B, W, F] slots,
   F the most items under one prefix (no loop over rows or beams);
3. an item scores ``log P(prefix) + log p(final code | prefix)`` where the model has a trained logit for it
   (``known``; a code inside the head and the item in the SID version the model was trained on), and
   otherwise by the **new-code rule**: ``log P(prefix) + log(mean p of the prefix's known items)`` -- a new
   item is taken to be as likely as its average sibling; with no known sibling, the prefix's probability is
   split evenly over its items: ``log P(prefix) - log n``;
   With ``leaf_logits`` (the model's dense score of each catalogue row for the request) the item inside a prefix
   is chosen by the dense head instead: ``log P(prefix) + log softmax over the prefix's items of the dense
   score`` -- the code from the SID head, the item from the item embeddings (known or new alike), which spares
   the disambiguation level its hardest job, telling apart the rarely seen items of one code;
4. the items are ordered ``"prefix"``: beam by beam, inside a prefix by score (the index lookup PinGER
   describes), or ``"merged"``: all by score. The full-code beams' known items are among the merged ones with
   the same scores (their first L-1 levels are these beams; their score is the same sum of log-probs), so
   ``merged`` is the full-code list with the prefixes' other items merged in by score, without duplicates.

:func:`prefix_lists_reference` is the slow, obviously-correct twin (loops over rows, beams and leaves).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from genrec.decode.beam import NEG_INF, BeamResult, StepFn, beam_search
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError

__all__ = ["ORDERS", "PrefixLeaves", "PrefixResult", "check_prefix_args", "dense_leaf", "pad_codebooks", "prefix_lists",
           "prefix_lists_reference", "prefix_search"]

ORDERS = ("prefix", "merged")
Order = Literal["prefix", "merged"]
LeafFn = Callable[[torch.Tensor], torch.Tensor]  # catalogue rows [B, W, F] -> the request's dense scores [B, W, F]


@dataclass
class PrefixLeaves:
    """Per leaf of the full trie (depth-L node order), on the trie's device."""

    rows: torch.Tensor  # int64 [n_L]: catalogue row (-1: not in the catalogue, never returned)
    known: torch.Tensor  # bool [n_L]: the model has a trained last-level logit for the leaf

    @classmethod
    def build(cls, rows: np.ndarray, known: np.ndarray | None, device: torch.device | str) -> "PrefixLeaves":
        r = torch.as_tensor(np.asarray(rows, dtype=np.int64), device=device)
        k = torch.ones_like(r, dtype=torch.bool) if known is None else \
            torch.as_tensor(np.asarray(known, dtype=bool), device=device)
        if k.shape != r.shape:
            raise ConfigError(f"known: one flag per leaf ({tuple(r.shape)}), got {tuple(k.shape)}")
        return cls(r, k)

    @classmethod
    def reuse(cls, held: tuple[Any, Any, "PrefixLeaves"] | None, rows: np.ndarray, known: np.ndarray | None,
              device: torch.device | str) -> tuple[Any, Any, "PrefixLeaves"]:
        """``held`` = (rows, known, their device copy) while it is of these very arrays on ``device``, else a
        new one (a server rebuilds its leaves only when ``sid assign`` swapped the arrays)."""
        if held is None or held[0] is not rows or held[1] is not known or not _on(held[2].rows, device):
            held = (rows, known, cls.build(rows, known, device))
        return held


def _on(t: torch.Tensor, device: torch.device | str) -> bool:
    """``t`` lives on ``device`` ("cuda" names the current card: a tensor there is on "cuda:0", not unequal)."""
    d = torch.device(device)
    return t.device.type == d.type and (d.index is None or t.device.index in (None, d.index))


@dataclass
class PrefixResult:
    """rows int64 [B, limit] (-1 pad) in list order, their scores float [B, limit] (-inf pad), whether the model
    had a trained logit for each (bool [B, limit]), and the beams over levels 1..L-1."""

    rows: torch.Tensor
    scores: torch.Tensor
    known: torch.Tensor
    beams: BeamResult


def dense_leaf(user: torch.Tensor, item_vecs: torch.Tensor, temperature: float) -> LeafFn:
    """The dense leaf scores for :func:`prefix_search`: row r of request b scores ``user[b] . item_vecs[r] /
    temperature`` (``user`` [B, D], ``item_vecs`` [N, D], the catalogue's vectors by row)."""
    u, vecs = user.float(), item_vecs.float()

    def leaf(rows: torch.Tensor) -> torch.Tensor:  # [B, W, F] -> [B, W, F]
        return torch.einsum("bd,bwfd->bwf", u, vecs[rows]) / temperature

    return leaf


def pad_codebooks(step_fn: StepFn, sizes: Sequence[int]) -> StepFn:
    """``step_fn`` with each level's log-probs padded with -inf up to ``sizes`` (a trie whose last level grew
    past the model's head after `genrec sid assign`): full-code beams never take a code the model has no
    logit for. Levels already as wide pass through unchanged."""
    ks = [int(k) for k in sizes]

    def step(prefix: torch.Tensor) -> torch.Tensor:
        lp = step_fn(prefix)  # [B, W, K_model]
        k = ks[prefix.shape[-1]]
        if lp.shape[-1] > k:
            raise ConfigError(f"level {prefix.shape[-1] + 1}: the model has {lp.shape[-1]} codes, the trie {k}")
        if lp.shape[-1] == k:
            return lp
        return torch.cat([lp, lp.new_full((*lp.shape[:-1], k - lp.shape[-1]), NEG_INF)], dim=-1)

    return step


def check_prefix_args(order: str, limit: int, trie: TorchTrie, leaves: PrefixLeaves) -> None:
    """The coarse-prefix retrieval's arguments, checked before any work (a ConfigError naming the bad one)."""
    if order not in ORDERS:
        raise ConfigError(f"order must be one of {ORDERS}, got {order!r}")
    if limit < 1:
        raise ConfigError(f"limit must be >= 1, got {limit}")
    if trie.n_levels < 2:
        raise ConfigError("coarse-prefix retrieval needs at least 2 SID levels")
    if leaves.rows.shape[0] != trie.n_nodes(trie.n_levels):
        raise ConfigError(f"leaves: {leaves.rows.shape[0]} rows for a trie of {trie.n_nodes(trie.n_levels)} leaves")


def _expand(step_fn: StepFn, trie: TorchTrie, leaves: PrefixLeaves, beams: BeamResult,
            leaf_logits: LeafFn | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every leaf under each beam: (score [B, W, F] (-inf: no item), row [B, W, F], known [B, W, F])."""
    ptrie = trie.cut(trie.n_levels - 1)
    prefix = beams.codes.clamp_min(0)  # [B, W, L-1]
    node = ptrie.walk(prefix)[..., -1]  # [B, W] depth-(L-1) node (-1 none)
    alive = beams.valid & (node >= 0)
    last = step_fn(prefix).float()  # [B, W, K_model]
    km = last.shape[-1]
    off, codes, fan = trie.last_level()
    safe = node.clamp_min(0)
    start = off[safe]  # [B, W]
    count = torch.where(alive, off[safe + 1] - start, torch.zeros_like(start))  # [B, W] items under the prefix
    slot = torch.arange(max(fan, 1), device=node.device)  # [F]
    leaf = (start[..., None] + slot).clamp(max=max(codes.numel() - 1, 0))  # [B, W, F]
    on = slot < count[..., None]  # [B, W, F]
    code = codes[leaf]  # [B, W, F]
    kn = on & leaves.known[leaf] & (code < km)
    lp = last.gather(2, code.clamp(max=km - 1))  # [B, W, F] log p(code | prefix)
    # the new-code rule: the mean probability of the prefix's known items, else an even share of the prefix
    n_kn = kn.sum(-1)  # [B, W]
    mean = torch.logsumexp(lp.masked_fill(~kn, NEG_INF), -1) - n_kn.clamp_min(1).float().log()
    rule = torch.where(n_kn > 0, mean, -count.clamp_min(1).float().log())  # [B, W]
    row = leaves.rows[leaf]
    ok = on & (row >= 0)
    if leaf_logits is None:
        within = torch.where(kn, lp, rule[..., None])
    else:  # softmax of the dense scores over the prefix's catalogue items (a prefix with none: NaN, masked below)
        d = leaf_logits(row.clamp_min(0)).float().masked_fill(~ok, NEG_INF)
        within = d - torch.logsumexp(d, -1, keepdim=True)
    score = (beams.scores.float()[..., None] + within).masked_fill(~ok, NEG_INF)
    return score, row, kn


def prefix_search(step_fn: StepFn, trie: TorchTrie, leaves: PrefixLeaves, batch_size: int, beam_width: int,
                  limit: int, *, order: Order = "merged", diversity_lambda: float = 0.0,
                  penalty: Literal["sum", "max"] = "sum", device: torch.device | str = "cpu",
                  leaf_logits: LeafFn | None = None) -> PrefixResult:
    """Coarse-prefix SID retrieval (module docstring): up to ``limit`` catalogue rows per request.

    ``step_fn(prefix [B, W, d]) -> log-probs [B, W, K_{d+1}]`` as for :func:`~genrec.decode.beam.beam_search`,
    at the model's codebook sizes (its last level may be narrower than the trie's); ``trie`` the full trie of
    the served SIDs; ``leaves`` its leaves' catalogue rows and known flags. ``leaf_logits(rows [B, W, F]) ->
    [B, W, F]``: each row's dense score for its request (rows >= 0); given, the item inside a prefix is scored
    by its softmax over the prefix's items instead of by the last SID level."""
    check_prefix_args(order, limit, trie, leaves)
    ls = trie.n_levels - 1
    beams = beam_search(step_fn, batch_size, ls, trie.codebook_sizes[:ls], beam_width,
                        diversity_lambda=diversity_lambda, penalty=penalty, trie=trie.cut(ls), device=device)
    return prefix_lists(step_fn, trie, leaves, beams, limit, order, leaf_logits)


def prefix_lists(step_fn: StepFn, trie: TorchTrie, leaves: PrefixLeaves, beams: BeamResult, limit: int,
                 order: Order, leaf_logits: LeafFn | None = None) -> PrefixResult:
    """Steps 2-4 of the module docstring after the beams over levels 1..L-1: every leaf under each beam scored,
    then ``limit`` rows per request in ``order``. Sync-free (the graphed SID stage captures it)."""
    score, row, kn = _expand(step_fn, trie, leaves, beams, leaf_logits)  # [B, W, F]
    b = score.shape[0]
    if order == "prefix":  # inside each beam by score, beams in their order; then the empty slots last
        score, i = score.sort(dim=2, descending=True, stable=True)
        row, kn = row.gather(2, i), kn.gather(2, i)
        flat_s, flat_r, flat_k = score.reshape(b, -1), row.reshape(b, -1), kn.reshape(b, -1)
        j = (~torch.isfinite(flat_s)).to(torch.int8).sort(dim=1, stable=True).indices
    else:
        flat_s, flat_r, flat_k = score.reshape(b, -1), row.reshape(b, -1), kn.reshape(b, -1)
        j = flat_s.sort(dim=1, descending=True, stable=True).indices
    j = j[:, :limit]
    s, r, k = flat_s.gather(1, j), flat_r.gather(1, j), flat_k.gather(1, j)
    if j.shape[1] < limit:  # fewer slots than asked for
        pad = limit - j.shape[1]
        s = torch.cat([s, s.new_full((b, pad), NEG_INF)], 1)
        r = torch.cat([r, r.new_full((b, pad), -1)], 1)
        k = torch.cat([k, k.new_zeros((b, pad))], 1)
    ok = torch.isfinite(s)
    return PrefixResult(torch.where(ok, r, torch.full_like(r, -1)), s, k & ok, beams)


def prefix_lists_reference(beam_codes: np.ndarray, beam_scores: np.ndarray, beam_valid: np.ndarray,
                           last_logprobs: np.ndarray, sids: np.ndarray, rows: np.ndarray, known: np.ndarray,
                           limit: int, order: Order = "merged", item_scores: np.ndarray | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
    """The slow twin of :func:`prefix_search`'s expansion and ordering, one row, beam and item at a time.

    ``beam_codes`` int [B, W, L-1], ``beam_scores`` float [B, W], ``beam_valid`` bool [B, W] (the beams over
    levels 1..L-1), ``last_logprobs`` float [B, W, K_model] (the model's last-level log-probs after each beam),
    ``sids`` int [N, L] the full SIDs in lexicographic order (the trie's leaves), ``rows`` / ``known`` per
    SID; ``item_scores`` float [B, n_rows]: each request's dense score per catalogue row (the dense leaf rule).
    Returns (rows int64 [B, limit] (-1 pad), scores float64 [B, limit] (-inf pad)); ties keep beam order,
    then SID order."""
    b, w = beam_scores.shape
    km = last_logprobs.shape[-1]
    out_r = np.full((b, limit), -1, np.int64)
    out_s = np.full((b, limit), -np.inf)
    for i in range(b):
        got: list[tuple[float, int, int, int]] = []  # (score, beam, position in the SID order, row)
        for j in range(w):
            if not beam_valid[i, j]:
                continue
            under = [n for n in range(len(sids)) if list(sids[n][:-1]) == list(beam_codes[i, j])]
            if not under:
                continue
            kn = [n for n in under if known[n] and sids[n][-1] < km]
            p = [math.exp(float(last_logprobs[i, j, sids[n][-1]])) for n in kn]
            rule = math.log(sum(p) / len(p)) if kn else -math.log(len(under))
            in_cat = [n for n in under if rows[n] >= 0]
            if item_scores is not None and in_cat:  # log softmax of the dense scores over the prefix's items
                z = max(float(item_scores[i, rows[n]]) for n in in_cat)
                lse = z + math.log(sum(math.exp(float(item_scores[i, rows[n]]) - z) for n in in_cat))
            for n in in_cat:
                if item_scores is not None:
                    s = float(beam_scores[i, j]) + float(item_scores[i, rows[n]]) - lse
                else:
                    s = float(beam_scores[i, j]) + (float(last_logprobs[i, j, sids[n][-1]]) if n in kn else rule)
                got.append((s, j, n, int(rows[n])))
        if order == "prefix":
            got.sort(key=lambda t: (t[1], -t[0], t[2]))
        else:
            got.sort(key=lambda t: (-t[0], t[1], t[2]))
        got = got[:limit]
        out_r[i, :len(got)] = [t[3] for t in got]
        out_s[i, :len(got)] = [t[0] for t in got]
    return out_r, out_s
