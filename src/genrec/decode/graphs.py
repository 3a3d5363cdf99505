"""The whole SID beam search as one CUDA graph (PinGER serving: beam search over the shared history).

Non-standard here: eager PyTorch spends most of a wide beam search launching small kernels
(per level: the backbone's blocks over W*d beam tokens, the heads, the trie mask, the
selection, the bookkeeping), so the GPU idles between them. Every piece is sync-free over a
:class:`~genrec.model.genrec_model.BeamContext` -- the shared-prefix plan is checked once per
request, NaN is flagged instead of raised, the CSR trie expansion is sized at build time, the
diverse selection is one kernel -- so all levels, constraints and selection are captured once
per shape and replayed with a single launch ("beam selection inside the captured graph, not
in Python").

Shapes must be static: one graph per (batch, beam width, history bucket, lambda, penalty,
constrain, K/V dtype, autocast dtype, target presence). History lengths are bucketed to powers of
two; the cached K/V are copied into the bucket's static buffers, and cascade attention reads
only the first ``hist_len`` keys of each row, so the padding is never read. Graphs are kept
in an LRU of ``max_graphs``; replays are serialised by a lock (the static buffers are shared).
The eager :func:`~genrec.decode.beam.beam_search` over the same context is the reference the
tests compare against.

:meth:`GraphedBeamSearch.prefix` captures the coarse-prefix SID stage the same way (the server's default
with a dense leaf): the beams over levels 1..L-1, every item under each kept prefix, its dense leaf score
from the request's user vector (a static input too) and the merged order -- the eager
:func:`~genrec.decode.prefix.prefix_search` is its reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F

from genrec.decode.beam import BeamResult, _check_args, _check_lambda, finalize, raise_on_nan, run_levels
from genrec.decode.prefix import Order, PrefixLeaves, PrefixResult, check_prefix_args, dense_leaf, prefix_lists
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError
from genrec.model.genrec_model import BeamContext, GenRecModel
from genrec.model.graphs import GraphCache, autocast_state, bucket_length, capture

__all__ = ["GraphedBeamSearch", "bucket_length"]  # bucket_length: re-exported


@dataclass
class _Inputs:
    """Static input buffers of one (batch, bucket, dtype, target presence) shape."""

    ctx: BeamContext  # views of the buffers below, what the captured steps read
    k: list[torch.Tensor]  # [B, H, nb, Dh] per layer
    v: list[torch.Tensor]
    user: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict)  # [B, D]: dense leaf scores


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None: the program is run eagerly on the static inputs (use_graph=False)
    inputs: _Inputs
    result: Any  # BeamResult, or PrefixResult (the coarse-prefix stage)
    nan: list[torch.Tensor]
    run: Callable[[], tuple[Any, list[torch.Tensor]]]
    keep: tuple[Any, ...] = ()  # the tensors the graph reads where they are (their ids are in its key)


class GraphedBeamSearch:
    """``beam_search`` over a model's SID steps, captured and replayed as CUDA graphs.

    ``__call__(ctx, beam_width, ...)`` returns the same :class:`BeamResult` as the eager
    ``beam_search(lambda p: log_softmax(model.sid_logits_ctx(ctx, p)), ...)``.
    """

    def __init__(self, model: GenRecModel, trie: TorchTrie | None, *, min_bucket: int = 64,
                 max_bucket: int = 1 << 15, max_graphs: int = 16, use_graph: bool = True) -> None:
        self.model, self.trie = model, trie
        self.use_graph = use_graph  # False: the same static-shape program run eagerly (CPU tests)
        self.min_bucket, self.max_bucket = min_bucket, max_bucket
        self._cache = GraphCache(max_graphs)
        self._inputs: dict[tuple[Any, ...], _Inputs] = {}

    @property
    def captures(self) -> int:
        """Graphs captured so far (tests and benchmarks read it)."""
        return self._cache.captures

    def supports(self, ctx: BeamContext) -> bool:
        return ((ctx.last_hidden.is_cuda or not self.use_graph) and not self.model.training and bool(ctx.k)
                and ctx.n_tokens <= self.max_bucket)

    # ------------------------------------------------------------------ capture
    def _static_inputs(self, ctx: BeamContext, nb: int) -> tuple[tuple[Any, ...], _Inputs]:
        k0 = ctx.k[0]
        key = (ctx.batch_size, nb, k0.dtype, ctx.last_hidden.dtype, ctx.surface is not None, ctx.action is not None)
        if key not in self._inputs:
            b, h, _, dh = k0.shape
            dev = k0.device
            ks = [torch.zeros(b, h, nb, dh, dtype=k0.dtype, device=dev) for _ in ctx.k]
            vs = [torch.zeros(b, h, nb, dh, dtype=k0.dtype, device=dev) for _ in ctx.v]
            sctx = BeamContext(
                ks, vs,
                torch.zeros_like(ctx.hist_len), torch.zeros_like(ctx.lengths), torch.zeros_like(ctx.last_hidden),
                None if ctx.surface is None else torch.zeros_like(ctx.surface),
                None if ctx.action is None else torch.zeros_like(ctx.action),
            )
            self._inputs[key] = _Inputs(sctx, ks, vs)
        return key, self._inputs[key]

    def _fill(self, inp: _Inputs, ctx: BeamContext) -> None:
        n = ctx.n_tokens
        for dst, src in zip(inp.k + inp.v, ctx.k + ctx.v):
            dst[:, :, :n].copy_(src)
        s = inp.ctx
        s.hist_len.copy_(ctx.hist_len)
        s.lengths.copy_(ctx.lengths)
        s.last_hidden.copy_(ctx.last_hidden)
        if ctx.surface is not None and s.surface is not None:
            s.surface.copy_(ctx.surface)
        if ctx.action is not None and s.action is not None:
            s.action.copy_(ctx.action)

    def _step(self, sctx: BeamContext) -> Callable[[torch.Tensor], torch.Tensor]:
        model = self.model

        def step(prefix: torch.Tensor) -> torch.Tensor:
            return F.log_softmax(model.sid_logits_ctx(sctx, prefix).float(), dim=-1)  # [B, W, K]

        return step

    def _program(self, sctx: BeamContext, beam_width: int, diversity_lambda: float,
                 penalty: Literal["sum", "max"], constrain: bool) -> Callable[[], tuple[Any, list[torch.Tensor]]]:
        levels, trie, step = self.model.config.sid_levels, self.trie, self._step(sctx)

        def run() -> tuple[BeamResult, list[torch.Tensor]]:
            state = run_levels(step, sctx.batch_size, levels, beam_width, diversity_lambda=diversity_lambda,
                               penalty=penalty, trie=trie, constrain=constrain, device=sctx.lengths.device)
            return finalize(state, beam_width, trie=trie), state.nan

        return run

    def _prefix_program(self, sctx: BeamContext, user: torch.Tensor | None, leaves: PrefixLeaves,
                        item_vecs: torch.Tensor | None, temperature: float, beam_width: int, limit: int,
                        order: Order, diversity_lambda: float, penalty: Literal["sum", "max"]
                        ) -> Callable[[], tuple[Any, list[torch.Tensor]]]:
        trie, step = self.trie, self._step(sctx)
        assert trie is not None  # supports_prefix()
        ls = trie.n_levels - 1
        cut = trie.cut(ls)

        def run() -> tuple[PrefixResult, list[torch.Tensor]]:
            state = run_levels(step, sctx.batch_size, ls, beam_width, diversity_lambda=diversity_lambda,
                               penalty=penalty, trie=cut, device=sctx.lengths.device)
            leaf = None if user is None or item_vecs is None else dense_leaf(user, item_vecs, temperature)
            return prefix_lists(step, trie, leaves, finalize(state, beam_width, trie=cut), limit, order, leaf), state.nan

        return run

    def _capture(self, inp: _Inputs, run: Callable[[], tuple[Any, list[torch.Tensor]]], keep: tuple[Any, ...] = ()
                 ) -> _Graph:
        if not self.use_graph:
            return _Graph(None, inp, *run(), run, keep)
        graph, (result, nan) = capture(run)
        return _Graph(graph, inp, result, nan, run, keep)

    # ------------------------------------------------------------------ replay
    def _replay(self, ctx: BeamContext, key: tuple[Any, ...], user: torch.Tensor | None,
                program: Callable[[_Inputs, torch.Tensor | None], Callable[[], tuple[Any, list[torch.Tensor]]]],
                keep: tuple[Any, ...] = ()) -> Any:
        """Fill the static inputs of ``ctx``'s shape (and ``user``'s), replay (or capture) the graph of ``key``;
        the result cloned out of the graph's buffers. NaN flags raise after the replay (one host sync)."""
        nb = bucket_length(ctx.n_tokens, self.min_bucket)
        with self._cache.lock:
            in_key, inp = self._static_inputs(ctx, nb)
            su = None
            if user is not None:
                su = inp.user.get((user.shape[1], user.dtype))
                if su is None:
                    su = inp.user[(user.shape[1], user.dtype)] = torch.zeros_like(user)
                su.copy_(user)
            self._fill(inp, ctx)
            n_before = self._cache.captures
            g = self._cache.get((in_key, *key, autocast_state()), lambda: self._capture(inp, program(inp, su), keep))
            if self._cache.captures != n_before:  # a capture may have evicted a graph
                used = {k[0] for k in self._cache.graphs}
                for stale in [k for k in self._inputs if k not in used]:  # buffers no graph reads any more
                    del self._inputs[stale]
            if g.graph is not None:
                g.graph.replay()
            else:
                g.result, g.nan = g.run()
            res = _clone(g.result)
            nan = [f.clone() for f in g.nan]
        raise_on_nan(nan)
        return res

    @torch.no_grad()
    def __call__(self, ctx: BeamContext, beam_width: int, *, diversity_lambda: float = 0.0,
                 penalty: Literal["sum", "max"] = "sum", constrain: bool = True) -> BeamResult:
        if not self.supports(ctx):
            raise ValueError("GraphedBeamSearch: needs a CUDA BeamContext in eval mode with at most "
                             f"{self.max_bucket} cached tokens (got {ctx.n_tokens})")
        cfg = self.model.config
        _check_args(cfg.sid_levels, cfg.sid_codebook_sizes, beam_width, self.trie)
        _check_lambda(diversity_lambda, penalty)
        key = ("full", int(beam_width), float(diversity_lambda), penalty, bool(constrain))
        return self._replay(ctx, key, None, lambda inp, _: self._program(inp.ctx, beam_width, diversity_lambda,
                                                                          penalty, constrain))

    def supports_prefix(self, ctx: BeamContext) -> bool:
        """:meth:`prefix` can run: :meth:`supports`, and the model decodes the trie's levels 1..L-1 as they are
        (only the last level may have grown past the model's head, `genrec sid assign`)."""
        t, cfg = self.trie, self.model.config
        return (self.supports(ctx) and t is not None and t.n_levels >= 2 and cfg.sid_levels == t.n_levels
                and list(t.codebook_sizes[:-1]) == list(cfg.sid_codebook_sizes[:-1]))

    @torch.no_grad()
    def prefix(self, ctx: BeamContext, leaves: PrefixLeaves, beam_width: int, limit: int, *,
               order: Order = "merged", diversity_lambda: float = 0.0, penalty: Literal["sum", "max"] = "sum",
               user: torch.Tensor | None = None, item_vecs: torch.Tensor | None = None,
               temperature: float = 1.0) -> PrefixResult:
        """The coarse-prefix SID stage (:func:`~genrec.decode.prefix.prefix_search` over ``ctx``'s SID steps, with
        ``leaf_logits = dense_leaf(user, item_vecs, temperature)`` when ``user`` [B, D] is given), captured and
        replayed like the full-code beams: the same :class:`PrefixResult` as the eager search. ``leaves`` and
        ``item_vecs`` are read where they are: a graph is kept per (leaves, item_vecs) object, holding both."""
        if not self.supports_prefix(ctx):
            raise ValueError("GraphedBeamSearch.prefix: needs what supports_prefix() checks (a CUDA BeamContext in "
                             "eval mode, a trie of >= 2 levels whose first L-1 the model decodes)")
        trie = self.trie
        assert trie is not None  # supports_prefix()
        check_prefix_args(order, limit, trie, leaves)
        ls = trie.n_levels - 1
        _check_args(ls, trie.codebook_sizes[:ls], beam_width, trie.cut(ls))
        _check_lambda(diversity_lambda, penalty)
        if user is not None and item_vecs is None:
            raise ConfigError("GraphedBeamSearch.prefix: user vectors without item_vecs")
        if user is not None and (user.shape[0] != ctx.batch_size or user.device != ctx.last_hidden.device):
            raise ConfigError(f"user: [{ctx.batch_size}, D] on {ctx.last_hidden.device} expected, got "
                              f"{list(user.shape)} on {user.device}")
        dense = None if user is None else (id(item_vecs), float(temperature), int(user.shape[1]), user.dtype)
        key = ("prefix", int(beam_width), int(limit), order, float(diversity_lambda), penalty, id(leaves), dense)
        return self._replay(ctx, key, user, lambda inp, su: self._prefix_program(
            inp.ctx, su, leaves, item_vecs, temperature, beam_width, limit, order, diversity_lambda, penalty),
            keep=(leaves, item_vecs))


def _clone(r: Any) -> Any:
    """A result out of a graph's output buffers (the next replay overwrites them)."""
    if isinstance(r, BeamResult):
        return BeamResult(r.codes.clone(), r.scores.clone(), r.valid.clone())
    return PrefixResult(r.rows.clone(), r.scores.clone(), r.known.clone(), _clone(r.beams))
