"""The serving engine: :class:`genrec.infer.recommender.Recommender` behind the service (issue 6 item 2).

The Recommender does ONE history prefill, then SID beams (over the cache) + ANN (user vector) and
L1 ranking on the same cache (UniPinRec §3.3, PinGER decoding). This adapter adds what the
service needs around it:

* the input policy's last cases: a history with no known item is a cold start (popularity list,
  not an error); the Recommender's ``DataError``/``ConfigError`` become :class:`InputError` (422
  naming the field);
* a **remote ranking hook**: in two-process mode the request's ranking stage (the funnel's
  :data:`~genrec.infer.funnel.Scorer`, no copy of the Recommender) is a call that writes the history
  KV into the shared pool and asks the ranking process — so the retrieval half runs unchanged and
  the one encode is kept. A dead ranker gives retrieval-only results (``degraded``);
* each request's history is parsed once (:meth:`genrec.infer.history.HistoryParser.read`: the rows,
  or a cold start).

Non-standard: the engine is immutable once built; hot swap replaces it whole (:mod:`genrec.serve.swap`).
Checkpoint weights are read through safetensors only (no pickle).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file

from genrec.catalog import open_store
from genrec.errors import ConfigError, DataError, GenrecError
from genrec.infer.calls import start_parsed
from genrec.infer.funnel import Scorer
from genrec.infer.history import HistoryColumns
from genrec.infer.profile import stage
from genrec.infer.recommender import Recommender
from genrec.infer.results import RecommendationList
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel
from genrec.model.kv_cache import KVCache
from genrec.serve.explain import Trace, explain_block, traced
from genrec.serve.ids import SourceItemIds
from genrec.workdir import read_json

RemoteRank = Callable[[KVCache, np.ndarray, np.ndarray | None, list[int], list[int] | None], torch.Tensor]
"""(cache [B, ...], cand vecs [B, m, Di], cand SID codes [B, m, L] or None, surfaces [B], request_ts [B] or None)
-> logits [B, m, C]."""


class InputError(GenrecError):
    """A request field is invalid (the HTTP layer turns it into a 422 naming ``field``)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(f"{field}: {message}")
        self.message, self.field = message, field

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole: a front process (--fronts) answers the same 422
        return (type(self), (self.message, self.field))


class RankingFailed(GenrecError):
    """The remote ranking stage failed (ranker down / timed out / slot stale after retries)."""


def load_model(ckpt: str | Path, device: str = "cpu", digest: str | None = None) -> GenRecModel:
    """The :class:`GenRecModel` of a training checkpoint folder, weights via safetensors (eval mode).
    ``digest``: the sha256 the weights file must have (the served bundle's); bytes that differ -- the
    file replaced since the server loaded it -- raise :class:`ConfigError` rather than pair one model's
    cache with another's weights."""
    ckpt = Path(ckpt)
    cfg_path = ckpt / "config.json"
    if cfg_path.exists() and "model" in read_json(cfg_path):
        mdict = read_json(cfg_path)["model"]
    else:
        extra = read_json(ckpt / "extra.json")
        if "model_config" not in extra:
            raise ConfigError(f"{ckpt}: no model config in config.json or extra.json (not a genrec checkpoint)")
        mdict = extra["model_config"]
    model = GenRecModel(ModelConfig.from_dict(mdict))
    if digest is None:
        state = load_file(str(ckpt / "model.safetensors"), device="cpu")
    else:
        data = (ckpt / "model.safetensors").read_bytes()  # hashed and parsed from the same bytes
        if (got := hashlib.sha256(data).hexdigest()) != digest:
            raise ConfigError(f"{ckpt / 'model.safetensors'}: its weights changed since the server loaded them "
                              f"(sha256 {got[:12]}, served {digest[:12]}); reload the server (/admin/reload or SIGHUP)")
        state = load_bytes(data)
    own = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")} or state
    model.load_state_dict(own, strict=True)
    return model.to(device).eval()


def _fusion_kw(fusion: Mapping[str, float | None] | None) -> dict[str, float | None]:
    f = fusion or {}
    return {k: f.get(k) for k in ("action_weight", "retrieval_weight", "sid_weight", "transition_weight",
                                  "history_weight")}


def _input_error(e: Exception) -> InputError:
    fld = getattr(e, "field", None) or "body"
    msg = str(e)
    return InputError(msg.split(": ", 1)[-1] if msg.startswith(fld) else msg, fld)


class Engine:
    """A loaded Recommender + popularity fallback; ``version`` = checkpoint (name @ fingerprint) + SID version."""

    def __init__(self, rec: Any, pop_rank: np.ndarray, source_ids: SourceItemIds | None = None, *,
                 tables_version: str | None = None, trained_on: Mapping[str, Any] | None = None) -> None:
        self.rec = rec
        # the tables read at load (popularity, titles) and what the checkpoint was trained on (its extra.json)
        self.tables_version = tables_version
        self.trained_on = dict(trained_on or {})
        # a run whose ids were remapped: the source file's ids, which the service speaks (None: the tables' ints)
        self.source_ids = source_ids
        self.cfg: ModelConfig = rec.config
        self.pop_rank = np.asarray(pop_rank, dtype=np.int64)  # [N] each row's place by interactions (0 = most)
        self.popular = np.argsort(self.pop_rank, kind="stable")[:1000]  # the cold-start list, most interacted first
        self.checkpoint: Path = rec.checkpoint
        self.weights_digest: str | None = rec.weights_digest  # the ranking process checks it
        self.fingerprint: str | None = rec.fingerprint
        self.sid_version: str | None = rec.sid_version
        self.context_len = int(rec.context_len)
        self._leaf_t: torch.Tensor | None = None  # rec.leaf_rows on the trie's device (explained requests)
        self._model = threading.Lock()  # one micro-batch runs the model at a time (run_many)

    @classmethod
    def load(cls, workdir: str | Path, checkpoint: str | Path | None = None, device: str = "cpu", *,
             max_batch: int = 1, warm_beams: Sequence[int] = (20,)) -> "Engine":
        """The engine of WORKDIR's checkpoint; on a GPU the CUDA graphs of the common shapes are captured before
        it serves (no-op on a CPU): batches of 1 and, with batch buckets, of each bucket up to ``max_batch``
        (the server's micro-batch), at each SID beam width of ``warm_beams``."""
        rec = Recommender.from_checkpoint(workdir, checkpoint, device=device)
        sizes = rec.buckets.up_to(max_batch) if rec.buckets is not None else (1,)
        for width in dict.fromkeys(warm_beams):
            rec.warmup(batch_sizes=sizes, beam_width=int(width))
        store = open_store(workdir)
        ev = store.read_events(columns=["item_id"]).column("item_id").to_numpy()
        rows = rec.catalog.rows(ev, strict=False)
        counts = np.bincount(rows[rows >= 0], minlength=len(rec.catalog))
        order = np.argsort(-counts, kind="stable")
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        extra_path = Path(rec.checkpoint) / "extra.json" if rec.checkpoint is not None else None
        extra = read_json(extra_path) if extra_path is not None and extra_path.exists() else {}
        trained_on = {"tables": extra.get("tables"), "sid": extra.get("sid_version"),
                      "init_from": extra.get("init_from")}
        return cls(rec, rank, SourceItemIds.of(workdir, rec.catalog.item_ids), tables_version=store.tables_version,
                   trained_on=trained_on)

    @property
    def version(self) -> str:
        """``<checkpoint>@<fingerprint>+<tables version>+<SID version>``, and ``+l1-a<a>-w<w>-v<v>`` when the
        checkpoint has stored fusion weights (``genrec fusion tune``): a new choice is a new version, so a reload
        swaps it in. The fingerprint hashes the weights as loaded and the item features' manifest, so weights or
        features replaced in place (same folder name) are a new version too; the tables version
        (``<namespace>.<data version>``, :attr:`genrec.data.store.TableStore.tables_version`) is the one read at
        load, so a ``genrec data append`` is a new version as well."""
        ck = self.checkpoint.name if self.checkpoint is not None else "model"
        if self.fingerprint:
            ck += f"@{self.fingerprint}"
        if self.tables_version:
            ck += f"+{self.tables_version}"
        v = f"{ck}+{self.sid_version}" if self.sid_version else ck
        if self.rec.fusion_path is not None:
            f = self.rec.fusion
            v += f"+l1-a{f.action_weight:g}-w{f.retrieval_weight:g}-v{f.sid_weight:g}"
            if f.transition_weight > 0:  # older versions' strings stay as they were
                v += f"-t{f.transition_weight:g}"
            if f.history_weight != 0:
                v += f"-h{f.history_weight:g}"
        return v

    def versions(self, workdir: str | Path | None = None) -> dict[str, Any]:
        """What this bundle serves, for ``/readyz``: the checkpoint (its path, relative to ``workdir`` when inside
        it, and its weights' sha256), the tables version and SID version served, and the tables and SID versions
        the checkpoint was trained on (with the checkpoint it was warm-started from)."""
        ck = Path(self.checkpoint) if self.checkpoint is not None else None
        where = str(ck) if ck is not None else None
        if ck is not None and workdir is not None and ck.resolve().is_relative_to(Path(workdir).resolve()):
            where = str(ck.resolve().relative_to(Path(workdir).resolve()))
        return {"checkpoint": where, "weights_sha256": self.weights_digest, "tables": self.tables_version,
                "sid": self.sid_version, "trained_on": dict(self.trained_on)}

    # ------------------------------------------------------------------ recommend
    def cold_start(self, dropped: list[int], k: int) -> dict[str, Any]:
        rows = self.popular[:k]
        cat = self.rec.catalog
        items = [{"item_id": int(cat.item_ids[r]), "score": 1.0 / (1.0 + j), "action_probs": None,
                  "sid": None if self.rec.codes is None else [int(c) for c in self.rec.codes[int(r)].tolist()],
                  "sources": ["popular"]} for j, r in enumerate(rows)]
        return {"items": items, "dropped_items": dropped, "truncated_items": 0, "cold_start": True,
                "timings_ms": {"encode": 0.0, "sid": 0.0, "ann": 0.0, "rank": 0.0, "total": 0.0}}

    def recommend(self, history: Sequence[Mapping[str, Any]], *, k: int, beam_width: int, diversity_lambda: float,
                  sources: Sequence[str], rank: bool, surface: Any = None, request_ts: int | None = None,
                  remote_rank: RemoteRank | None = None, fusion: Mapping[str, float | None] | None = None,
                  exclude_history: bool = False, explain: bool = False) -> dict[str, Any]:
        """One encode -> SID + ANN -> ranking (locally, or through ``remote_rank``). ``fusion``: the
        request's L1 weights (``action_weight`` / ``retrieval_weight`` / ``sid_weight`` / ``transition_weight`` /
        ``history_weight``;
        None or a missing key: the served checkpoint's). ``exclude_history``: none of the history's items back
        (the whole history given, as :meth:`Recommender.recommend`). ``explain``: the answer also holds
        ``explain``, what each stage found (:mod:`genrec.serve.explain`; the tables' ids)."""
        sent = history
        with stage("parse"):
            parsed, dropped = self.read(history)
        if parsed is None:
            out = self.cold_start(dropped, k)
            if explain:
                out["explain"] = explain_block(self.rec, None, sent, [it["item_id"] for it in out["items"]])
            return out
        rec = self.rec
        scorer = self._remote_scorer(remote_rank) if remote_rank is not None and rank else None
        trace = None
        if explain:
            trace = Trace()
            rec = traced(rec, trace, self._leaf_rows())
        res = self._run(rec, [parsed], k=k, beam_width=beam_width, diversity_lambda=diversity_lambda,
                        sources=sources, rank=rank, surface=surface, request_ts=request_ts, fusion=fusion,
                        exclude_history=exclude_history, scorer=scorer)()[0]
        with stage("format"):
            out = self.answer(res)
        if trace is not None:
            out["explain"] = explain_block(self.rec, trace, sent, [r.item_id for r in res])
        return out

    def read(self, history: Sequence[Any]) -> tuple[dict[str, Any] | None, list[int]]:
        """The request's one parse (:meth:`genrec.infer.history.HistoryParser.read`); input errors -> 422."""
        try:
            return self.rec.history.read(history)
        except (DataError, ConfigError) as e:
            raise _input_error(e) from e

    def _remote_scorer(self, remote_rank: RemoteRank) -> Scorer:
        """The ranking stage as ``remote_rank`` runs it (every row of the batch in one call; in place of the
        Recommender's ``score_candidates``, without a copy of the Recommender)."""
        rec = self.rec

        def score_candidates(cache: KVCache, rows: torch.Tensor, vecs: torch.Tensor | None = None,
                             surface: torch.Tensor | None = None, request_ts: torch.Tensor | None = None
                             ) -> torch.Tensor:
            b = rows.shape[0]
            v = (rec.item_vecs[rows] if vecs is None else vecs).float().cpu().numpy()  # [B, m, Di]
            sid = None if rec.codes is None else rec.codes[rows].cpu().numpy()  # [B, m, L]
            s = [0] * b if surface is None else [int(x) for x in surface.reshape(-1).tolist()]
            ts = None if request_ts is None else [int(x) for x in request_ts.reshape(-1).tolist()]
            return remote_rank(cache, v, sid, s, ts).to(rec.device)  # [B, m, C]

        return score_candidates

    @staticmethod
    def _run(rec: Any, parsed: list[dict[str, Any]], *, fusion: Mapping[str, float | None] | None,
             sources: Sequence[str], **kw: Any) -> Callable[[], list[RecommendationList]]:
        """Parsed histories through ``rec``'s model now, their answers' lists when the result is called
        (:func:`genrec.infer.calls.start_parsed`); input errors -> 422."""
        try:
            fw: dict[str, Any] = _fusion_kw(fusion)
            return start_parsed(rec, parsed, sources=list(sources), **kw, **fw)
        except (DataError, ConfigError) as e:
            raise _input_error(e) from e

    def _leaf_rows(self) -> torch.Tensor | None:
        """The catalogue row of each SID-trie leaf on the trie's device (None: no SID stage)."""
        rec = self.rec
        if self._leaf_t is None and rec.trie is not None and rec.leaf_rows is not None:
            self._leaf_t = torch.as_tensor(np.asarray(rec.leaf_rows, dtype=np.int64), device=rec.trie.device)
        return self._leaf_t

    def recommend_many(self, histories: Sequence[Sequence[Mapping[str, Any]]], *, k: int, beam_width: int,
                       diversity_lambda: float, sources: Sequence[str], rank: bool, surface: Any = None,
                       request_ts: int | None = None, fusion: Mapping[str, float | None] | None = None,
                       exclude_history: bool = False, remote_rank: RemoteRank | None = None,
                       on_device: Callable[[float], None] | None = None,
                       on_lock: Callable[[], None] | None = None) -> list[dict[str, Any]]:
        """Micro-batched :meth:`recommend`: each history parsed (:meth:`read`), the known ones through ONE
        :meth:`run_many` (``on_device``: its time holding the model), each answer formatted (:meth:`answer`). A
        server with ``host_overlap`` does the three apart: a request parses and formats in its own thread, its batch
        only runs the model (:class:`genrec.serve.service.Service`)."""
        outs: list[dict[str, Any] | None] = [None] * len(histories)
        warm: list[int] = []
        parsed: list[dict[str, Any]] = []
        with stage("parse"):
            for i, h in enumerate(histories):
                p, dropped = self.read(h)  # each its own request's "history"
                if p is None:
                    outs[i] = self.cold_start(dropped, k)
                else:
                    warm.append(i)
                    parsed.append(p)
        if warm:
            res = self.run_many(parsed, k=k, beam_width=beam_width, diversity_lambda=diversity_lambda, sources=sources,
                                rank=rank, surface=surface, request_ts=request_ts, fusion=fusion,
                                exclude_history=exclude_history, remote_rank=remote_rank, on_device=on_device,
                                on_lock=on_lock)
            with stage("format"):
                for i, r in zip(warm, res):
                    outs[i] = self.answer(r)
        return outs  # type: ignore[return-value]

    def run_many(self, parsed: list[dict[str, Any]], *, k: int, beam_width: int, diversity_lambda: float,
                 sources: Sequence[str], rank: bool, surface: Any = None, request_ts: int | None = None,
                 fusion: Mapping[str, float | None] | None = None, exclude_history: bool = False,
                 remote_rank: RemoteRank | None = None, on_device: Callable[[float], None] | None = None,
                 on_lock: Callable[[], None] | None = None) -> list[RecommendationList]:
        """ONE padded prefill / beam search / ANN / ranking for parsed histories (:meth:`read`; in static shapes on
        a GPU: :mod:`genrec.infer.buckets`; the ranking through ``remote_rank``, one call for the batch, in
        two-process mode). Ranked here, it holds the engine's model lock: one batch runs at a time, whatever
        thread calls; the answers' lists are built after the lock is let go (host work: the next batch runs
        meanwhile). ``on_device`` gets its wall time (ms) under the lock; ``on_lock`` is called once it is held."""
        scorer = self._remote_scorer(remote_rank) if remote_rank is not None and rank else None
        with self._model if remote_rank is None else contextlib.nullcontext():
            t0 = time.perf_counter()
            if on_lock is not None:
                on_lock()
            answers = self._run(self.rec, parsed, k=k, beam_width=beam_width, diversity_lambda=diversity_lambda,
                                sources=sources, rank=rank, surface=surface, request_ts=request_ts, fusion=fusion,
                                exclude_history=exclude_history, scorer=scorer)
            if on_device is not None:
                on_device((time.perf_counter() - t0) * 1e3)
        return answers()

    @staticmethod
    def answer(res: Any) -> dict[str, Any]:
        """A request's answer (the response's fields) from its :class:`RecommendationList`."""
        t = res.timings_ms
        return {
            "items": [{"item_id": r.item_id, "score": r.score, "action_probs": r.action_probs,
                       "sid": None if r.sid is None else list(r.sid), "sources": list(r.sources)} for r in res],
            "dropped_items": res.dropped_items, "truncated_items": res.history_truncated,
            "timings_ms": {"encode": t.get("encode", 0.0), "sid": t.get("sid", 0.0), "ann": t.get("ann", 0.0),
                           "rank": t.get("rank", 0.0), "total": t.get("total", 0.0)},
        }

    # ------------------------------------------------------------------ rank given candidates
    def cold_rank(self, dropped: list[int], item_ids: Sequence[int], surface: Any = None) -> dict[str, Any]:
        """``/v1/rank`` for a history with no known item: the known candidates, most interacted first
        (ties keep the request's order), scored ``1 / (1 + place in the popularity order)`` like the
        cold-start list of :meth:`recommend`."""
        rec = self.rec
        if surface is not None:  # still a 422 when the request names a surface the model lacks
            try:
                rec.vocab_index(surface, rec.surfaces, "surface", "surface")
            except (DataError, ConfigError) as e:
                raise _input_error(e) from e
        ids = np.asarray(list(item_ids), dtype=np.int64)
        rows = rec.catalog.rows(ids, strict=False)
        ok = np.flatnonzero(rows >= 0)
        ranks = self.pop_rank[rows[ok]]
        by = np.argsort(ranks, kind="stable")
        items = [{"item_id": int(ids[ok[j]]), "score": 1.0 / (1.0 + float(ranks[j])), "action_probs": None}
                 for j in by]
        return {"items": items, "unknown_candidates": [int(i) for i in ids[rows < 0]], "dropped_items": dropped,
                "truncated_items": 0, "cold_start": True}

    def rank_items(self, history: Sequence[Mapping[str, Any]], item_ids: Sequence[int], surface: Any = None,
                   request_ts: int | None = None, fusion: Mapping[str, float | None] | None = None,
                   beam_width: int = 20, diversity_lambda: float = 0.0) -> dict[str, Any]:
        """``/v1/rank``: the known candidates by the L1 score ``/v1/recommend`` ranks by (the same ``fusion``
        weights; :meth:`Recommender.rank_items`), best first, ties in the request's order. A history with no
        known item is a cold start, as in :meth:`recommend`: the known candidates in order of interactions in
        the training data, without action probabilities (:meth:`cold_rank`)."""
        dropped, any_known, _ = self.rec.history.screen(history)
        if not any_known:
            return self.cold_rank(dropped, item_ids, surface)
        try:
            given = history if isinstance(history, HistoryColumns) else list(history)
            res = self.rec.rank_items(given, item_ids, surface=surface, request_ts=request_ts,
                                      beam_width=beam_width, diversity_lambda=diversity_lambda, **_fusion_kw(fusion))
        except (DataError, ConfigError) as e:
            raise _input_error(e) from e
        return {"items": [{"item_id": r.item_id, "score": r.score, "action_probs": r.action_probs} for r in res],
                "unknown_candidates": res.unknown_items, "dropped_items": res.dropped_items,
                "truncated_items": res.history_truncated}
