"""CUDA graphs of the serving forwards: the history encode (prefill) and the ranking decode.

Non-standard here: at serving batch sizes a forward is a few hundred small kernels, so eager
PyTorch is launch-bound (the GPU idles between launches). With every value check skipped inside
:func:`~genrec.validation.trusted_inputs` (inputs validated once per request by the parser) the
forwards never synchronise with the host, so each is captured once per shape and replayed.

Shapes are made static by padding, which changes nothing in the result:

* **encode**: histories are right-padded to a power-of-two bucket of item slots; slots past
  ``lengths`` are PAD tokens (the model already ignores them: right padding is how batches of
  unequal histories work), so the cache, user vector and last hidden are those of the unpadded
  batch, plus invisible PAD tokens at the end of the cache;
* **rank**: candidates are padded to a bucket (M-FALCON: a candidate sees the history and
  itself, never another candidate, so padding candidates cannot change a real one's score) and
  the cache is copied into a bucket-sized buffer whose extra tokens are PAD (invisible).

Outputs are cloned out of the graph's static buffers before the lock is released, so a cache
handed to a request is never overwritten by the next replay. :func:`capture` is shared with the
SID beam-search graph (:mod:`genrec.decode.graphs`).
"""

from __future__ import annotations

import dataclasses
import gc
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from genrec.model.genrec_model import GenRecModel, ModelBatch
from genrec.model.kv_cache import KVCache
from genrec.model.layout import PAD, TokenMeta
from genrec.validation import trusted_inputs

__all__ = ["GraphCache", "GraphedEncoder", "GraphedRanker", "bucket_length", "capture"]

T = TypeVar("T")

# history fields of a ModelBatch that carry one entry per item slot (dim 1 = slot)
_SLOT_FIELDS = ("actions", "surfaces", "sid_codes", "item_feats", "item_vecs", "action_mask", "target_actions",
                "timestamps", "item_ids")
_ROW_FIELDS = ("lengths", "request_surface", "request_action", "request_ts")


def bucket_length(n: int, min_bucket: int = 64) -> int:
    """Smallest power of two >= max(n, min_bucket)."""
    return 1 << max(int(min_bucket) - 1, int(n) - 1, 0).bit_length()


def autocast_state() -> tuple[bool, torch.dtype | None]:
    on = torch.is_autocast_enabled("cuda")
    return on, (torch.get_autocast_dtype("cuda") if on else None)


_CAPTURE_LOCK = threading.Lock()
"""One capture at a time in the process. ``torch.cuda.graph`` begins every capture with a device
synchronize and ``empty_cache()`` and, unless given a stream, captures on one stream shared by
all captures: a second thread starting a capture while one is under way invalidates it (seen on
the H200 with micro-batched serving: new batch sizes captured by two request threads at once)."""


def capture(run: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm ``run`` up on a side stream, then capture it on that stream; returns (graph, the
    captured outputs).

    Runs under the caller's autocast dtype with autocast's weight-cast cache off (a cached cast
    made outside the graph would be freed under it) and inside ``trusted_inputs`` (no syncs).
    Capture errors are thread-local, so other threads may run eager work or replay graphs
    meanwhile (the server runs several inference threads); captures themselves are serialised
    by ``_CAPTURE_LOCK``."""
    with _CAPTURE_LOCK:
        return _capture_locked(run)


def _capture_locked(run: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    on, dtype = autocast_state()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.autocast("cuda", dtype=dtype, enabled=on, cache_enabled=False), \
            trusted_inputs():
        run()  # Triton compiles, cuBLAS handles, allocator pools
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # Python's cyclic GC is paused for the capture: a collection that ran in this thread mid-capture
    # and freed garbage holding an earlier captured graph would destroy that graph here, which CUDA
    # forbids while this thread captures -- the capture is invalidated (seen on the H200 with the
    # graphs of earlier encoders collected during a new capture). torch.cuda.graph no longer collects
    # before capturing (torch.compiler.config.force_cudagraph_gc). GC state is process-wide, so no
    # other thread collects meanwhile either; the garbage is collected after.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        # thread_local: the server's other inference threads keep running their own (uncaptured) work
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"), \
                torch.autocast("cuda", dtype=dtype, enabled=on, cache_enabled=False), trusted_inputs():
            out = run()
    finally:
        if gc_was_on:
            gc.enable()
    return graph, out


class _Static:
    """One captured shape: ``run()`` recomputes ``out`` from the static inputs -- by replaying
    the graph, or (``use_graph=False``: CPU tests of the padding logic) by calling the forward."""

    def __init__(self, fn: Callable[[], Any], use_graph: bool) -> None:
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Any = None
        if use_graph:
            self.graph, self.out = capture(fn)

    def run(self) -> Any:
        if self.graph is not None:
            self.graph.replay()
            return self.out
        with trusted_inputs():
            return self.fn()


class GraphCache:
    """LRU of captured graphs keyed by shape; replays serialised by one lock."""

    def __init__(self, max_graphs: int) -> None:
        self.max_graphs = max_graphs
        self.graphs: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self.lock = threading.Lock()
        self.captures = 0

    def get(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = make()
            self.captures += 1
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        return g


class GraphedEncoder:
    """``model.encode_history(batch)`` captured per (batch size, slot bucket, input dtypes) and replayed.

    Returns the same (cache, user vector, last hidden) as the eager call, the cache holding
    ``bucket - n`` extra PAD tokens per row (invisible to every later attention)."""

    def __init__(self, model: GenRecModel, *, min_bucket: int = 64, max_graphs: int = 8,
                 use_graph: bool = True) -> None:
        self.model = model
        self.min_bucket = min_bucket
        self.use_graph = use_graph  # False: the same static-shape path run eagerly (CPU tests)
        self._cache = GraphCache(max_graphs)

    @property
    def captures(self) -> int:
        return self._cache.captures

    def supports(self, batch: ModelBatch) -> bool:
        cfg = self.model.config
        return bool((batch.actions.is_cuda or not self.use_graph) and not self.model.training and batch.n_cand == 0
                    and batch.n_items <= cfg.max_items)

    @torch.no_grad()
    def __call__(self, batch: ModelBatch, *, speculate: bool = False) -> tuple[KVCache, torch.Tensor | None,
                                                                              torch.Tensor]:
        """(cache, user vector, last hidden) of ``batch``, the cache's plans memoised. Their verdicts (does cascade
        attention compute the same function?) are read back here, one sync that waits for the whole graph; with
        ``speculate`` they are not: the plans are taken as holding and the verdict is left on the device as
        ``cache.plans["assumed"]`` (bool ``[]``), for the caller to read with its answers and to redo the batch
        without speculation where it is False (:func:`genrec.infer.device_funnel.run_on_device`)."""
        if not self.supports(batch):
            raise ValueError("GraphedEncoder: needs a CUDA batch without candidates, in eval mode, of at "
                             "most max_items item slots")
        n = batch.n_items
        # a power-of-two bucket, capped at the model's context (a full-context history still replays)
        nb = min(bucket_length(n, self.min_bucket), self.model.config.max_items)  # supports(): n <= max_items
        present = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch) if getattr(batch, f.name) is not None}
        key = (nb, autocast_state(), tuple((k, v.dtype, tuple(v.shape[:1]) + tuple(v.shape[2:])) for k, v in present.items()))

        def make() -> Any:
            static = {}
            for k, v in present.items():
                if k in _SLOT_FIELDS:
                    static[k] = torch.zeros((v.shape[0], nb, *v.shape[2:]), dtype=v.dtype, device=v.device)
                elif k in _ROW_FIELDS:
                    static[k] = torch.zeros_like(v)
                else:
                    raise ValueError(f"GraphedEncoder: batch field {k!r} is not supported")
            sbatch = type(batch)(**static)

            def run() -> Any:
                cache, user, last_h = self.model.encode_history(sbatch)
                # the beams' shared-prefix plan and the ranking's candidate plan, computed with the cache
                # (sync-free) and replayed with it: an eager plan is ~100 small launches and a sync per batch
                plan = self.model.shared_plan_lazy(cache) if self.model.shared_beam_decode else None
                cplan = (self.model.backbone.candidate_plan_lazy(cache) if self.model.action_head is not None
                         and cache.meta is not None and cache.lengths is not None else None)
                return cache, user, last_h, plan, cplan

            return _Static(run, self.use_graph), static

        with self._cache.lock:
            prog, static = self._cache.get(key, make)
            for k, v in present.items():
                if k in _SLOT_FIELDS:
                    static[k][:, :n].copy_(v)
                else:
                    static[k].copy_(v)
            cache, user, last_h, plan, cplan = prog.run()
            clone = lambda t: None if t is None else t.clone()  # noqa: E731
            res = KVCache([t.clone() for t in cache.k], [t.clone() for t in cache.v],
                          TokenMeta(cache.meta.pos.clone(), cache.meta.kind.clone(), cache.meta.tok.clone()),
                          clone(cache.lengths), clone(cache.last_hidden), cache.layout, clone(cache.last_ts))
            # memoised as beam_context and candidate_plan_ok would compute them: one sync for both, no launches
            verdicts = [p[1] for p in (plan, cplan) if p is not None]
            if speculate and verdicts:  # taken as holding; the verdict stays on the device for the caller
                res.plans["assumed"] = torch.stack(verdicts).all()
                oks = [True] * len(verdicts)
            else:
                oks = [bool(x) for x in torch.stack(verdicts).tolist()] if verdicts else []
            if plan is not None:
                res.plans["hist_len"] = plan[0].clone() if oks[0] else None
            if cplan is not None:
                res.plans["cand_ok"] = oks[-1]
                if oks[-1]:
                    res.plans["cand_hist_len"] = cplan[0].clone()
            return res, clone(user), last_h.clone()


class GraphedRanker:
    """``model.rank(cache, cand_vecs, cand_sid_codes, surface, request_ts)`` captured per (batch
    size, cache bucket, candidate bucket, dtypes) and replayed; same logits ``[B, k, C]``."""

    def __init__(self, model: GenRecModel, *, min_bucket: int = 64, min_cand_bucket: int = 16,
                 max_graphs: int = 16, use_graph: bool = True) -> None:
        self.model = model
        self.use_graph = use_graph  # False: the same static-shape path run eagerly (CPU tests)
        self.min_bucket, self.min_cand_bucket = min_bucket, min_cand_bucket
        self._cache = GraphCache(max_graphs)

    @property
    def captures(self) -> int:
        return self._cache.captures

    def supports(self, cache: KVCache, cand_vecs: torch.Tensor) -> bool:
        return ((cand_vecs.is_cuda or not self.use_graph) and not self.model.training and cache.meta is not None
                and cache.lengths is not None)

    @torch.no_grad()
    def __call__(self, cache: KVCache, cand_vecs: torch.Tensor, cand_sid_codes: torch.Tensor | None,
                 surface: torch.Tensor, request_ts: torch.Tensor | None = None) -> torch.Tensor:
        if not self.supports(cache, cand_vecs):
            raise ValueError("GraphedRanker: needs a filled CUDA cache and CUDA candidates, in eval mode")
        assert cache.meta is not None and cache.lengths is not None
        lengths = cache.lengths
        b, m = cand_vecs.shape[:2]
        n = cache.n_tokens
        nb = bucket_length(n, self.min_bucket)
        mb = bucket_length(m, self.min_cand_bucket)
        k0 = cache.k[0]
        # cascade attention or the masked decode, decided on this cache (one sync, memoised) and fixed in the
        # graph: the bucket's padding keys come after every visible one, so a prefix stays a prefix
        cascade = self.model.rank_by_cascade(cache)
        key = (b, nb, mb, k0.dtype, cand_vecs.dtype, surface.dim(), cand_sid_codes is not None,
               request_ts is not None, cache.last_ts is not None, cache.layout, autocast_state(), cascade)

        def make() -> Any:
            dev = k0.device
            h, dh = k0.shape[1], k0.shape[3]
            zi = torch.zeros(b, nb, dtype=torch.int64, device=dev)
            s = KVCache([torch.zeros(b, h, nb, dh, dtype=k0.dtype, device=dev) for _ in cache.k],
                        [torch.zeros(b, h, nb, dh, dtype=k0.dtype, device=dev) for _ in cache.v],
                        TokenMeta(zi, zi.clone(), zi.clone()),
                        torch.zeros_like(lengths), None, cache.layout,
                        None if cache.last_ts is None else torch.zeros_like(cache.last_ts))
            s.plans["cand_ok"] = cascade
            if cascade:  # the decision's hist_len, copied in per call: the graph does not plan
                s.plans["cand_hist_len"] = torch.zeros_like(lengths)
            vecs = torch.zeros(b, mb, cand_vecs.shape[2], dtype=cand_vecs.dtype, device=dev)
            codes = None if cand_sid_codes is None else torch.zeros(
                b, mb, cand_sid_codes.shape[2], dtype=cand_sid_codes.dtype, device=dev)
            surf = torch.zeros(b, *([mb] if surface.dim() == 2 else []), dtype=surface.dtype, device=dev)
            rts = None if request_ts is None else torch.zeros_like(request_ts)
            prog = _Static(lambda: self.model.rank(s, vecs, codes, surf, rts), self.use_graph)
            return prog, (s, vecs, codes, surf, rts)

        with self._cache.lock:
            prog, (s, vecs, codes, surf, rts) = self._cache.get(key, make)
            for dst, src in zip(s.k + s.v, cache.k + cache.v):
                dst[:, :, :n].copy_(src)
            sm, cm = s.meta, cache.meta
            assert sm is not None
            sm.pos[:, :n].copy_(cm.pos)
            sm.tok[:, :n].copy_(cm.tok)
            sm.kind[:, :n].copy_(cm.kind)
            sm.kind[:, n:].fill_(PAD)  # bucket padding: invisible keys
            sm.tok[:, n:].copy_(torch.arange(n, nb, device=sm.tok.device))
            s.lengths.copy_(cache.lengths)  # type: ignore[union-attr]
            if cascade:  # the memo rank_by_cascade left (planned here only where a caller set cand_ok alone)
                hist_len = self.model._candidate_plan(cache)
                assert hist_len is not None  # cascade: the fast path is on and the plan holds
                s.plans["cand_hist_len"].copy_(hist_len)
            if s.last_ts is not None and cache.last_ts is not None:
                s.last_ts.copy_(cache.last_ts)
            vecs[:, :m].copy_(cand_vecs)
            if codes is not None and cand_sid_codes is not None:
                codes[:, :m].copy_(cand_sid_codes)
            if surface.dim() == 2:
                surf[:, :m].copy_(surface)
            else:
                surf.copy_(surface)
            if rts is not None and request_ts is not None:
                rts.copy_(request_ts)
            return prog.run()[:, :m].clone()
