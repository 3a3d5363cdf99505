"""What the routes share (:class:`Service`): the served bundle's holder, the metrics, the micro-batcher and, in
two-process mode, the K/V pool and the ranking process; the request paths run in worker threads. Once a
bundle is loaded the heap is frozen out of the cyclic GC (:func:`freeze_heap`)."""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import torch

from genrec.errors import ConfigError
from genrec.infer.cases import SourceIds
from genrec.infer.profile import stage
from genrec.serve.batcher import MicroBatcher
from genrec.serve.config import ServeConfig, default_threads
from genrec.serve.engine import Engine, RankingFailed
from genrec.serve.explain import explain_ids_out
from genrec.serve.ids import SourceItemIds, Unknown
from genrec.serve.kv_pool import KVPool, StaleSlotError, pool_spec_for
from genrec.serve.middleware import GcPauses, Metrics
from genrec.serve.schemas import MAX_BEAM, RankRequest, RecommendRequest
from genrec.serve.swap import BundleHolder
from genrec.serve.workers import RankerClient, RankerUnavailable

__all__ = ["Refreeze", "Service", "freeze_heap", "thaw_and_freeze"]

log = logging.getLogger("genrec.serve")


@dataclasses.dataclass
class _Call:
    """A recommend request as the engine runs it (:meth:`Service._call`)."""

    bundle: Any
    engine: Engine
    history: Any
    ids: SourceItemIds | None
    unknown: Unknown
    kw: dict[str, Any]
    key: tuple[Any, ...]


def freeze_heap() -> None:
    """Collect, then ``gc.freeze()`` everything alive: the loaded bundle (model, catalogue, indexes:
    ~315k tracked objects for the quickstart model) is never scanned again by the cyclic GC.

    Each request allocates thousands of short-lived objects, so the oldest generation gets
    collected now and then, and unfrozen that walks the whole heap. Measured on the 2-core CPU
    box (quickstart bundle, 1,000-item requests, history items still pydantic models): a full
    collection every ~50 requests, ~165 ms each (3.4 ms per request on average, and the p99);
    frozen, ~2.6 ms each. Reference counting still frees frozen objects; only cyclic garbage among
    them waits for the next :func:`thaw_and_freeze`."""
    gc.collect()
    gc.freeze()


def thaw_and_freeze() -> None:
    """After a hot swap: unfreeze (so cycles in the old bundle can be collected), collect, refreeze.
    One full collection per swap: a pause of the order of the ~165 ms above."""
    gc.unfreeze()
    freeze_heap()


class Refreeze:
    """Freezes the heap (:func:`freeze_heap`) once more after the ``after``-th :meth:`tick` (a request answered),
    when ``on``: what a server's first requests build for good (kernels' and signatures' caches, lazily imported
    modules: ~20,000 objects in the engine, ~9,000 in a front on the CPU box) leaves the cyclic GC's sight too. Its
    full collections under load went from 4.7-5.2 ms to 0.2-0.7 ms in the engine."""

    def __init__(self, on: bool, after: int = 1000) -> None:
        self.on, self.after = on, after
        self._n = itertools.count(1)  # (next() on a count is atomic under the GIL)

    def tick(self) -> None:
        if next(self._n) == self.after and self.on:
            freeze_heap()


class Service:
    """Everything the routes share: the bundle holder, metrics, and (two-process mode) pool + ranker."""

    def __init__(self, cfg: ServeConfig, holder: BundleHolder | None = None) -> None:
        if cfg.kv_pool_device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"kv_pool_device must be 'auto', 'cpu' or 'cuda', got {cfg.kv_pool_device!r}")
        if cfg.kv_pool_device == "cuda" and not str(cfg.device).startswith("cuda"):
            raise ConfigError("kv_pool_device 'cuda' needs the server on a GPU (--device cuda)")
        on_gpu = str(cfg.device).startswith("cuda")
        self.pool_on_gpu = cfg.kv_pool_device == "cuda" or (cfg.kv_pool_device == "auto" and on_gpu)
        if cfg.threads < 0:
            raise ConfigError(f"threads must be >= 0 (0 = from the machine), got {cfg.threads}")
        if cfg.switch_interval_ms is not None and not cfg.switch_interval_ms > 0:
            raise ConfigError(f"switch_interval_ms ($GENREC_SWITCH_INTERVAL_MS) must be > 0, "
                              f"got {cfg.switch_interval_ms}")
        if cfg.threads == 0:
            cfg = dataclasses.replace(cfg, threads=default_threads(cfg.device))
        if not cfg.warm_beams or any(not 1 <= int(w) <= MAX_BEAM for w in cfg.warm_beams):
            raise ConfigError(f"warm_beams must be SID beam widths in 1..{MAX_BEAM}, got {list(cfg.warm_beams)}")
        self.cfg = cfg
        # the graphs of every micro-batch bucket are captured before a bundle serves (Engine.load)
        self.holder = holder or BundleHolder(cfg.workdir, cfg.checkpoint, cfg.device,
                                             loader=functools.partial(Engine.load, max_batch=cfg.micro_batch,
                                                                       warm_beams=tuple(cfg.warm_beams)))
        # the run's ids were remapped: requests and answers speak the source file's ids (genrec.serve.ids)
        self.source_ids = SourceIds.remapped(cfg.workdir)
        self.refreeze = Refreeze(cfg.gc_freeze)  # the heap frozen again after the first answers
        self.metrics = Metrics()
        self.gc_pauses = GcPauses().install()  # into /metrics' genrec_gc_pause_ms when it is read
        self.batcher = (MicroBatcher(cfg.micro_batch, cfg.micro_batch_wait_ms, cfg.micro_batch_policy,
                                     on_wait=self.metrics.batch_wait_ms.observe, linger_ms=cfg.micro_batch_linger_ms)
                        if cfg.micro_batch > 1 else None)
        # pipeline: the next batch forms once one holds the model, if its cohort is queued already (Engine.run_many's
        # on_lock)
        self._early_handover = (functools.partial(self.batcher.handover, ready_only=True)
                                if self.batcher is not None and cfg.pipeline else None)
        # with micro-batching, 2 x micro_batch request threads: a full batch runs while the next one forms (with
        # micro_batch threads the two shared them, and batches held half as many requests: 15.9 of 32 at 64 clients
        # on the CPU box)
        self.limiter = anyio.CapacityLimiter(max(1, cfg.threads, 2 * cfg.micro_batch if self.batcher else 1))
        self.pool: KVPool | None = None
        self.ranker: RankerClient | None = None
        self._pool_lock = threading.Lock()
        self._remote_lock = threading.Lock()  # one ranking call holds KV slots at a time
        self._tmp: tempfile.TemporaryDirectory | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        b = self.holder.current if self.holder.ready else self.holder.load_initial()
        self.metrics.set_version(b.version)
        if self.cfg.two_process:
            self._ensure_pool(b.engine)
            self.ranker = RankerClient(timeout_s=self.cfg.rank_timeout_s).start()
            self.ranker.wait_ready()
            # the ranking process loads the served model now, not on its first request (which would
            # otherwise wait out the load and could time out into a degraded answer); likewise after a
            # restart, and for a hot-swapped model before the swap
            self._warm_ranker(b.engine)
            self.ranker.after_restart = lambda: self._warm_ranker(self.holder.current.engine)
            self.holder.before_swap = self._warm_ranker
        if self.cfg.switch_interval_ms is not None:
            sys.setswitchinterval(self.cfg.switch_interval_ms / 1e3)
        if self.cfg.gc_freeze:
            freeze_heap()

    def stop(self) -> None:
        self.gc_pauses.remove()
        if self.cfg.gc_freeze:
            gc.unfreeze()  # hand the heap back to the cyclic GC (matters when the process outlives the app)
        if self.ranker is not None:
            self.ranker.stop()
        if self.pool is not None:
            self.pool.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _warm_ranker(self, eng: Engine) -> None:
        """Load ``eng``'s model in the ranking process, then rank through it the shapes the server warmed for
        itself (each batch bucket at each history bucket, ``Recommender.warmup``; on a CPU one small batch): the
        ranking process compiles and captures its graphs now, with a long timeout, not in a first request's
        2 s (which timed out into a degraded answer on the GPU)."""
        if self.ranker is None:
            return
        self.ranker.warm(self._ensure_pool(eng), eng.checkpoint, digest=eng.weights_digest)
        rec, ids = eng.rec, eng.rec.catalog.item_ids
        if len(ids) == 0:
            return
        sources, rank = rec.check_sources(None, None)  # every stage this model has
        if not rank:
            return
        batches = (rec.warmup_batches(rec.buckets.up_to(self.cfg.micro_batch) if rec.buckets is not None else (1,))
                   if rec.cuda_graphs != "off" else [[[{"item_id": int(ids[0])}]]])
        remote = self._remote_rank(eng, timeout=300.0)
        try:
            for batch in batches:
                eng.recommend_many(batch, k=10, beam_width=20, diversity_lambda=0.0, sources=sources, rank=True,
                                   remote_rank=remote)
        except RankingFailed as e:  # the model is loaded there; requests rank (or answer degraded) as they come
            log.warning("warming the ranking process's shapes failed: %s", e)

    def _ensure_pool(self, eng: Engine) -> KVPool:
        # the ranking process ranks on the pool's device (see genrec.serve.workers.ranker_main)
        spec = pool_spec_for(eng.cfg, self.cfg.kv_slots, eng.cfg.max_items,
                             device=str(eng.rec.device) if self.pool_on_gpu else "cpu")
        with self._pool_lock:
            if self.pool is not None and self.pool.spec == spec:
                return self.pool
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="genrec-serve-", dir=self.cfg.pool_dir)
            path = Path(self._tmp.name) / f"pool-{os.getpid()}-{time.monotonic_ns()}.json"
            old, self.pool = self.pool, KVPool.create(spec, path)
            if old is not None:  # a swapped-in model of another shape: free the old pool once in-flight work is done
                t = threading.Timer(max(30.0, 10 * self.cfg.rank_timeout_s), old.close)
                t.daemon = True
                t.start()
            self.metrics.pool_slots.set(spec.slots)
            return self.pool

    # ------------------------------------------------------------------ request paths (run in threads)
    def _source_ids(self, eng: Engine) -> SourceItemIds | None:
        """The served run's source-id translation (None: its ids are the tables' integers), which must be the
        kind of ids this app's request models were built for (:func:`genrec.serve.schemas.api_models`)."""
        if (eng.source_ids is not None) != self.source_ids:
            raise ConfigError(f"the served run's ids {'were' if eng.source_ids is not None else 'were not'} "
                              f"remapped (map_ids), the server started {'with' if self.source_ids else 'without'} "
                              "that: the tables were prepared again since it started; restart it")
        return eng.source_ids

    def _call(self, req: RecommendRequest) -> _Call:
        """What a recommend request runs on: the bundle (taken ONCE: the request finishes on this version), its
        history in the tables' ids, and the Engine's keyword arguments."""
        bundle = self.holder.current
        eng = bundle.engine
        hist: Any = req.the_history()  # plain dicts (HistoryItem is a TypedDict), or HistoryColumns
        ids, unknown = self._source_ids(eng), Unknown()
        if ids is not None:  # the source file's ids -> the tables' (once, here)
            hist = ids.history_in(hist, unknown)
        fusion = None if req.fusion is None else req.fusion.model_dump()
        kw: dict[str, Any] = dict(k=req.k, beam_width=req.beam_width, diversity_lambda=req.diversity_lambda,
                                  sources=req.sources, surface=req.surface, request_ts=req.request_ts, fusion=fusion,
                                  exclude_history=req.exclude_history)
        key = (id(eng), req.k, req.beam_width, req.diversity_lambda, tuple(req.sources), req.rank, req.surface,
               req.request_ts, None if fusion is None else tuple(sorted(fusion.items())), req.exclude_history)
        return _Call(bundle, eng, hist, ids, unknown, kw, key)

    @staticmethod
    def _finish(c: _Call, out: dict[str, Any], degraded: bool) -> dict[str, Any]:
        """The answer: the served version, ``degraded``, and the source file's ids where the run remapped them."""
        out.update(degraded=degraded, index_version=c.bundle.version)
        if c.ids is None:
            return out
        if "explain" in out:
            explain_ids_out(out["explain"], c.ids, c.unknown)
        return c.ids.answer_out(out, c.unknown)

    def recommend(self, req: RecommendRequest) -> dict[str, Any]:
        c = self._call(req)
        eng, hist, kw = c.engine, c.history, c.kw
        if req.explain:  # one history per call: never batched
            kw["explain"] = True
        remote = self._ranks_remotely(req.rank)
        if self.batcher is not None and not req.explain:
            overlap = self.cfg.host_overlap
            parsed = dropped = None
            if overlap:  # parse here, before queueing: the batch runs only the model (ServeConfig.host_overlap)
                with stage("parse"):
                    parsed, dropped = eng.read(hist)
            if overlap and parsed is None:
                out, degraded = eng.cold_start(dropped or [], req.k), False
            else:
                res, degraded = self.batcher.submit(c.key, parsed if overlap else hist,
                                                    self._batch_fn(eng, parsed=overlap, rank=req.rank, **kw))
                if overlap:
                    with stage("format"):
                        res = eng.answer(res)
                out = res
        elif not remote:
            out, degraded = eng.recommend(hist, rank=req.rank, **kw), False  # type: ignore[arg-type]
        else:
            out, degraded = self._remote_or_degraded(
                eng, lambda **r: eng.recommend(hist, **r, **kw), 1)  # type: ignore[arg-type]
        return self._finish(c, out, degraded)

    def submit_nowait(self, op: str, req: Any, done: Callable[[bool, Any], None]) -> bool:
        """Take ``req`` without a thread of its own where it can be (a recommend request the busy micro-batcher runs,
        not explained, without --host-overlap; in two-process mode ranked there): it joins the batcher
        (:meth:`MicroBatcher.submit_async`) and ``done(True, answer)`` or ``done(False, error)`` is called once, from
        the thread that ran its batch; True. Else False: run :meth:`infer` (in a thread). The answers are
        :meth:`infer`'s, stage timings in /metrics included. What the engine of ``--fronts`` does with each request
        a front sends (:class:`genrec.serve.fronts.EngineLink`)."""
        b = self.batcher
        if op != "recommend" or b is None or b.policy != "busy" or req.explain or self.cfg.host_overlap:
            return False
        try:
            c = self._call(req)
        except Exception as e:  # noqa: BLE001 - the request's own error, answered as infer would
            done(False, e)
            return True
        eng, rank, kw = c.engine, req.rank, c.kw

        def settle(fut: Future) -> None:
            try:
                out = self._finish(c, *fut.result())
                self._answered(op, out)
            except Exception as e:  # noqa: BLE001 - the batch's error for this request
                done(False, e)
                return
            done(True, out)

        b.submit_async(c.key, c.history, self._batch_fn(eng, parsed=False, rank=rank, **kw)).add_done_callback(settle)
        return True

    def _ranks_remotely(self, rank: bool) -> bool:
        """Whether a request that asks for ``rank`` is ranked in the ranking process (two-process mode)."""
        return self.cfg.two_process and rank

    def _batch_fn(self, eng: Engine, *, parsed: bool, rank: bool,
                  **kw: Any) -> Callable[[Sequence[Any]], Sequence[Any]]:
        """What the micro-batcher runs for a batch of requests: each one's (answer, degraded); ranked requests in
        two-process mode are ranked by the ranking process (:meth:`_batch_remote`)."""
        if self._ranks_remotely(rank):
            return lambda xs: self._batch_remote(eng, xs, parsed=parsed, **kw)
        return lambda xs: [(o, False) for o in self._batch(eng, xs, parsed=parsed, rank=rank, **kw)]

    def infer(self, op: str, req: Any) -> dict[str, Any]:
        """``recommend`` or ``rank`` (``op``) for a validated request, its stage timings into /metrics: what an
        inference route runs (in this process's thread, or for a front process, :mod:`genrec.serve.fronts`)."""
        out = self.recommend(req) if op == "recommend" else self.rank(req)
        self._answered(op, out)
        return out

    def _answered(self, op: str, out: dict[str, Any]) -> None:
        """An answer's stage timings into /metrics, and its tick of :class:`Refreeze`."""
        self.metrics.observe(op, out["timings_ms"])
        self.refreeze.tick()

    def _batch(self, eng: Engine, items: Sequence[Any], *, parsed: bool, **kw: Any) -> list[Any]:
        """One micro-batched forward, its size, wall time and time holding the model into /metrics: for parsed
        histories, their :class:`RecommendationList` (``Engine.run_many``); else for the requests' histories, their
        answers (``Engine.recommend_many``: parse, run, format)."""
        t0 = time.perf_counter()
        run = eng.run_many if parsed else eng.recommend_many
        if self._early_handover is not None and kw.get("remote_rank") is None:
            kw["on_lock"] = self._early_handover
        out = run(list(items), on_device=self.metrics.device_ms.observe, **kw)
        self.metrics.batch_ms.observe((time.perf_counter() - t0) * 1e3)
        self.metrics.batch_rows.observe(len(items))
        return out

    def _batch_remote(self, eng: Engine, items: Sequence[Any], **kw: Any) -> list[tuple[Any, bool]]:
        """A micro-batch of two-process ranked requests: one forward here, one ranking call for its rows (per
        half of the pool's slots); each result with whether it is ``degraded``."""
        outs, degraded = self._remote_or_degraded(eng, lambda **r: self._batch(eng, items, **r, **kw), len(items))
        return [(o, degraded) for o in outs]

    def _remote_or_degraded(self, eng: Engine, run: Callable[..., Any], n: int) -> tuple[Any, bool]:
        """``run(rank=True, remote_rank=...)`` (the ranking process ranks), and False; if that ranking fails, the
        retrieval-only ``run(rank=False)`` (re-encodes once: only on this degraded path) for the ``n`` requests, and
        True."""
        try:
            return run(rank=True, remote_rank=self._remote_rank(eng)), False
        except RankingFailed as e:
            log.warning("ranking failed, answering %d request(s) retrieval-only (degraded): %s", n, e)
            self.metrics.degraded.inc(n)
            return run(rank=False), True

    def _remote_rank(self, eng: Engine, timeout: float | None = None) -> Callable[..., torch.Tensor]:
        pool = self._ensure_pool(eng)
        ranker = self.ranker
        assert ranker is not None
        chunk = pool.spec.slots  # rows per ranking call: every slot (one ranking call leases at a time)

        def some(cache: Any, lo: int, hi: int, vecs: np.ndarray, sid: np.ndarray | None, surfaces: list[int],
                 request_ts: list[int] | None) -> torch.Tensor:
            """Rows lo..hi-1 of the batch, one slot each, ranked in one call. One call at a time holds slots (the
            pool never recycles a slot a call still reads); once the first part's rows are in the pool the
            micro-batcher starts the next batch, which encodes and retrieves while this one is ranked."""
            for _ in range(self.cfg.stale_retries + 1):
                with self._remote_lock:
                    leases = []
                    try:
                        for _ in range(hi - lo):
                            leases.append(pool.lease())
                        self.metrics.pool_occupancy.set(pool.occupancy())
                        pool.write_rows(leases, cache, lo)  # the one encode's KV, shared with the ranking process
                        if self.batcher is not None:
                            self.batcher.handover()
                        return torch.from_numpy(ranker.rank(pool, leases, eng.checkpoint, vecs[lo:hi],
                                                            None if sid is None else sid[lo:hi], surfaces[lo:hi],
                                                            None if request_ts is None else request_ts[lo:hi],
                                                            digest=eng.weights_digest, timeout=timeout))
                    except StaleSlotError:
                        self.metrics.stale.inc()  # a slot recycled under us (another process's lease): fresh slots
                    except RankerUnavailable as e:
                        raise RankingFailed(str(e)) from e
                    finally:
                        for lease in leases:
                            pool.release(lease)
                        self.metrics.pool_occupancy.set(pool.occupancy())
            raise RankingFailed(f"KV slot stale {self.cfg.stale_retries + 1} times")

        def remote(cache: Any, vecs: np.ndarray, sid: np.ndarray | None, surfaces: list[int],
                   request_ts: list[int] | None) -> torch.Tensor:
            b = cache.batch_size
            parts = [some(cache, lo, min(b, lo + chunk), vecs, sid, surfaces, request_ts) for lo in range(0, b, chunk)]
            return parts[0] if len(parts) == 1 else torch.cat(parts, 0)

        return remote

    def rank(self, req: RankRequest) -> dict[str, Any]:
        bundle = self.holder.current
        eng = bundle.engine
        t0 = time.perf_counter()
        hist: Any = req.the_history()
        cands: Any = req.candidates
        ids, unknown = self._source_ids(eng), Unknown()
        if ids is not None:  # the source file's ids -> the tables' (once, here)
            hist, cands = ids.history_in(hist, unknown), ids.ids_in(cands, unknown)
        fusion = None if req.fusion is None else req.fusion.model_dump()
        out = eng.rank_items(hist, cands, req.surface, req.request_ts, fusion=fusion, beam_width=req.beam_width,
                             diversity_lambda=req.diversity_lambda)
        if ids is not None:
            ids.answer_out(out, unknown)
        ms = (time.perf_counter() - t0) * 1e3
        out.update(index_version=bundle.version, timings_ms={"rank": ms, "total": ms})
        return out

    def reload(self) -> dict[str, Any]:
        res = self.holder.reload()
        self.metrics.reloads.labels(outcome="ok" if res["ok"] else "failed").inc()
        if res["ok"]:
            self.metrics.set_version(self.holder.current.version)
            if self.cfg.gc_freeze and res.get("swapped"):
                thaw_and_freeze()
        return res
