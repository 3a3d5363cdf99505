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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from genrec.decode.beam import BeamResult, _check_args, _check_lambda, finalize, raise_on_nan, run_levels
from genrec.decode.trie_torch import TorchTrie
from genrec.model.genrec_model import BeamContext, GenRecModel
from genrec.model.graphs import GraphCache, autocast_state, bucket_length, capture

__all__ = ["GraphedBeamSearch", "bucket_length"]  # bucket_length: re-exported


@dataclass
class _Inputs:
    """Static input buffers of one (batch, bucket, dtype, target presence) shape."""

    ctx: BeamContext  # views of the buffers below, what the captured steps read
    k: list[torch.Tensor]  # [B, H, nb, Dh] per layer
    v: list[torch.Tensor]


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None: the program is run eagerly on the static inputs (use_graph=False)
    inputs: _Inputs
    result: BeamResult
    nan: list[torch.Tensor]
    run: Callable[[], tuple[BeamResult, list[torch.Tensor]]]


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

    def _program(self, sctx: BeamContext, beam_width: int, diversity_lambda: float,
                 penalty: Literal["sum", "max"], constrain: bool) -> Callable[[], tuple[BeamResult, list[torch.Tensor]]]:
        cfg = self.model.config
        model, trie = self.model, self.trie

        def step(prefix: torch.Tensor) -> torch.Tensor:
            return F.log_softmax(model.sid_logits_ctx(sctx, prefix).float(), dim=-1)  # [B, W, K]

        def run() -> tuple[BeamResult, list[torch.Tensor]]:
            state = run_levels(step, sctx.batch_size, cfg.sid_levels, beam_width, diversity_lambda=diversity_lambda,
                               penalty=penalty, trie=trie, constrain=constrain, device=sctx.lengths.device)
            return finalize(state, beam_width, trie=trie), state.nan

        return run

    def _capture(self, inp: _Inputs, run: Callable[[], tuple[BeamResult, list[torch.Tensor]]]) -> _Graph:
        if not self.use_graph:
            return _Graph(None, inp, *run(), run)
        graph, (result, nan) = capture(run)
        return _Graph(graph, inp, result, nan, run)

    # ------------------------------------------------------------------ replay
    @torch.no_grad()
    def __call__(self, ctx: BeamContext, beam_width: int, *, diversity_lambda: float = 0.0,
                 penalty: Literal["sum", "max"] = "sum", constrain: bool = True) -> BeamResult:
        if not self.supports(ctx):
            raise ValueError("GraphedBeamSearch: needs a CUDA BeamContext in eval mode with at most "
                             f"{self.max_bucket} cached tokens (got {ctx.n_tokens})")
        cfg = self.model.config
        _check_args(cfg.sid_levels, cfg.sid_codebook_sizes, beam_width, self.trie)
        _check_lambda(diversity_lambda, penalty)
        nb = bucket_length(ctx.n_tokens, self.min_bucket)
        with self._cache.lock:
            in_key, inp = self._static_inputs(ctx, nb)
            key = (in_key, int(beam_width), float(diversity_lambda), penalty, bool(constrain), autocast_state())
            self._fill(inp, ctx)
            n_before = self._cache.captures
            g = self._cache.get(key, lambda: self._capture(
                inp, self._program(inp.ctx, beam_width, diversity_lambda, penalty, constrain)))
            if self._cache.captures != n_before:  # a capture may have evicted a graph
                used = {k[0] for k in self._cache.graphs}
                for stale in [k for k in self._inputs if k not in used]:  # buffers no graph reads any more
                    del self._inputs[stale]
            if g.graph is not None:
                g.graph.replay()
            else:
                g.result, g.nan = g.run()
            res = BeamResult(g.result.codes.clone(), g.result.scores.clone(), g.result.valid.clone())
            nan = [f.clone() for f in g.nan]
        raise_on_nan(nan)
        return res
