"""The serving-side Recommender: L0 retrieval (SID beams + ANN) and L1 ranking on ONE history encode.

Follows UniPinRec §3.3 (L0 over-retrieval by a factor r, then L1 ranking by the action heads on
the same backbone) and PinGER's decoding section (diverse, trie-constrained SID beams). What is
non-standard here:

* **One prefill for every stage.** ``GenRecModel.encode_history`` fills a KV cache once; the SID
  beam steps (``sid_logits_next``), the ANN query (the user vector it returns) and the L1 ranking
  (``rank``: candidates with action [MASK] attend to the cached history, not to each other -- the
  M-FALCON rule) all read that cache. Because candidates never see each other, a candidate's
  score does not depend on which other candidates are in the union.
* **Ranking reuses the retrieval representation.** ANN candidates come with the vectors the
  Faiss index stores (``search_and_reconstruct``); SID-only candidates take the same vectors from
  the in-memory item-vector table the index was built from.
* **Utility.** The L1 score is ``sum_c u_c * sigmoid(logit_c)``; by default ``u_c = 1`` for the
  dataset's positive actions, ``-1`` for known negative actions (``dislike``, ``skip``, ...), 0
  otherwise.
* With ``rank=False`` the union is ordered by round-robin over the source lists (SID beam order,
  then ANN order, alternating), score = 1 / (1 + merged position); a single source keeps its own
  order and score (beam log-probability, or inner product).

Public API (kept stable for ``genrec.serve``)::

    rec = Recommender.from_checkpoint(workdir, checkpoint=None, device="cpu")
    recs = rec.recommend(history, k=10, beam_width=20, diversity_lambda=0.0, sources=("sid", "ann"),
                         rank=True, overretrieve=3, utility=None, exclude_history=False)
    recs[0].item_id, recs[0].score, recs[0].sources, recs[0].sid, recs[0].action_probs
    recs.timings_ms, recs.dropped_items, recs.history_used
    ranked = rec.rank_items(history, [12, 7, 99], action_weight=None, ...)  # given candidates, best first

``history`` is a list of ``{"item_id": int, "action"?: str|int, "surface"?: str|int, "ts"?: int}``
(or bare item ids), oldest first; a list of such lists is a batch and returns a list of results.

The jobs live beside this module: loading a run (:mod:`genrec.infer.load`), reading histories
(:mod:`genrec.infer.history`), the funnel's steps (:mod:`genrec.infer.funnel`), the result types
(:mod:`genrec.infer.results`) and a run's users as the commands see them (:mod:`genrec.infer.cases`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genrec.catalog import ItemCatalog
from genrec.decode.graphs import GraphedBeamSearch
from genrec.decode.prefix import PrefixLeaves
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError, DataError
from genrec.infer import calls
from genrec.infer.ann import AnnConfig, AnnIndex, DeviceFlatSearch, device_search
from genrec.infer.buckets import HistoryBuffers, ShapeBuckets, resolve_buckets
from genrec.infer.catalog_model import CatalogModel
from genrec.infer.funnel import Scorer, run_funnel
from genrec.infer.fusion import FusionWeights, fusion_file, load_fusion_record, save_fusion, transition_file
from genrec.infer.history import HistoryColumns, HistoryParser, vocab_index
from genrec.infer.load import fingerprint, graph_mode, load_or_build_ann, open_run, resolve_precision, resolve_sid_mode
from genrec.infer.profile import stage
from genrec.infer.results import SOURCES, BatchResult, RankedList, RecommendationList
from genrec.infer.sid_stage import SidStage
from genrec.infer.transitions import TransitionTable
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel, ModelBatch
from genrec.model.graphs import GraphedEncoder, GraphedRanker
from genrec.model.kv_cache import KVCache
from genrec.validation import trusted_inputs

__all__ = ["NEGATIVE_ACTIONS", "Recommender", "action_utility"]

log = logging.getLogger(__name__)

NEGATIVE_ACTIONS = frozenset({"dislike", "skip", "hide", "report", "negative", "unlike", "block"})


def action_utility(actions: Sequence[str], positive_actions: Sequence[str]) -> dict[str, float]:
    """+1 for the dataset's positive actions, -1 for known negative ones (e.g. 'dislike'), 0 for the rest."""
    return {a: (1.0 if a in positive_actions else -1.0 if a.lower() in NEGATIVE_ACTIONS else 0.0) for a in actions}


class Recommender(SidStage):
    """A trained model with its catalogue, SID trie / index and ANN index, ready to serve."""

    def __init__(self, catalog_model: CatalogModel, catalog: ItemCatalog, *, actions: list[str],
                 positive_actions: list[str], surfaces: list[str], ann: AnnIndex | DeviceFlatSearch | None,
                 trie: TorchTrie | None = None, sid_index: Any = None, step: int = -1,
                 checkpoint: Path | None = None, run_config: dict[str, Any] | None = None,
                 device: str | torch.device = "cpu") -> None:
        self.catalog_model = catalog_model  # the model + the catalogue tensors (offline evaluation reads them)
        self.model: GenRecModel = catalog_model.model
        self.model.eval()
        self.config: ModelConfig = self.model.config
        self.catalog = catalog
        self.actions, self.positive_actions, self.surfaces = list(actions), list(positive_actions), list(surfaces)
        self.ann = ann  # the index, or its search on the GPU (from_checkpoint: infer.ann.device_search)
        self.trie = trie
        self.sid_index = sid_index
        self.step = step
        self.checkpoint = checkpoint
        self.precision = "float32"  # "bf16": autocast on CUDA (see from_checkpoint)
        # the L1 score fusion used when a call does not name its weights: UniPinRec's L1 (heads only)
        # unless `genrec fusion tune` stored a choice for this checkpoint (see from_checkpoint)
        self.fusion = FusionWeights()
        self.fusion_path: Path | None = None
        self.fusion_utility: dict[str, float] | None = None  # the utility the stored weights were chosen with
        self.transitions: TransitionTable | None = None  # the L1 transition term's table (served with the weights)
        self.workdir: Path | None = None  # the run directory (from_checkpoint)
        self.sid_version: str | None = None  # the SID version loaded beside the weights
        # sha256 of the checkpoint's model.safetensors as loaded, and a short fingerprint of it and the item
        # features (from_checkpoint): weights or features replaced in place are a new served version
        self.weights_digest: str | None = None
        self.fingerprint: str | None = None
        self.run_config = run_config or {}
        self.device = torch.device(device)
        self.context_len = self.config.max_items - 1
        self.history = HistoryParser(catalog, self.actions, self.positive_actions, self.surfaces, self.context_len)
        self.leaf_rows: np.ndarray | None = None  # catalogue row of each SID-trie leaf (beams -> rows)
        # per leaf: the model has a trained last-level logit for it (None: every code inside its head); items
        # `genrec sid assign` added since training have none and are reached through their prefix
        self.known_leaves: np.ndarray | None = None
        self.sid_mode = "auto"  # the SID stage's retrieval (infer.load.resolve_sid_mode; from_checkpoint sets it)
        self.device_funnel: str | None = None  # off / auto / on (None: $GENREC_DEVICE_FUNNEL): infer.device_funnel
        self.device_table: tuple[Any, Any] | None = None  # the last transition table, its device copy: device_funnel
        # the device funnel takes the encoder graph's plans as holding and checks them with its answers; False once
        # they did not (then every batch waits for the verdict, as the host path does): infer.device_funnel
        self.speculate_plans = True
        self._utility_vectors: dict[tuple[float, ...], torch.Tensor] = {}  # utility_vector's, by weights
        self._leaves: tuple[Any, Any, PrefixLeaves] | None = None  # (leaf_rows, known_leaves) -> device copy
        self._leaf_t: torch.Tensor | None = None  # leaf_rows on the trie's device (beam_rows)
        self._leaf_src: np.ndarray | None = None  # the leaf_rows _leaf_t was made from
        # CUDA graphs on a GPU: GENREC_CUDA_GRAPHS = "all" (default; "1" too): the history encode,
        # the SID beam search and the ranking decode; "sid": the SID beam search; "off" ("0"): eager
        self.cuda_graphs = graph_mode(self.device)
        # batches padded to static shapes (infer.buckets): "auto" ($GENREC_BATCH_BUCKETS) pads when graphs replay
        self.buckets: ShapeBuckets | None = resolve_buckets(None, graphed=self.cuda_graphs != "off")
        self._buffers = HistoryBuffers(self.device)  # the batches' host arrays, reused (pinned on CUDA)
        self._graphed: GraphedBeamSearch | None = None
        self._graphed_encode: GraphedEncoder | None = None
        self._graphed_rank: GraphedRanker | None = None
        self._beam_graph: bool | None = None  # the beams replay graphs (False: their static shapes run eagerly)
        self._beam_graphs = 16  # their graph cache's size
        if self.cuda_graphs != "off":
            self.use_graphs(stages=("encode", "sid", "rank") if self.cuda_graphs == "all" else ("sid",))
        self.item_vecs = catalog_model.all_catalogue_vectors()  # [N, D]: what the ANN index holds
        self.codes: torch.Tensor | None = catalog_model.codes if self.config.uses_sids else None  # [N, L]

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_checkpoint(cls, workdir: str | Path, checkpoint: str | Path | None = None,
                        device: str | torch.device = "cpu", *, ann_config: AnnConfig | None = None,
                        precision: str | None = None, sid_mode: str | None = None) -> "Recommender":
        """Load WORKDIR's model (``checkpoint``: None = BEST if marked else LATEST; else a name -- best, last,
        a step number, a folder name under ``WORKDIR/checkpoints`` -- or a path:
        :func:`~genrec.infer.load.find_checkpoint`), catalogue, current SIDs (trie on ``device``) and the ANN
        index (built once per checkpoint and cached atomically under ``WORKDIR/ann/``). ``precision``:
        "float32" or "bf16" (autocast on CUDA; no effect on CPU); None = ``$GENREC_PRECISION``,
        else float32 -- the server's ``--precision`` sets that variable for all its processes. ``sid_mode``:
        the SID stage's retrieval (:func:`genrec.infer.load.resolve_sid_mode`; None = ``$GENREC_SID_MODE``,
        else "auto"), set by the server's ``--sid-mode`` likewise."""
        run = open_run(workdir, checkpoint, device)
        wd, ckpt = run.workdir, run.checkpoint
        rec = cls(run.catalog_model, run.catalog, actions=run.actions, positive_actions=run.positive_actions,
                  surfaces=run.surfaces, ann=None, trie=run.trie, sid_index=run.sid_index, step=run.step,
                  checkpoint=ckpt, run_config=run.run_config, device=device)
        rec.leaf_rows, rec.known_leaves = run.leaf_rows, run.known
        rec.sid_mode = resolve_sid_mode(sid_mode)
        rec.weights_digest = run.weights_digest
        # the weights as loaded, not as now
        rec.fingerprint = fingerprint([wd.features / "manifest.json"], first=run.weights_digest)
        rec.precision = resolve_precision(precision)
        if rec.model.user_head is not None:
            rec.ann = device_search(load_or_build_ann(wd, ckpt, ann_config or AnnConfig(), step=rec.step,
                                                      fp=rec.fingerprint, item_vecs=rec.item_vecs, catalog=rec.catalog),
                                    rec.device)
        rec.workdir, rec.sid_version = wd.root, run.sid_version
        fpath = fusion_file(wd.root, ckpt, run.sid_version)
        stored = load_fusion_record(fpath, rec.actions, rec.served_sid_mode)
        tpath = transition_file(fpath)
        if stored is not None and stored[0].transition_weight > 0 and not tpath.exists():
            log.warning("%s: the fusion weights use transitions but %s is missing: not applied (run `genrec fusion "
                        "tune` again)", fpath, tpath)
        elif stored is not None:  # chosen on validation for exactly these weights and SIDs
            rec.fusion, rec.fusion_utility = stored
            rec.fusion_path = fpath
            if tpath.exists():
                rec.transitions = TransitionTable.load(tpath)
        return rec

    def store_fusion(self, weights: FusionWeights, utility: Mapping[str, float], meta: dict[str, Any],
                     transitions: TransitionTable | None = None) -> Path:
        """Keep ``weights`` (chosen on validation under ``utility``) for this checkpoint and SID
        version -- ``WORKDIR/fusion/``, written atomically -- and use them from now on; with ``transitions``
        (the table of every event, served with a transition weight) written beside them first."""
        if self.workdir is None or self.checkpoint is None:
            raise ConfigError("store_fusion: this Recommender was not loaded from a run directory")
        if weights.transition_weight > 0 and transitions is None:
            raise ConfigError("store_fusion: a transition weight needs the transition table to serve with it")
        if transitions is not None:
            transitions.save(transition_file(fusion_file(self.workdir, self.checkpoint, self.sid_version)))
            self.transitions = transitions
        path = save_fusion(fusion_file(self.workdir, self.checkpoint, self.sid_version), weights,
                           {**meta, "chosen_on": {**meta.get("chosen_on", {}), "utility": dict(utility)},
                            "checkpoint": str(self.checkpoint), "step": self.step, "sid_version": self.sid_version})
        self.fusion, self.fusion_path, self.fusion_utility = weights, path, dict(utility)
        return path

    # ------------------------------------------------------------------ input
    @property
    def split_kind(self) -> str:
        """The split the model was trained with (``data.split``: "loo" or "temporal"), which its
        evaluation cases follow."""
        return str(((self.run_config or {}).get("data") or {}).get("split", "loo"))

    def default_utility(self) -> dict[str, float]:
        """The utility stored with the fusion weights (``genrec fusion tune``), else
        :meth:`action_utility`."""
        if self.fusion_utility is not None:
            return dict(self.fusion_utility)
        return self.action_utility()

    def action_utility(self) -> dict[str, float]:
        """:func:`action_utility` of the run's actions."""
        return action_utility(self.actions, self.positive_actions)

    def utility_vector(self, utility: Mapping[str, float] | None) -> torch.Tensor:
        """The utility's weight per action ``[C]`` on the model's device (read-only: one tensor per distinct utility
        is kept, so that a request does not wait on a host->device copy; at most 64, then they start again)."""
        u = self.default_utility() if utility is None else dict(utility)
        unknown = sorted(set(u) - set(self.actions))
        if unknown:
            raise ConfigError(f"utility: unknown action(s) {unknown}; the actions are {self.actions}")
        key = tuple(float(u.get(a, 0.0)) for a in self.actions)
        vec = self._utility_vectors.get(key)  # one lookup: another request thread may clear the memo meanwhile
        if vec is None:
            if len(self._utility_vectors) >= 64:
                self._utility_vectors.clear()
            vec = self._utility_vectors[key] = torch.tensor(key, dtype=torch.float32, device=self.device)
        return vec

    vocab_index = staticmethod(vocab_index)  # action / surface name or index -> index (DataError naming ``where``)

    def parse_history(self, history: Sequence[Any], where: str = "history") -> dict[str, Any]:
        """One history -> catalogue rows / actions / surfaces / timestamps (newest ``context_len`` kept):
        :meth:`genrec.infer.history.HistoryParser.parse`."""
        return self.history.parse(history, where)

    def parse_history_reference(self, history: Sequence[Any], where: str = "history") -> dict[str, Any]:
        """The item-by-item parse (the obviously-correct twin of the fast path; error messages)."""
        return self.history.parse_reference(history, where)

    def model_batch(self, parsed: Sequence[dict[str, Any]]) -> ModelBatch:
        """Right-padded ModelBatch of parsed histories (item vectors from the table the index holds)."""
        return self.history_batch(parsed)[0]

    def history_batch(self, parsed: Sequence[dict[str, Any]]) -> tuple[ModelBatch, torch.Tensor]:
        """(:meth:`model_batch`, each history's last surface [B]): one reused host array (rows, actions,
        surfaces, ts; :class:`~genrec.infer.buckets.HistoryBuffers`) copied to the device once, right-padded
        to the longest history or, with :attr:`buckets`, to its slot bucket."""
        n = max(len(p["rows"]) for p in parsed)
        if self.buckets is not None:
            n = self.buckets.slots(n, self.config.max_items)
        t, lengths, last_surface = self._buffers.fill(parsed, n)
        r = t[0]
        mb = ModelBatch(actions=t[1], surfaces=t[2], lengths=lengths,
                        sid_codes=self.codes[r] if self.codes is not None else None,
                        item_vecs=self.item_vecs[r], timestamps=t[3])
        return mb, last_surface

    def use_graphs(self, *, use_graph: bool = True, stages: Sequence[str] = ("encode", "sid", "rank")) -> None:
        """Replay ``stages`` from CUDA graphs captured once per static shape (``use_graph=False``: the same
        static-shape path run eagerly, for the CPU tests of padding and capture counts). Each graph cache
        holds the whole bucket grid of :attr:`buckets`, so a warm shape is never evicted and captured again."""
        bk, m = self.buckets, self.model
        cells = len(bk.batch_sizes) * len(bk.slot_grid(self.config.max_items)) if bk is not None else 8
        # the ranker's shapes x 4 (candidate buckets), the beams' x 2 (beam widths)
        self._graphed_encode = GraphedEncoder(m, min_bucket=bk.min_slots if bk is not None else 64, max_graphs=max(
            8, cells), use_graph=use_graph) if "encode" in stages else None
        self._graphed_rank = GraphedRanker(m, max_graphs=4 * cells, use_graph=use_graph) if "rank" in stages else None
        self._beam_graph, self._beam_graphs, self._graphed = (use_graph if "sid" in stages else None), 2 * cells, None

    @property
    def graph_captures(self) -> dict[str, int]:
        """Shapes captured so far per graphed stage (with ``use_graph=False``: static shapes built)."""
        gs = {"encode": self._graphed_encode, "sid": self._graphed, "rank": self._graphed_rank}
        return {name: g.captures for name, g in gs.items() if g is not None}

    # ------------------------------------------------------------------ stages
    def check_sources(self, sources: Sequence[str] | None, rank: bool | None) -> tuple[tuple[str, ...], bool]:
        """Resolve defaults (None = every stage the model has) and refuse stages it lacks."""
        can = tuple(s for s in SOURCES if (s == "sid" and self.trie is not None) or (s == "ann" and self.ann is not None))
        if sources is None:
            srcs = can
        else:
            srcs = tuple(dict.fromkeys(sources))
            bad = [s for s in srcs if s not in SOURCES]
            if bad:
                raise ConfigError(f"sources: unknown stage(s) {bad}; choose from {SOURCES}")
            missing = [s for s in srcs if s not in can]
            if missing:
                raise ConfigError(f"sources: layout {self.config.layout!r} has no {missing} stage (available: {can})")
        if not srcs:
            raise ConfigError("sources: no retrieval stage selected")
        can_rank = self.model.action_head is not None
        if rank is None:
            rank = can_rank
        elif rank and not can_rank:
            raise ConfigError(f"rank: layout {self.config.layout!r} has no action heads (use rank=False)")
        return srcs, bool(rank)

    def encode(self, mb: ModelBatch, *, speculate: bool = False) -> tuple[KVCache, torch.Tensor | None]:
        """The one history prefill: (KV cache, user vector [B, item_dim] or None). Replayed from a
        CUDA graph in "all" graph mode (the batch is padded to a bucket of item slots: the cache
        then ends with PAD tokens, which no later stage sees). ``speculate`` (and :attr:`speculate_plans`): the
        graph's plan verdicts are not waited for (:class:`~genrec.model.graphs.GraphedEncoder`); the caller reads
        ``cache.plans["assumed"]`` where it is set."""
        enc = self._graphed_encode
        if enc is not None and enc.supports(mb):
            lo, hi = (int(x) for x in torch.stack([mb.lengths.min(), mb.lengths.max()]).tolist())
            if lo < 1 or hi > mb.n_items:  # the graph skips the model's checks: the one that matters here
                raise ValueError(f"encode: lengths must lie in [1, {mb.n_items}], got min {lo}, max {hi}")
            cache, user, _ = enc(mb, speculate=speculate and self.speculate_plans)
        else:
            cache, user, _ = self.model.encode_history(mb)
        return cache, user

    def score_candidates(self, cache: KVCache, rows: torch.Tensor, vecs: torch.Tensor | None = None,
                         surface: torch.Tensor | None = None, request_ts: torch.Tensor | None = None, *,
                         trusted: bool = False) -> torch.Tensor:
        """L1: action logits [B, M, C] of candidate rows [B, M] (pad rows may hold any valid row)
        as a decode step over the cached history. ``vecs`` [B, M, item_dim] default: the item table.
        ``trusted``: the rows and surfaces come from the catalogue and the parsed requests (the device funnel):
        their bounds are not checked (the check is a device->host sync)."""
        cand_vecs = self.item_vecs[rows] if vecs is None else vecs
        if surface is None:
            surface = torch.zeros(rows.shape[0], dtype=torch.int64, device=rows.device)
        if request_ts is None and self.config.time_buckets > 0:
            request_ts = cache.last_ts
        if not trusted and (surface.numel() or rows.numel()):  # one device->host copy for the four bounds
            z = torch.zeros((), dtype=torch.int64, device=rows.device)
            lo_s, hi_s, lo_r, hi_r = torch.stack([
                surface.min().long() if surface.numel() else z, surface.max().long() if surface.numel() else z,
                rows.min().long() if rows.numel() else z, rows.max().long() if rows.numel() else z]).tolist()
            if not 0 <= lo_s <= hi_s < self.config.n_surfaces:
                raise ConfigError(f"surface: values must lie in [0, {self.config.n_surfaces}), got {surface.tolist()}")
            if not 0 <= lo_r <= hi_r < len(self.item_vecs):
                raise ConfigError(f"rows: catalogue rows must lie in [0, {len(self.item_vecs)})")
        codes = self.codes[rows] if self.codes is not None else None
        rnk = self._graphed_rank
        if rnk is not None and rnk.supports(cache, cand_vecs):
            return rnk(cache, cand_vecs, codes, surface, request_ts)
        with trusted_inputs():  # checked above; SID codes come from the catalogue: no per-layer syncs
            return self.model.rank(cache, cand_vecs, codes, surface, request_ts)

    # ------------------------------------------------------------------ core
    def _amp(self) -> Any:
        """bf16 autocast for the model on CUDA when ``precision == "bf16"`` (else a no-op)."""
        on = self.precision == "bf16" and self.device.type == "cuda"
        return torch.autocast("cuda", dtype=torch.bfloat16) if on else contextlib.nullcontext()

    def run_batch(self, mb: ModelBatch, *, k: int = 10, beam_width: int = 20, diversity_lambda: float = 0.0,
                  sources: Sequence[str] | None = None, rank: bool | None = None, overretrieve: int = 3,
                  utility: Mapping[str, float] | None = None, exclude_rows: Sequence[np.ndarray] | None = None,
                  request_surface: torch.Tensor | None = None, request_ts: torch.Tensor | None = None,
                  retrieval_weight: float | None = None, sid_weight: float | None = None,
                  action_weight: float | None = None, keep_parts: bool = False, n_real: int | None = None,
                  scorer: Scorer | None = None, transition_weight: float | None = None,
                  last_rows: np.ndarray | None = None, transitions: TransitionTable | None = None,
                  history_rows: Sequence[np.ndarray] | None = None, history_weight: float | None = None) -> BatchResult:
        """The L0 -> L1 pipeline for a batch of encoded-ready histories (see module docstring and
        :mod:`genrec.infer.funnel`).

        The L1 score of a candidate is ``a * Σ_c u_c p_c + w * (user · candidate vector) +
        v * log P(SID)``: ``action_weight`` a >= 0 scales the action heads' utility (UniPinRec's
        L1: a = 1, w = v = 0); ``retrieval_weight`` w >= 0 fuses the dense retrieval
        logit; ``sid_weight`` v >= 0 fuses the log-probability of the candidate's SID under the
        beam search -- for a candidate the SID stage did not retrieve, the request's lowest
        retrieved beam log-probability (its SID scored below every kept beam's). Both fused
        terms are log-scale scores of the same encoding, so the fusion is a product of experts.
        ``transition_weight`` t >= 0 adds ``log P(candidate | the history's last item)`` from
        ``transitions`` (default :attr:`transitions`, the run's table) for ``last_rows`` (int [B], each
        history's last catalogue row; required when t > 0). The stored ``history_weight`` h (any sign) adds h for a
        candidate among ``history_rows`` (each request's history rows; required when h != 0). A weight left None
        takes :attr:`fusion`'s (the weights ``genrec fusion tune`` chose on validation for this checkpoint, else
        a = 1, w = v = t = h = 0).
        ``keep_parts``: also return every candidate's score parts (``BatchResult.l1_parts``).
        ``n_real``: the batch's first ``n_real`` rows are requests, the rest copies of its first row
        (bucket padding: work off the device, the ANN search, runs for the requests only). ``scorer``: the
        ranking stage in place of :meth:`score_candidates`."""
        with self._amp():
            return run_funnel(self, mb, k=k, beam_width=beam_width, diversity_lambda=diversity_lambda, sources=sources,
                              rank_stage=rank, overretrieve=overretrieve, utility=utility, exclude_rows=exclude_rows,
                              request_surface=request_surface, request_ts=request_ts,
                              retrieval_weight=retrieval_weight, sid_weight=sid_weight, action_weight=action_weight,
                              keep_parts=keep_parts, n_real=n_real, scorer=scorer,
                              transition_weight=transition_weight, last_rows=last_rows, transitions=transitions,
                              history_rows=history_rows, history_weight=history_weight)

    # ------------------------------------------------------------------ public
    def warmup(self, *, k: int = 10, beam_width: int = 20, min_bucket: int = 64,
               batch_sizes: Sequence[int] = (1,)) -> list[int]:
        """Capture the CUDA graphs of the common shapes before serving: a batch of each of ``batch_sizes`` (their
        buckets) per history bucket (powers of two from ``min_bucket`` up to the context length) at the default
        beam width, so the first real requests do not pay a capture (~0.1-1 s each). Nothing to do when no stage
        is graphed (CPU, ``GENREC_CUDA_GRAPHS=off``). Returns the history lengths run."""
        if self.cuda_graphs == "off" or len(self.catalog) == 0:
            return []
        for batch in self.warmup_batches(batch_sizes, min_bucket):
            self.recommend(batch, k=k, beam_width=beam_width, sources=None,
                           rank=None)  # every stage this model has (a TIGER layout: SID only)
        return self.warmup_lengths(min_bucket)

    def warmup_batches(self, batch_sizes: Sequence[int], min_bucket: int = 64) -> list[list[list[dict[str, int]]]]:
        """The batches :meth:`warmup` runs (the ranking process of two-process serving is warmed with them too): at
        each of :meth:`warmup_lengths`, one batch of each of ``batch_sizes``' buckets, histories of catalogue items."""
        ids = self.catalog.item_ids
        sizes = sorted({self.buckets.batch(min(b, self.buckets.max_batch)) if self.buckets is not None else b
                        for b in batch_sizes})
        out = []
        for n in self.warmup_lengths(min_bucket):
            h = [{"item_id": int(ids[i % len(ids)])} for i in range(n)]
            out += [[h] * b for b in sizes]
        return out

    def warmup_lengths(self, min_bucket: int = 64) -> list[int]:
        """The history lengths :meth:`warmup` runs: powers of two from ``min_bucket`` below the context, and the
        context length."""
        lens, n = [], min_bucket
        while n < self.context_len:
            lens.append(n)
            n *= 2
        return lens + [self.context_len]

    def recommend(self, history: Sequence[Any], *, k: int = 10, beam_width: int = 20, diversity_lambda: float = 0.0,
                  sources: Sequence[str] | None = None, rank: bool | None = None, overretrieve: int = 3,
                  utility: Mapping[str, float] | None = None, exclude_history: bool = False,
                  surface: str | int | None = None, request_ts: int | None = None,
                  retrieval_weight: float | None = None, sid_weight: float | None = None,
                  action_weight: float | None = None, transition_weight: float | None = None,
                  history_weight: float | None = None) -> RecommendationList | list[RecommendationList]:
        """Top-``k`` items for one history (-> RecommendationList) or a batch of them (-> list of them).

        ``sources=None`` / ``rank=None`` mean "every stage this model has" (a TIGER-layout model has
        no ANN or ranking stage; a dense-only one no SID stage). ``surface`` is the request surface
        (default: the last history item's); ``request_ts`` the request time (default: the last
        history item's timestamp). ``action_weight`` / ``retrieval_weight`` / ``sid_weight``: the L1
        score fusion (see :meth:`run_batch`; None: :attr:`fusion`'s). ``exclude_history``: return
        none of the items in ``history`` -- every one given, also those older than the newest
        ``context_len`` the model reads (the stages over-retrieve by that many, so ``k`` remain)."""
        t_wall = time.perf_counter()
        is_batch = len(history) > 0 and all(isinstance(h, (list, tuple, HistoryColumns)) for h in history)
        hs = list(history) if is_batch else [history]
        if not hs:
            raise DataError("empty batch of histories", field="history")
        with stage("parse"):
            parsed = [self.parse_history(h, f"history[{i}]" if is_batch else "history") for i, h in enumerate(hs)]
        outs = calls.run_parsed(self, parsed, k=k, beam_width=beam_width, diversity_lambda=diversity_lambda,
                                sources=sources, rank=rank, overretrieve=overretrieve, utility=utility,
                                exclude_history=exclude_history, surface=surface, request_ts=request_ts,
                                retrieval_weight=retrieval_weight, sid_weight=sid_weight,
                                action_weight=action_weight, transition_weight=transition_weight,
                                history_weight=history_weight, t_wall=t_wall)
        return outs if is_batch else outs[0]

    @torch.no_grad()
    def rank_items(self, history: Sequence[Any], item_ids: Sequence[int], *, surface: str | int | None = None,
                   request_ts: int | None = None, utility: Mapping[str, float] | None = None,
                   action_weight: float | None = None, retrieval_weight: float | None = None,
                   sid_weight: float | None = None, beam_width: int = 20, diversity_lambda: float = 0.0,
                   transition_weight: float | None = None, history_weight: float | None = None) -> RankedList:
        """Score GIVEN candidates for one history by the L1 score :meth:`recommend` ranks by (same fusion
        weights and utility, :func:`genrec.infer.funnel.rank_given`), best first, ties in the given order.
        One encode; each candidate attends to the cached history only (M-FALCON), so its score does not
        depend on the other candidates. ``beam_width`` / ``diversity_lambda``: the beams the SID term reads
        (only when the SID weight is > 0). Candidates not in the catalogue are left out and listed in
        ``unknown_items``; a history with no known item is a :class:`DataError`, as in :meth:`recommend`."""
        return calls.rank_items(self, history, item_ids, surface=surface, request_ts=request_ts, utility=utility,
                                action_weight=action_weight, retrieval_weight=retrieval_weight,
                                sid_weight=sid_weight, beam_width=beam_width, diversity_lambda=diversity_lambda,
                                transition_weight=transition_weight, history_weight=history_weight)
