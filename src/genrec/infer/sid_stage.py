"""The Recommender's SID stage: beams over the cached history, graphed on a GPU, and the coarse-prefix retrieval
(the dense leaf by default) that turns them into catalogue rows. A mixin of :class:`genrec.infer.recommender.
Recommender`, which owns the state read here (the model, the trie and its leaves, the graph settings)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from genrec.decode.beam import BeamResult, beam_search
from genrec.decode.graphs import GraphedBeamSearch
from genrec.decode.prefix import Order, PrefixLeaves, dense_leaf, pad_codebooks, prefix_search
from genrec.decode.rows import beam_leaf_rows, beam_rows
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError
from genrec.infer.load import trained_temperature
from genrec.infer.profile import stage
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel
from genrec.model.kv_cache import KVCache

__all__ = ["SidStage"]


class SidStage:
    """SID retrieval over one encoding (the state is the Recommender's, set in its ``__init__``)."""

    model: GenRecModel
    config: ModelConfig
    device: torch.device
    trie: TorchTrie | None
    leaf_rows: np.ndarray | None
    known_leaves: np.ndarray | None
    sid_mode: str
    item_vecs: torch.Tensor
    run_config: dict[str, Any]
    _leaves: tuple[Any, Any, PrefixLeaves] | None
    _leaf_t: torch.Tensor | None
    _leaf_src: np.ndarray | None
    _graphed: GraphedBeamSearch | None
    _beam_graph: bool | None
    _beam_graphs: int

    def decode_sids(self, cache: KVCache, beam_width: int, diversity_lambda: float = 0.0, constrain: bool = True) -> BeamResult:
        """SID beams over the cached history: codes [B, W, L] (constrained through the trie). Codes of a last
        level grown past the model's head (`genrec sid assign`) get -inf: full-code beams never reach them."""
        if self.trie is None:
            raise ConfigError(f"layout {self.config.layout!r} has no SID stage")
        cfg = self.config
        sizes = self.trie.codebook_sizes
        # shared-prefix plan checked once here; every step then runs sync-free over the context
        ctx = self.model.beam_context(cache) if self.model.shared_beam_decode else None
        graphed = self._beam_graphs_for(ctx)
        if ctx is not None and graphed is not None and sizes == list(cfg.sid_codebook_sizes) and graphed.supports(ctx):
            return graphed(ctx, beam_width, diversity_lambda=diversity_lambda, constrain=constrain)
        return beam_search(pad_codebooks(self._sid_step(cache, ctx), sizes), cache.batch_size, cfg.sid_levels, sizes,
                           beam_width, diversity_lambda=diversity_lambda, trie=self.trie, constrain=constrain,
                           device=self.device)

    def _beam_graphs_for(self, ctx: Any) -> GraphedBeamSearch | None:
        """The graphed SID stage of this trie (made on first use), or None where the beams run eagerly."""
        if ctx is None or self._beam_graph is None or self.trie is None:
            return None
        if self._graphed is None or self._graphed.trie is not self.trie:
            self._graphed = GraphedBeamSearch(self.model, self.trie, max_graphs=self._beam_graphs,
                                              use_graph=self._beam_graph)
        return self._graphed

    def _sid_step(self, cache: KVCache, ctx: Any) -> Any:
        """The beam step over the cached history: prefix [B, W, d] -> log-probs [B, W, K_{d+1}] (the model's sizes)."""
        def step(prefix: torch.Tensor) -> torch.Tensor:
            logits = self.model.sid_logits_ctx(ctx, prefix) if ctx is not None else self.model.sid_logits_next(cache, prefix)
            return F.log_softmax(logits.float(), dim=-1)  # [B, W, K]

        return step

    @property
    def served_sid_mode(self) -> str:
        """The SID retrieval requests get: :attr:`sid_mode`, "auto" resolved -- "merged" while some catalogue
        item has no trained last-level logit (:attr:`known_leaves`), else "dense" where the model has a dense
        stage (a user head), else "full"."""
        if self.sid_mode != "auto":
            return self.sid_mode
        if self.known_leaves is not None and not bool(np.all(self.known_leaves)):
            return "merged"
        return "dense" if self.model.user_head is not None else "full"

    def retrieve_sids(self, cache: KVCache, beam_width: int, diversity_lambda: float, limit: int,
                      user: torch.Tensor | None = None) -> tuple[BeamResult, np.ndarray, np.ndarray]:
        """The SID stage (:attr:`served_sid_mode`): (beams, catalogue rows int64 [B, limit] (-1 pad), the log-prob
        each was retrieved with, float32 [B, limit] (nan pad)). "full": the full-code beams' items in beam order
        (:meth:`beam_rows`); "prefix" / "merged" / "dense": the coarse-prefix retrieval (:mod:`genrec.decode.prefix`:
        beams over levels 1..L-1, each item's log P(SID), the new-code rule's score, or with "dense" its prefix's
        log-prob plus its dense leaf score from ``user`` [B, D], this encoding's user vectors)."""
        if self.served_sid_mode == "full":
            with stage("sid.beams"):
                beams = self.decode_sids(cache, beam_width, diversity_lambda)
            with stage("sid.rows"):
                rows, lp = self.beam_rows(beams, limit)
            return beams, rows, lp
        res = self._prefix_result(cache, beam_width, diversity_lambda, limit, user)
        packed = torch.cat([res.rows.double(), res.scores.double()], 1).cpu().numpy()  # one device->host copy
        rows = packed[:, :limit].astype(np.int64)
        lp = np.where(rows >= 0, packed[:, limit:], np.nan).astype(np.float32)
        return res.beams, rows, lp

    def retrieve_sids_t(self, cache: KVCache, beam_width: int, diversity_lambda: float, limit: int,
                        user: torch.Tensor | None = None) -> tuple[BeamResult, torch.Tensor, torch.Tensor]:
        """:meth:`retrieve_sids` left on the device, no device->host copy: (beams, rows int64 [B, X] (-1 pad),
        float32 [B, X] log-probs (nan pad)). "full": X = the beam width, each beam's row in beam order, NOT
        deduplicated (the union keeps a row's first beam, as :meth:`beam_rows` does); else X = ``limit``."""
        if self.served_sid_mode == "full":
            with stage("sid.beams"):
                beams = self.decode_sids(cache, beam_width, diversity_lambda)
            rows = beam_leaf_rows(beams, self.trie, self._leaf_tensor())  # type: ignore[arg-type]
            return beams, rows, torch.where(rows >= 0, beams.scores.float(), float("nan"))
        res = self._prefix_result(cache, beam_width, diversity_lambda, limit, user)
        rows = res.rows[:, :limit].long()
        return res.beams, rows, torch.where(rows >= 0, res.scores[:, :limit].float(), float("nan"))

    def _prefix_result(self, cache: KVCache, beam_width: int, diversity_lambda: float, limit: int,
                       user: torch.Tensor | None) -> Any:
        """The coarse-prefix retrieval's result on the device (``PrefixResult``: rows, scores, beams)."""
        mode = self.served_sid_mode
        if self.trie is None or self.leaf_rows is None:
            raise ConfigError(f"layout {self.config.layout!r} has no SID stage")
        self._leaves = PrefixLeaves.reuse(self._leaves, self.leaf_rows, self.known_leaves, self.trie.device)
        ctx = self.model.beam_context(cache) if self.model.shared_beam_decode else None
        if mode == "dense" and user is None:
            raise ConfigError("sid_mode 'dense' scores items by the user vector: this model or call has none")
        order: Order = "merged" if mode == "dense" else mode  # type: ignore[assignment]
        dense_user = user if mode == "dense" else None  # None with "dense": refused just above
        graphed = self._beam_graphs_for(ctx)
        if graphed is not None and ctx is not None and graphed.supports_prefix(ctx):  # one replay: beams, leaves, order
            with stage("sid.graph"):
                return graphed.prefix(ctx, self._leaves[2], beam_width, limit, order=order,
                                      diversity_lambda=diversity_lambda, user=dense_user, item_vecs=self.item_vecs,
                                      temperature=trained_temperature(self.run_config))
        leaf = (None if dense_user is None else
                dense_leaf(dense_user, self.item_vecs, trained_temperature(self.run_config)))
        return prefix_search(self._sid_step(cache, ctx), self.trie, self._leaves[2], cache.batch_size, beam_width,
                             limit, order=order, diversity_lambda=diversity_lambda, device=self.device,
                             leaf_logits=leaf)

    def _leaf_tensor(self) -> torch.Tensor:
        """:attr:`leaf_rows` on the trie's device (made once per leaf table)."""
        if self.trie is None or self.leaf_rows is None:
            raise ConfigError(f"layout {self.config.layout!r} has no SID stage")
        if self._leaf_t is None or self._leaf_t.device != self.trie.device or self._leaf_src is not self.leaf_rows:
            self._leaf_t = torch.as_tensor(np.asarray(self.leaf_rows, dtype=np.int64), device=self.trie.device)
            self._leaf_src = self.leaf_rows
        return self._leaf_t

    def beam_rows(self, beams: BeamResult, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Valid beams -> catalogue rows through the SID trie's leaves, beam order, deduplicated, at most
        ``limit`` per row: (rows int64 [B, limit] (-1 pad), beam log-prob of each [B, limit])."""
        return beam_rows(beams, self.trie, self._leaf_tensor(), limit)  # type: ignore[arg-type]
