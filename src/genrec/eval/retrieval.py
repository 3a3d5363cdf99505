"""Leave-one-out retrieval evaluation of a trained model, per path, full catalogue.

* **ann** (dense): the user vector at the last history token against every item vector
  (exact inner product, scored in chunks; no users × items matrix is held).
* **sid** (generative): constrained beam search over the SID trie (PinGER), beams mapped to
  items through their unique full codes; the beam order is the ranking (beams past K miss). With
  ``sid_mode="prefix"`` / ``"merged"`` the coarse-prefix retrieval the server runs instead
  (:mod:`genrec.decode.prefix`: beams over levels 1..L-1, every item under each prefix).

History items are NOT excluded from the ranking (the TIGER/SASRec protocol the published
Beauty numbers use).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F

from genrec.catalog import ItemCatalog
from genrec.data.join import UserExample
from genrec.decode.beam import beam_search
from genrec.decode.prefix import PrefixLeaves, dense_leaf, pad_codebooks, prefix_search
from genrec.decode.rows import beam_leaf_rows
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError
from genrec.eval.metrics import place_target, rank_in_list, topk_metrics
from genrec.infer.catalog_model import CatalogModel
from genrec.model.genrec_model import GenRecModel
from genrec.train.batches import TrainExample, collate, materialise
from genrec.train.objective import JointObjective


@dataclass
class EvalSet:
    examples: list[TrainExample]
    target_rows: np.ndarray  # int64 [C]

    def __len__(self) -> int:
        return len(self.examples)

    def subset(self, idx: np.ndarray) -> "EvalSet":
        """The cases at ``idx``, in their original order."""
        idx = np.sort(np.asarray(idx))
        return EvalSet([self.examples[i] for i in idx], np.asarray(self.target_rows)[idx])


def split_eval_set(es: EvalSet, n_tune: int, n_report: int = 0, seed: int = 0) -> tuple[EvalSet, EvalSet]:
    """The cases of ``es`` (one per user) split once, at random with ``seed``: ``n_tune`` users to choose
    weights on, and of the others ``n_report`` at random (0: all of them) to report on -- disjoint."""
    n = len(es)
    if not 0 < n_tune < n:
        raise ConfigError(f"fusion_users must lie in [1, {n - 1}]: the other validation users of the {n} report "
                          f"the metrics, got {n_tune}")
    if n_report < 0:
        raise ConfigError(f"report_users must be >= 0 (0: every validation user not tuned on), got {n_report}")
    perm = np.random.default_rng(seed).permutation(n)
    rest = perm[n_tune:]
    return es.subset(perm[:n_tune]), es.subset(rest[:n_report] if n_report else rest)


def eval_cases(records: Sequence[UserExample], catalog: ItemCatalog, *, max_cases: int = 0, seed: int = 0
               ) -> tuple[EvalSet, list[UserExample], list[list[Any]]]:
    """:func:`make_eval_set`, with each case's record and that record's feedviews (its held-out slates:
    :func:`genrec.eval.ranking.collect_slates`), in the cases' order."""
    feedviews = {r.user_id: list(r.feedviews) for r in records}  # (make_eval_set clears them)
    by_user = {r.user_id: r for r in records}
    es = make_eval_set(records, catalog, max_cases=max_cases, seed=seed)
    kept = [by_user[ex.user_id] for ex in es.examples]
    return es, kept, [feedviews[r.user_id] for r in kept]


def make_eval_set(records: Sequence[UserExample], catalog: ItemCatalog, *, max_cases: int = 0,
                  seed: int = 0) -> EvalSet:
    """Eval cases from the reader's valid/test records (targets must be catalogue items)."""
    recs = [r for r in records if len(r.items) >= 1 and r.target_item >= 0]
    if max_cases and len(recs) > max_cases:
        pick = np.sort(np.random.default_rng(seed).choice(len(recs), max_cases, replace=False))
        recs = [recs[i] for i in pick]
    for r in recs:
        r.feedviews = []
    exs = materialise(recs, catalog, min_len=1)
    return EvalSet(exs, catalog.rows(np.array([r.target_item for r in recs], dtype=np.int64)))


def _batches(es: EvalSet, batch_size: int, context_len: int, n_actions: int):  # type: ignore[no-untyped-def]
    for lo in range(0, len(es), batch_size):
        exs = es.examples[lo:lo + batch_size]
        yield lo, collate(exs, epoch=0, seed=0, context_len=context_len, n_actions=n_actions, p_rank=0.0,
                          max_cands=0)


@torch.no_grad()
def evaluate_retrieval(objective: torch.nn.Module, es: EvalSet, *, paths: Sequence[str] = ("ann", "sid"),
                       ks: Sequence[int] = (5, 10, 20), beam_width: int = 20, diversity_lambda: float = 0.0,
                       context_len: int = 200, batch_size: int = 128, trie: TorchTrie | None = None,
                       leaf_rows: np.ndarray | None = None,
                       sid_mode: str = "full", known: np.ndarray | None = None, dense_temperature: float = 1.0,
                       ranks_out: dict[str, np.ndarray] | None = None,
                       lists_out: dict[str, np.ndarray] | None = None) -> dict[str, dict[str, float]]:
    """Metrics per path of ``objective``: a model with its catalogue tensors, the trainer's
    :class:`~genrec.train.objective.JointObjective` or a Recommender's :class:`~genrec.infer.catalog_model.CatalogModel`
    (``rec.catalog_model``). ``trie``/``leaf_rows`` (catalogue row of each trie leaf) enable the SID path.
    ``ranks_out``: when a dict, each evaluated path's per-case 0-based rank of the target (-1: not
    retrieved) is stored in it, for paired comparisons (:mod:`genrec.eval.significance`).
    ``lists_out``: when a dict, each evaluated path's per-case ranked top-``max(ks)`` catalogue rows
    (int [C, K], -1 padded) that the metrics were computed on are stored in it (``genrec eval
    --dump-recs``); on the ANN path ties are ordered against the target, as its rank counts them.

    ``sid_mode``: "full" (full-code beams), or the coarse-prefix retrieval the server runs
    (:func:`genrec.decode.prefix.prefix_search`, PinGER's index lookup at a shallower depth): beams over the
    semantic levels 1..L-1, then every item under each beam's prefix -- "prefix": beam by beam, inside a
    prefix by score; "merged": all by score; "dense": as the path "sid-dense" below. ``known``: per trie leaf,
    whether the model has a trained last-level logit for it (None: every code inside its head); the others take
    the new-code rule. A trie whose last level grew past the model's head (``genrec sid assign``) is read with
    -inf for the codes it lacks. The path "sid-dense" (and ``sid_mode`` "dense"): beams over the semantic levels
    as above, the item inside each prefix by the softmax of its dense (ANN) score over the prefix's items
    (``prefix_search``'s ``leaf_logits``), merged by score; the scores divided by ``dense_temperature``, the
    run's ``objective.temperature`` (:func:`genrec.infer.load.trained_temperature`: the item softmax it trained).
    """
    if sid_mode not in ("full", "prefix", "merged", "dense"):
        raise ConfigError(f"sid_mode must be full, prefix, merged or dense, got {sid_mode!r}")
    # model + catalogue tensors: the training objective, or a Recommender's CatalogModel
    obj = cast("JointObjective | CatalogModel", objective)
    model: GenRecModel = obj.model
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    cfg = model.config
    out: dict[str, dict[str, float]] = {}
    want_ann = "ann" in paths and cfg.layout != "tiger"
    has_sid = model.sid_heads is not None and trie is not None and leaf_rows is not None
    want_sid = "sid" in paths and has_sid
    want_sd = "sid-dense" in paths and has_sid and cfg.layout != "tiger"
    dense_sid = want_sid and sid_mode == "dense"
    if dense_sid and cfg.layout == "tiger":
        raise ConfigError("the dense leaf rule needs a dense user vector; the TIGER layout has none")
    item_vecs = obj.catalogue_vectors().float() if want_ann or want_sd or dense_sid else None  # [N, D]
    names = ("ann", "sid", "sid-dense")
    ranks = {p: np.full(len(es), -1, dtype=np.int64) for p in names}
    kmax = max(ks)
    lists = {p: np.full((len(es), kmax), -1, dtype=np.int64) for p in names} if lists_out is not None else None
    leaf_t = torch.as_tensor(leaf_rows, device=dev) if want_sid else None
    leaves = PrefixLeaves.build(np.asarray(leaf_rows), known, trie.device) \
        if trie is not None and leaf_rows is not None and (want_sd or sid_mode != "full") else None
    for lo, tb in _batches(es, batch_size, context_len, cfg.n_actions):
        tb = tb.to(dev)
        mb, _ = obj.model_batch(tb, mask_actions=False)
        cache, user, _ = model.encode_history(mb)
        tgt = es.target_rows[lo:lo + tb.batch_size]
        if want_ann and user is not None and item_vecs is not None:
            s = user.float() @ item_vecs.T  # [c, N]
            ts = s.gather(1, torch.as_tensor(tgt, device=dev)[:, None])
            ranks["ann"][lo:lo + len(tgt)] = ((s >= ts).sum(1) - 1).cpu().numpy()
            if lists is not None:  # the same scores: the list puts the target at exactly this rank
                top = s.topk(min(kmax + 1, s.shape[1]), dim=1).indices.cpu().numpy()
                lists["ann"][lo:lo + len(tgt)] = place_target(top, ranks["ann"][lo:lo + len(tgt)], tgt, kmax)

        def step(prefix: torch.Tensor) -> torch.Tensor:  # the SID head's next-level log-probs
            return F.log_softmax(model.sid_logits_next(cache, prefix).float(), dim=-1)

        def prefix_top(mode: str, u: torch.Tensor | None = user) -> np.ndarray:  # the coarse-prefix retrieval
            assert trie is not None and leaves is not None
            leaf = dense_leaf(u, item_vecs, dense_temperature) if mode == "dense" and u is not None \
                and item_vecs is not None else None
            return prefix_search(step, trie, leaves, tb.batch_size, beam_width, kmax,
                                 order="merged" if mode == "dense" else mode,  # type: ignore[arg-type]
                                 diversity_lambda=diversity_lambda, device=dev, leaf_logits=leaf).rows.cpu().numpy()

        if want_sid and trie is not None and leaf_t is not None:
            if sid_mode == "full":
                res = beam_search(pad_codebooks(step, trie.codebook_sizes), tb.batch_size, cfg.sid_levels,
                                  trie.codebook_sizes, beam_width, diversity_lambda=diversity_lambda, trie=trie,
                                  device=dev)
                top = beam_leaf_rows(res, trie, leaf_t)[:, :kmax].cpu().numpy()
            else:
                top = prefix_top(sid_mode)
            ranks["sid"][lo:lo + len(tgt)] = rank_in_list(top, tgt)
            if lists is not None:
                lists["sid"][lo:lo + len(tgt), :top.shape[1]] = top
        if want_sd:
            top = prefix_top("dense")
            ranks["sid-dense"][lo:lo + len(tgt)] = rank_in_list(top, tgt)
            if lists is not None:
                lists["sid-dense"][lo:lo + len(tgt), :top.shape[1]] = top
    if want_ann:
        out["ann"] = topk_metrics(ranks["ann"], ks)
    if want_sid:
        out["sid"] = topk_metrics(ranks["sid"], ks)
    if want_sd:
        out["sid-dense"] = topk_metrics(ranks["sid-dense"], ks)
    if ranks_out is not None:
        ranks_out.update({p: ranks[p] for p in out})
    if lists_out is not None and lists is not None:
        lists_out.update({p: lists[p] for p in out})
    model.train(was_training)
    return out

