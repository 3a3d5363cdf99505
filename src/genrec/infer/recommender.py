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

``history`` is a list of ``{"item_id": int, "action"?: str|int, "surface"?: str|int, "ts"?: int}``
(or bare item ids), oldest first; a list of such lists is a batch and returns a list of results.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc  # type: ignore[import-untyped]
import torch
import torch.nn.functional as F

from genrec.catalog import ItemCatalog, load_catalog, open_store
from genrec.data.splits import SplitSpec, compute_cutoffs
from genrec.data.store import TableStore, user_bucket
from genrec.decode.beam import BeamResult, beam_search
from genrec.decode.graphs import GraphedBeamSearch
from genrec.decode.rows import beam_rows
from genrec.decode.rows import leaf_rows as sid_leaf_rows
from genrec.decode.trie_torch import TorchTrie
from genrec.errors import ConfigError, DataError
from genrec.infer.ann import AnnConfig, AnnIndex
from genrec.infer.catalog_model import CatalogModel
from genrec.infer.fusion import FusionWeights, fusion_file, load_fusion_record, save_fusion
from genrec.model.checkpoint_io import (
    BEST,
    LATEST,
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
)
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel, ModelBatch
from genrec.model.graphs import GraphedEncoder, GraphedRanker
from genrec.model.kv_cache import KVCache
from genrec.sid.build import open_current
from genrec.validation import trusted_inputs
from genrec.workdir import WorkDir, file_digest, read_json

SOURCES = ("sid", "ann")
NEGATIVE_ACTIONS = frozenset({"dislike", "skip", "hide", "report", "negative", "unlike", "block"})
_SRC_BIT = {"sid": 1, "ann": 2}


@dataclass
class Recommendation:
    """One recommended item. ``sources``: the L0 stages that retrieved it; ``sid``: its full code;
    ``action_probs``: sigmoid of each action head (None when not ranked); ``sid_logprob`` /
    ``ann_score``: the stage scores (None when that stage did not retrieve it)."""

    item_id: int
    title: str | None
    score: float
    sources: tuple[str, ...]
    sid: tuple[int, ...] | None
    action_probs: dict[str, float] | None = None
    sid_logprob: float | None = None
    ann_score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sources"] = list(self.sources)
        d["sid"] = None if self.sid is None else list(self.sid)
        return d


class RecommendationList(list):  # type: ignore[type-arg]
    """``list[Recommendation]`` plus what happened: per-stage ``timings_ms``, ``dropped_items``
    (unknown history ids), ``history_used`` (items fed to the model after truncation)."""

    def __init__(self, items: Sequence[Recommendation] = (), *, timings_ms: dict[str, float] | None = None,
                 dropped_items: list[int] | None = None, history_used: int = 0, history_truncated: int = 0) -> None:
        super().__init__(items)
        self.timings_ms = dict(timings_ms or {})
        self.dropped_items = list(dropped_items or [])
        self.history_used = history_used
        self.history_truncated = history_truncated

    def to_dict(self) -> dict[str, Any]:
        return {"items": [r.to_dict() for r in self], "timings_ms": self.timings_ms,
                "dropped_items": self.dropped_items, "history_used": self.history_used,
                "history_truncated": self.history_truncated}


@dataclass
class BatchResult:
    """Batched core output, rows sorted by final score. ``rows`` int64 [B, K] catalogue rows (-1 pad);
    ``scores`` [B, K]; ``src`` int8 [B, K] bitmask (1 = sid, 2 = ann); ``sid_lp`` / ``ann_score``
    [B, K] (nan where the stage did not retrieve the item); ``probs`` [B, K, C] or None;
    ``beams``: the SID beam result (None without the SID stage)."""

    rows: np.ndarray
    scores: np.ndarray
    src: np.ndarray
    sid_lp: np.ndarray
    ann_score: np.ndarray
    probs: np.ndarray | None
    beams: BeamResult | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    l1_parts: dict[str, np.ndarray] | None = None
    """With ranking and ``keep_parts``: the L1 score's parts for every L0 candidate, [B, M] each (M = the largest
    union): ``rows`` (-1 pad), ``utility`` (Σ u_c p_c), ``dot`` (user · candidate vector),
    ``sid_lp`` (log P(SID) under the beams, the request's lowest beam log-probability for
    candidates the SID stage did not retrieve). For choosing fusion weights offline."""


def _sid_lp_matrix(union: Sequence[dict[int, list[Any]]], b: int, m: int) -> np.ndarray:
    """float32 [B, M]: each union candidate's log P(SID) under the beams; for a candidate the SID
    stage did not retrieve, the lowest retrieved beam log-probability of its request (0 if none)."""
    out = np.zeros((b, m), np.float32)
    for i, d in enumerate(union):
        lps = [e[1] for e in d.values() if not np.isnan(e[1])]
        floor = min(lps) if lps else 0.0
        for j, e in enumerate(d.values()):
            out[i, j] = floor if np.isnan(e[1]) else e[1]
    return out


def _sha(paths: Sequence[Path], first: str | None = None) -> str:
    """A short fingerprint of the files' contents (missing files are skipped); ``first``: the digest of
    a file read earlier, taken as the first file's (``_sha([a, b]) == _sha([b], first=file_digest(a))``)."""
    h = hashlib.sha256()
    if first is not None:
        h.update(first.encode())
    for p in paths:
        if p.exists():
            h.update(file_digest(p).encode())
    return h.hexdigest()[:10]


def graph_mode(device: torch.device) -> str:
    """Which serving stages replay CUDA graphs: "off" on a CPU; else ``GENREC_CUDA_GRAPHS``:
    "all" (default, also "1": the history encode, the SID decode and the ranking decode), "sid"
    (the SID decode only) or "off" ("0")."""
    if device.type != "cuda":
        return "off"
    raw = os.environ.get("GENREC_CUDA_GRAPHS", "all").strip().lower()
    mode = {"1": "all", "0": "off", "": "all"}.get(raw, raw)
    if mode not in ("off", "sid", "all"):
        raise ConfigError(f"GENREC_CUDA_GRAPHS: expected off, sid or all (or 0/1), got {raw!r}")
    return mode


class Recommender:
    """A trained model with its catalogue, SID trie / index and ANN index, ready to serve."""

    def __init__(self, catalog_model: CatalogModel, catalog: ItemCatalog, *, actions: list[str],
                 positive_actions: list[str], surfaces: list[str], ann: AnnIndex | None,
                 trie: TorchTrie | None = None, sid_index: Any = None, step: int = -1,
                 checkpoint: Path | None = None, run_config: dict[str, Any] | None = None,
                 device: str | torch.device = "cpu") -> None:
        self.catalog_model = catalog_model  # the model + the catalogue tensors (offline evaluation reads them)
        self.model: GenRecModel = catalog_model.model
        self.model.eval()
        self.config: ModelConfig = self.model.config
        self.catalog = catalog
        self.actions, self.positive_actions, self.surfaces = list(actions), list(positive_actions), list(surfaces)
        # name -> index (first occurrence, as _vocab_index), built once for the fast history parse
        self._vocab_tables = [{n: i for i, n in reversed(list(enumerate(v)))} for v in (self.actions, self.surfaces)]
        self.ann = ann
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
        self.workdir: Path | None = None  # the run directory (from_checkpoint)
        self.sid_version: str | None = None  # the SID version loaded beside the weights
        # sha256 of the checkpoint's model.safetensors as loaded, and a short fingerprint of it and the item
        # features (from_checkpoint): weights or features replaced in place are a new served version
        self.weights_digest: str | None = None
        self.fingerprint: str | None = None
        self.run_config = run_config or {}
        self.device = torch.device(device)
        self.context_len = self.config.max_items - 1
        self.leaf_rows: np.ndarray | None = None  # catalogue row of each SID-trie leaf (beams -> rows)
        self._leaf_t: torch.Tensor | None = None  # leaf_rows on the trie's device (beam_rows)
        self._leaf_src: np.ndarray | None = None  # the leaf_rows _leaf_t was made from
        # CUDA graphs on a GPU: GENREC_CUDA_GRAPHS = "all" (default; "1" too): the history encode,
        # the SID beam search and the ranking decode; "sid": the SID beam search; "off" ("0"): eager
        self.cuda_graphs = graph_mode(self.device)
        self._graphed: GraphedBeamSearch | None = None
        self._graphed_encode = GraphedEncoder(self.model) if self.cuda_graphs == "all" else None
        self._graphed_rank = GraphedRanker(self.model) if self.cuda_graphs == "all" else None
        with torch.no_grad():
            self.item_vecs = torch.cat([catalog_model.catalogue_vectors(i, i + 8192).float()
                                        for i in range(0, len(catalog), 8192)])  # [N, D]
        self.codes: torch.Tensor | None = catalog_model.codes if self.config.uses_sids else None  # [N, L]

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_checkpoint(cls, workdir: str | Path, checkpoint: str | Path | None = None,
                        device: str | torch.device = "cpu", *, ann_config: AnnConfig | None = None,
                        precision: str | None = None) -> "Recommender":
        """Load WORKDIR's model (``checkpoint``: None = BEST if marked else LATEST; "BEST"/"LATEST";
        or a checkpoint folder), catalogue, current SIDs (trie on ``device``) and the ANN index
        (built once per checkpoint and cached atomically under ``WORKDIR/ann/``). ``precision``:
        "float32" or "bf16" (autocast on CUDA; no effect on CPU); None = ``$GENREC_PRECISION``,
        else float32 -- the server's ``--precision`` sets that variable for all its processes."""
        wd = WorkDir(workdir)
        ckpt = find_checkpoint(wd.root, checkpoint)
        cfg_path = ckpt / "config.json"
        if not cfg_path.exists():
            cfg_path = wd.checkpoints / "config.json"
        if not cfg_path.exists():
            raise ConfigError(f"{ckpt}: no config.json beside the weights; cannot rebuild the model")
        cfg = read_json(cfg_path)
        if "model" not in cfg:
            raise DataError("missing key 'model'", path=cfg_path, field="model")
        mcfg = ModelConfig.from_dict(cfg["model"])
        catalog = load_catalog(wd.root, with_sids=mcfg.uses_sids)
        if int(catalog.feats.shape[1]) != mcfg.item_feat_dim:
            raise ConfigError(f"{wd.features}: item features have width {int(catalog.feats.shape[1])}, the model "
                              f"was trained on {mcfg.item_feat_dim} (features rebuilt since training?)")
        actions, positive, surfaces = _dataset_vocab(wd, mcfg)
        model = GenRecModel(mcfg)
        weights = ckpt / "model.safetensors"
        digest = file_digest(weights) if weights.exists() else None
        try:  # the model's weights out of the training objective's state (genrec.model.checkpoint_io)
            load_checkpoint(ckpt, model, device="cpu")
        except CheckpointError as e:  # a damaged file: name it, and the run's checkpoints that could serve instead
            others = [p for _, p in reversed(list_checkpoints(ckpt.parent)) if p != ckpt]
            hint = (f"other checkpoints of this run, newest first: {', '.join(p.name for p in others)} "
                    f"(e.g. --checkpoint {others[0]})") if others else "the run has no other checkpoint"
            raise CheckpointError(f"{e}; {hint}") from e
        if digest is not None and file_digest(weights) != digest:  # (remembered per size + mtime: no re-hash)
            raise ConfigError(f"{weights}: replaced while it was being loaded; load again")
        held = CatalogModel(model, catalog).to(device)
        step = int(read_json(ckpt / "meta.json")["step"])
        trie = sid_index = leaf_rows = None
        sid_version: str | None = None
        if mcfg.uses_sids:
            sb = open_current(wd.sid)
            sizes = [int(k) for k in sb.codebook_sizes]
            if sizes != list(mcfg.sid_codebook_sizes):
                raise ConfigError(f"{wd.sid}: current SID version {sb.version} has codebooks {sizes}, the model was "
                                  f"trained with {mcfg.sid_codebook_sizes}; retrain or point CURRENT back")
            sid_index, sid_version = sb.index, sb.version
            if mcfg.layout in ("pinger", "tiger"):  # SID heads -> a decoding stage (dense + fusion has none)
                trie = TorchTrie.from_sid_trie(sb.trie, device=device)
                leaf_rows = sid_leaf_rows(sb.trie, catalog)
        rec = cls(held, catalog, actions=actions, positive_actions=positive, surfaces=surfaces, ann=None,
                  trie=trie, sid_index=sid_index, step=step, checkpoint=ckpt, run_config=cfg.get("run"),
                  device=device)
        rec.leaf_rows = leaf_rows
        rec.weights_digest = digest
        rec.fingerprint = _sha([wd.features / "manifest.json"], first=digest)  # the weights as loaded, not as now
        prec = precision or os.environ.get("GENREC_PRECISION") or "float32"
        if prec not in ("float32", "bf16"):
            raise ConfigError(f"precision must be 'float32' or 'bf16' (argument or GENREC_PRECISION), got {prec!r}")
        rec.precision = prec
        if rec.model.user_head is not None:
            rec.ann = rec._load_or_build_ann(wd, ckpt, ann_config or AnnConfig())
        rec.workdir, rec.sid_version = wd.root, sid_version
        fpath = fusion_file(wd.root, ckpt, sid_version)
        stored = load_fusion_record(fpath, rec.actions)
        if stored is not None:  # chosen on validation for exactly these weights and SIDs
            rec.fusion, rec.fusion_utility = stored
            rec.fusion_path = fpath
        return rec

    def store_fusion(self, weights: FusionWeights, utility: Mapping[str, float], meta: dict[str, Any]) -> Path:
        """Keep ``weights`` (chosen on validation under ``utility``) for this checkpoint and SID
        version -- ``WORKDIR/fusion/``, written atomically -- and use them from now on."""
        if self.workdir is None or self.checkpoint is None:
            raise ConfigError("store_fusion: this Recommender was not loaded from a run directory")
        path = save_fusion(fusion_file(self.workdir, self.checkpoint, self.sid_version), weights,
                           {**meta, "chosen_on": {**meta.get("chosen_on", {}), "utility": dict(utility)},
                            "checkpoint": str(self.checkpoint), "step": self.step, "sid_version": self.sid_version})
        self.fusion, self.fusion_path, self.fusion_utility = weights, path, dict(utility)
        return path

    def _load_or_build_ann(self, wd: WorkDir, ckpt: Path, cfg: AnnConfig) -> AnnIndex:
        """``WORKDIR/ann/step-NNNNNN-<hash of weights + features + index kind>``, built atomically once."""
        fp = self.fingerprint or _sha([ckpt / "model.safetensors", wd.features / "manifest.json"])
        folder = wd.root / "ann" / f"step-{self.step:06d}-{cfg.kind}-{fp}"
        if (folder / "manifest.json").exists():
            idx = AnnIndex.load(folder)
            if len(idx) == len(self.catalog) and np.array_equal(idx.item_ids, self.catalog.item_ids):
                return idx
        idx = AnnIndex.build(self.item_vecs.cpu().numpy(), self.catalog.item_ids, cfg)
        idx.save(folder, overwrite=True)
        return idx

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
        """+1 for the dataset's positive actions, -1 for known negative ones (e.g. 'dislike'), 0 for the rest."""
        return {a: (1.0 if a in self.positive_actions else -1.0 if a.lower() in NEGATIVE_ACTIONS else 0.0)
                for a in self.actions}

    def utility_vector(self, utility: Mapping[str, float] | None) -> torch.Tensor:
        u = self.default_utility() if utility is None else dict(utility)
        unknown = sorted(set(u) - set(self.actions))
        if unknown:
            raise ConfigError(f"utility: unknown action(s) {unknown}; the actions are {self.actions}")
        return torch.tensor([float(u.get(a, 0.0)) for a in self.actions], dtype=torch.float32, device=self.device)

    def _vocab_index(self, value: Any, vocab: list[str], what: str, where: str) -> int:
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            if not 0 <= int(value) < len(vocab):
                raise DataError(f"{what} index {value} out of range 0..{len(vocab) - 1}", field=where)
            return int(value)
        if isinstance(value, str) and value in vocab:
            return vocab.index(value)
        raise DataError(f"{what} {value!r} is not one of {vocab}", field=where)

    vocab_index = _vocab_index  # public name: action / surface name or index -> index (DataError naming ``where``)

    def parse_history(self, history: Sequence[Any], where: str = "history") -> dict[str, Any]:
        """One history -> catalogue rows / actions / surfaces / timestamps (newest ``context_len`` kept).

        Items are ``{"item_id", "action"?, "surface"?, "ts"?}`` mappings or bare item ids. Unknown
        item ids are dropped and reported; an empty history (or one with no known item) raises
        :class:`DataError`. Long, well-formed histories take a columnar fast path; anything it
        does not handle exactly (other types, unknown vocabulary) goes through
        :meth:`parse_history_reference`, which also writes the error naming the bad field.
        """
        if history is None or len(history) == 0:
            raise DataError("empty history: give at least one item the user interacted with", field=where)
        cols = self._history_columns(history)
        if cols is None:
            return self.parse_history_reference(history, where)
        return self._finish_history(*cols, where=where)

    def _history_columns(self, history: Sequence[Any]) -> tuple[list[int], list[int], list[int], list[int]] | None:
        """Columns of a history of plain dicts / ints whose values need no conversion, else None."""
        n = len(history)
        if all(type(h) is int for h in history):
            ids, acts_raw, surfs_raw, ts_raw = list(history), [None] * n, [None] * n, [None] * n
        elif all(type(h) is dict for h in history):
            try:
                ids = [h["item_id"] for h in history]
            except KeyError:
                return None
            acts_raw = [h.get("action") for h in history]
            surfs_raw = [h.get("surface") for h in history]
            ts_raw = [h.get("ts") for h in history]
        else:
            return None
        if not all(type(x) is int for x in ids):
            return None
        lookups = []
        for raw, vocab, table, default in ((acts_raw, self.actions, self._vocab_tables[0], self._default_action()),
                                           (surfs_raw, self.surfaces, self._vocab_tables[1], 0)):
            d = self._vocab_index(default, vocab, "default", "default")
            out = []
            for v in raw:
                if v is None:
                    out.append(d)
                elif type(v) is int and 0 <= v < len(vocab):
                    out.append(v)
                elif type(v) is str and v in table:
                    out.append(table[v])
                else:
                    return None
            lookups.append(out)
        if not all(t is None or type(t) is int for t in ts_raw):
            return None
        ts = [0 if t is None else t for t in ts_raw]
        return ids, lookups[0], lookups[1], ts

    def _default_action(self) -> str:
        return self.positive_actions[0] if self.positive_actions else self.actions[0]

    def parse_history_reference(self, history: Sequence[Any], where: str = "history") -> dict[str, Any]:
        """The item-by-item parse (the obviously-correct twin of the fast path; error messages)."""
        if history is None or len(history) == 0:
            raise DataError("empty history: give at least one item the user interacted with", field=where)
        default_action = self._default_action()
        ids, acts, surfs, ts = [], [], [], []
        for i, h in enumerate(history):
            w = f"{where}[{i}]"
            if isinstance(h, Mapping):
                if "item_id" not in h:
                    raise DataError("missing 'item_id'", field=w)
                iid, a, s, t = h["item_id"], h.get("action"), h.get("surface"), h.get("ts")
            else:
                iid, a, s, t = h, None, None, None
            try:
                ids.append(int(iid))
            except (TypeError, ValueError):
                raise DataError(f"item_id {iid!r} is not an integer", field=f"{w}.item_id") from None
            acts.append(self._vocab_index(default_action if a is None else a, self.actions, "action", f"{w}.action"))
            surfs.append(self._vocab_index(0 if s is None else s, self.surfaces, "surface", f"{w}.surface"))
            ts.append(0 if t is None else int(t))
        return self._finish_history(ids, acts, surfs, ts, where=where)

    def _finish_history(self, ids: list[int], acts: list[int], surfs: list[int], ts: list[int], *,
                        where: str) -> dict[str, Any]:
        ids_a = np.asarray(ids, dtype=np.int64)
        rows = self.catalog.rows(ids_a, strict=False)
        known = rows >= 0
        dropped = [int(x) for x in ids_a[~known]]
        if not known.any():
            raise DataError(f"none of the {len(ids)} history item ids is in the catalogue "
                            f"(e.g. {dropped[:5]})", field=where)
        sel = np.flatnonzero(known)
        truncated = max(0, len(sel) - self.context_len)
        seen = np.unique(rows[sel])  # every known item given, the truncated-away ones too (exclude_history)
        sel = sel[truncated:]
        return {"rows": rows[sel], "actions": np.asarray(acts, dtype=np.int64)[sel],
                "surfaces": np.asarray(surfs, dtype=np.int64)[sel],
                "ts": np.asarray(ts, dtype=np.int64)[sel], "dropped": dropped, "truncated": truncated,
                "seen_rows": seen}

    def model_batch(self, parsed: Sequence[dict[str, Any]]) -> ModelBatch:
        """Right-padded ModelBatch of parsed histories (item vectors from the table the index holds)."""
        b = len(parsed)
        n = max(len(p["rows"]) for p in parsed)
        rows = np.zeros((b, n), np.int64)
        acts = np.zeros((b, n), np.int64)
        surf = np.zeros((b, n), np.int64)
        ts = np.zeros((b, n), np.int64)
        lengths = np.zeros(b, np.int64)
        for i, p in enumerate(parsed):
            m = len(p["rows"])
            rows[i, :m], acts[i, :m], surf[i, :m], ts[i, :m], lengths[i] = p["rows"], p["actions"], p["surfaces"], \
                p["ts"], m
        dev = self.device
        r = torch.from_numpy(rows).to(dev)
        return ModelBatch(actions=torch.from_numpy(acts).to(dev), surfaces=torch.from_numpy(surf).to(dev),
                          lengths=torch.from_numpy(lengths).to(dev),
                          sid_codes=self.codes[r] if self.codes is not None else None,
                          item_vecs=self.item_vecs[r], timestamps=torch.from_numpy(ts).to(dev))

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

    def encode(self, mb: ModelBatch) -> tuple[KVCache, torch.Tensor | None]:
        """The one history prefill: (KV cache, user vector [B, item_dim] or None). Replayed from a
        CUDA graph in "all" graph mode (the batch is padded to a bucket of item slots: the cache
        then ends with PAD tokens, which no later stage sees)."""
        enc = self._graphed_encode
        if enc is not None and enc.supports(mb):
            lo, hi = (int(x) for x in torch.stack([mb.lengths.min(), mb.lengths.max()]).tolist())
            if lo < 1 or hi > mb.n_items:  # the graph skips the model's checks: the one that matters here
                raise ValueError(f"encode: lengths must lie in [1, {mb.n_items}], got min {lo}, max {hi}")
            cache, user, _ = enc(mb)
        else:
            cache, user, _ = self.model.encode_history(mb)
        return cache, user

    def decode_sids(self, cache: KVCache, beam_width: int, diversity_lambda: float = 0.0,
                    constrain: bool = True) -> BeamResult:
        """SID beams over the cached history: codes [B, W, L] (constrained through the trie)."""
        if self.trie is None:
            raise ConfigError(f"layout {self.config.layout!r} has no SID stage")
        cfg = self.config
        # shared-prefix plan checked once here; every step then runs sync-free over the context
        ctx = self.model.beam_context(cache) if self.model.shared_beam_decode else None
        if ctx is not None and self.cuda_graphs in ("sid", "all"):
            if self._graphed is None or self._graphed.trie is not self.trie:
                self._graphed = GraphedBeamSearch(self.model, self.trie)
            if self._graphed.supports(ctx):
                return self._graphed(ctx, beam_width, diversity_lambda=diversity_lambda, constrain=constrain)

        def step(prefix: torch.Tensor) -> torch.Tensor:
            logits = self.model.sid_logits_ctx(ctx, prefix) if ctx is not None else self.model.sid_logits_next(cache, prefix)
            return F.log_softmax(logits.float(), dim=-1)  # [B, W, K]

        return beam_search(step, cache.batch_size, cfg.sid_levels, cfg.sid_codebook_sizes, beam_width,
                           diversity_lambda=diversity_lambda, trie=self.trie, constrain=constrain, device=self.device)

    def beam_rows(self, beams: BeamResult, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Valid beams -> catalogue rows through the SID trie's leaves, beam order, deduplicated, at most
        ``limit`` per row: (rows int64 [B, limit] (-1 pad), beam log-prob of each [B, limit])."""
        if self.trie is None or self.leaf_rows is None:
            raise ConfigError(f"layout {self.config.layout!r} has no SID stage")
        if self._leaf_t is None or self._leaf_t.device != self.trie.device or self._leaf_src is not self.leaf_rows:
            self._leaf_t = torch.as_tensor(np.asarray(self.leaf_rows, dtype=np.int64), device=self.trie.device)
            self._leaf_src = self.leaf_rows
        return beam_rows(beams, self.trie, self._leaf_t, limit)

    def score_candidates(self, cache: KVCache, rows: torch.Tensor, vecs: torch.Tensor | None = None,
                         surface: torch.Tensor | None = None, request_ts: torch.Tensor | None = None) -> torch.Tensor:
        """L1: action logits [B, M, C] of candidate rows [B, M] (pad rows may hold any valid row)
        as a decode step over the cached history. ``vecs`` [B, M, item_dim] default: the item table."""
        cand_vecs = self.item_vecs[rows] if vecs is None else vecs
        if surface is None:
            surface = torch.zeros(rows.shape[0], dtype=torch.int64, device=rows.device)
        if request_ts is None and self.config.time_buckets > 0:
            request_ts = cache.last_ts
        if surface.numel() and not 0 <= int(surface.min()) <= int(surface.max()) < self.config.n_surfaces:
            raise ConfigError(f"surface: values must lie in [0, {self.config.n_surfaces}), got {surface.tolist()}")
        if rows.numel() and not 0 <= int(rows.min()) <= int(rows.max()) < len(self.item_vecs):
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

    def run_batch(self, mb: ModelBatch, **kw: Any) -> BatchResult:
        """The L0 -> L1 pipeline for a batch of encoded-ready histories (see module docstring);
        keyword arguments as :meth:`_run_batch`."""
        with self._amp():
            return self._run_batch(mb, **kw)

    @torch.no_grad()
    def _run_batch(self, mb: ModelBatch, *, k: int = 10, beam_width: int = 20, diversity_lambda: float = 0.0,
                  sources: Sequence[str] | None = None, rank: bool | None = None, overretrieve: int = 3,
                  utility: Mapping[str, float] | None = None, exclude_rows: Sequence[np.ndarray] | None = None,
                  request_surface: torch.Tensor | None = None, request_ts: torch.Tensor | None = None,
                  retrieval_weight: float | None = None, sid_weight: float | None = None,
                  action_weight: float | None = None, keep_parts: bool = False) -> BatchResult:
        """The L0 -> L1 pipeline for a batch of encoded-ready histories (see module docstring).

        The L1 score of a candidate is ``a * Σ_c u_c p_c + w * (user · candidate vector) +
        v * log P(SID)``: ``action_weight`` a >= 0 scales the action heads' utility (UniPinRec's
        L1: a = 1, w = v = 0); ``retrieval_weight`` w >= 0 fuses the dense retrieval
        logit; ``sid_weight`` v >= 0 fuses the log-probability of the candidate's SID under the
        beam search -- for a candidate the SID stage did not retrieve, the request's lowest
        retrieved beam log-probability (its SID scored below every kept beam's). Both fused
        terms are log-scale scores of the same encoding, so the fusion is a product of experts.
        A weight left None takes :attr:`fusion`'s (the weights ``genrec fusion tune`` chose on
        validation for this checkpoint, else a = 1, w = v = 0).
        ``keep_parts``: also return every candidate's score parts (``BatchResult.l1_parts``)."""
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        if overretrieve < 1:
            raise ConfigError(f"overretrieve must be >= 1, got {overretrieve}")
        fw = self.fusion.resolve(action_weight, retrieval_weight, sid_weight)  # checks each: finite, >= 0
        action_weight, retrieval_weight, sid_weight = fw.action_weight, fw.retrieval_weight, fw.sid_weight
        srcs, do_rank = self.check_sources(sources, rank)
        u = self.utility_vector(utility)
        t: dict[str, float] = {}
        t0 = time.perf_counter()
        cache, user = self.encode(mb)
        t["encode"] = _ms(t0)
        b = mb.actions.shape[0]
        kr = k * overretrieve
        # each stage over-retrieves by the most rows a request excludes: k * r remain after excluding
        extra = 0 if exclude_rows is None else max((len(x) for x in exclude_rows), default=0)
        beams = None
        sid_rows = np.full((b, 0), -1, np.int64)
        sid_lp = np.zeros((b, 0), np.float32)
        if "sid" in srcs:
            t0 = time.perf_counter()
            width = beam_width
            if extra and "ann" not in srcs:
                # the beams are the only candidates: an excluded item empties at most one beam (one SID
                # each), so beam_width + extra beams keep >= beam_width live ones; a power of two, so
                # graphed beam searches capture a few widths, not one per history length
                width = 1 << (beam_width + extra - 1).bit_length()
            beams = self.decode_sids(cache, width, diversity_lambda)
            sid_rows, sid_lp = self.beam_rows(beams, kr + extra)
            t["sid"] = _ms(t0)
        ann_rows: np.ndarray = np.full((b, 0), -1, np.int64)
        ann_sc = np.zeros((b, 0), np.float32)
        ann_vecs = None
        if "ann" in srcs:
            t0 = time.perf_counter()
            assert self.ann is not None and user is not None
            kk = min(kr + extra, len(self.ann))
            ann_ids, ann_sc, ann_vecs = self.ann.search_and_reconstruct(user.float().cpu().numpy(), kk)
            ann_rows = self.catalog.rows(ann_ids.reshape(-1), strict=False).reshape(ann_ids.shape)
            t["ann"] = _ms(t0)
        # ---- union (dedup; remember stages and stage scores)
        t0 = time.perf_counter()
        excl = [set() if exclude_rows is None else {int(x) for x in exclude_rows[i]} for i in range(b)]
        union: list[dict[int, list[Any]]] = []
        for i in range(b):
            d: dict[int, list[Any]] = {}  # row -> [src bits, sid lp, ann score, vec, merged position]
            lists = []
            for rows_i, sc_i, bit in ((sid_rows[i], sid_lp[i], 1), (ann_rows[i], ann_sc[i], 2)):
                kept = [(int(r), float(s), j) for j, (r, s) in enumerate(zip(rows_i, sc_i)) if r >= 0 and r not in excl[i]]
                lists.append((kept[:kr], bit))
            order = _round_robin([[r for r, _, _ in kept] for kept, _ in lists])
            for kept, bit in lists:
                for r, s, j in kept:
                    e = d.setdefault(r, [0, np.nan, np.nan, None, 0])
                    e[0] |= bit
                    if bit == 1:
                        e[1] = s
                    else:
                        e[2] = s
                        e[3] = ann_vecs[i, j]  # type: ignore[index]
            for pos, r in enumerate(order):
                d[r][4] = pos
            union.append(d)
        m = max(1, max(len(d) for d in union))
        rows = np.zeros((b, m), np.int64)
        valid = np.zeros((b, m), bool)
        for i, d in enumerate(union):
            rows[i, :len(d)] = list(d)
            valid[i, :len(d)] = True
        t["union"] = _ms(t0)
        probs = None
        l1_parts = None
        if do_rank:
            t0 = time.perf_counter()
            rows_t = torch.from_numpy(rows).to(self.device)
            vecs = self.item_vecs[rows_t].clone()  # [B, M, D]
            if ann_vecs is not None:  # the ANN candidates' vectors are the ones the index returned
                at = [(i, j, e[3]) for i, d in enumerate(union) for j, e in enumerate(d.values()) if e[3] is not None]
                if at:  # one host-to-device copy for all of them
                    ii = torch.tensor([a[0] for a in at], device=self.device)
                    jj = torch.tensor([a[1] for a in at], device=self.device)
                    vecs[ii, jj] = torch.from_numpy(np.stack([np.asarray(a[2]) for a in at])).to(vecs)
            logits = self.score_candidates(cache, rows_t, vecs, request_surface, request_ts)  # [B, M, C]
            p = torch.sigmoid(logits.float())
            util = (p * u).sum(-1)  # [B, M]
            dot = torch.zeros_like(util)  # [B, M] user . candidate vector, where wanted
            if (retrieval_weight > 0 or keep_parts) and user is not None:
                dot = (user.float()[:, None, :] * vecs.float()).sum(-1)
            sid_lp_m = _sid_lp_matrix(union, b, m) if sid_weight > 0 or keep_parts else None
            fused = action_weight * util
            if retrieval_weight > 0:
                fused = fused + retrieval_weight * dot
            if sid_lp_m is not None and sid_weight > 0:
                fused = fused + sid_weight * torch.from_numpy(sid_lp_m).to(fused)
            score = fused.cpu().numpy()  # [B, M]
            if keep_parts and sid_lp_m is not None:
                l1_parts = {"rows": np.where(valid, rows, -1), "utility": util.cpu().numpy(),
                            "dot": dot.cpu().numpy(), "sid_lp": sid_lp_m}
            probs = p.cpu().numpy()
            t["rank"] = _ms(t0)
        else:
            score = np.zeros((b, m), np.float64)
            for i, d in enumerate(union):
                for j, (r, e) in enumerate(d.items()):
                    if srcs == ("sid",):
                        score[i, j] = e[1]
                    elif srcs == ("ann",):
                        score[i, j] = e[2]
                    else:
                        score[i, j] = 1.0 / (1.0 + e[4])
        # ---- top K
        t0 = time.perf_counter()
        kk = min(k, m)
        out = BatchResult(rows=np.full((b, kk), -1, np.int64), scores=np.full((b, kk), np.nan),
                          src=np.zeros((b, kk), np.int8), sid_lp=np.full((b, kk), np.nan),
                          ann_score=np.full((b, kk), np.nan),
                          probs=None if probs is None else np.full((b, kk, probs.shape[-1]), np.nan), beams=beams)
        for i, d in enumerate(union):
            ents = list(d.values())
            masked = np.where(valid[i], score[i], -np.inf)
            top = [j for j in np.argsort(-masked, kind="stable")[:kk] if valid[i, j]]
            n = len(top)
            out.rows[i, :n] = rows[i, top]
            out.scores[i, :n] = score[i, top]
            out.src[i, :n] = [ents[j][0] for j in top]
            out.sid_lp[i, :n] = [ents[j][1] for j in top]
            out.ann_score[i, :n] = [ents[j][2] for j in top]
            if probs is not None and out.probs is not None:
                out.probs[i, :n] = probs[i, top]
        t["topk"] = _ms(t0)
        t["total"] = sum(t.values())
        out.timings_ms = t
        out.l1_parts = l1_parts
        return out

    # ------------------------------------------------------------------ public
    def warmup(self, *, k: int = 10, beam_width: int = 20, min_bucket: int = 64) -> list[int]:
        """Capture the CUDA graphs of the common shapes before serving: one request per history
        bucket (powers of two from ``min_bucket`` up to the context length) at the default beam
        width, so the first real requests do not pay a capture (~0.1-1 s each). Nothing to do
        when no stage is graphed (CPU, ``GENREC_CUDA_GRAPHS=off``). Returns the history lengths run."""
        if self.cuda_graphs == "off" or len(self.catalog) == 0:
            return []
        lens, n = [], min_bucket
        while n < self.context_len:
            lens.append(n)
            n *= 2
        lens.append(self.context_len)
        ids = self.catalog.item_ids
        for n in lens:
            self.recommend([{"item_id": int(ids[i % len(ids)])} for i in range(n)], k=k, beam_width=beam_width,
                           sources=None, rank=None)  # every stage this model has (a TIGER layout: SID only)
        return lens

    def recommend(self, history: Sequence[Any], *, k: int = 10, beam_width: int = 20, diversity_lambda: float = 0.0,
                  sources: Sequence[str] | None = None, rank: bool | None = None, overretrieve: int = 3,
                  utility: Mapping[str, float] | None = None, exclude_history: bool = False,
                  surface: str | int | None = None, request_ts: int | None = None,
                  retrieval_weight: float | None = None, sid_weight: float | None = None,
                  action_weight: float | None = None) -> RecommendationList | list[RecommendationList]:
        """Top-``k`` items for one history (-> RecommendationList) or a batch of them (-> list of them).

        ``sources=None`` / ``rank=None`` mean "every stage this model has" (a TIGER-layout model has
        no ANN or ranking stage; a dense-only one no SID stage). ``surface`` is the request surface
        (default: the last history item's); ``request_ts`` the request time (default: the last
        history item's timestamp). ``action_weight`` / ``retrieval_weight`` / ``sid_weight``: the L1
        score fusion (see :meth:`_run_batch`; None: :attr:`fusion`'s). ``exclude_history``: return
        none of the items in ``history`` -- every one given, also those older than the newest
        ``context_len`` the model reads (the stages over-retrieve by that many, so ``k`` remain)."""
        t_wall = time.perf_counter()
        is_batch = len(history) > 0 and all(isinstance(h, (list, tuple)) for h in history)
        hs = list(history) if is_batch else [history]
        if not hs:
            raise DataError("empty batch of histories", field="history")
        parsed = [self.parse_history(h, f"history[{i}]" if is_batch else "history") for i, h in enumerate(hs)]
        mb = self.model_batch(parsed)
        t_parse = _ms(t_wall)
        surf = None
        if surface is not None:
            s = self._vocab_index(surface, self.surfaces, "surface", "surface")
            surf = torch.full((len(hs),), s, dtype=torch.int64, device=self.device)
        else:
            surf = torch.tensor([int(p["surfaces"][-1]) for p in parsed], dtype=torch.int64, device=self.device)
        rts = None
        if request_ts is not None:
            rts = torch.full((len(hs),), int(request_ts), dtype=torch.int64, device=self.device)
        # the whole given history, not only the newest context_len items the model reads
        excl = [p["seen_rows"] for p in parsed] if exclude_history else None
        res = self.run_batch(mb, k=k, beam_width=beam_width, diversity_lambda=diversity_lambda, sources=sources,
                             rank=rank, overretrieve=overretrieve, utility=utility, exclude_rows=excl,
                             request_surface=surf, request_ts=rts, retrieval_weight=retrieval_weight,
                             sid_weight=sid_weight, action_weight=action_weight)
        t0 = time.perf_counter()
        sids = None  # SIDs of every result row in ONE device->host copy (not one per item)
        if self.codes is not None:
            sids = self.codes[torch.from_numpy(np.maximum(res.rows, 0)).to(self.codes.device)].cpu().numpy()  # [B, K, L]
        outs = []
        for i, p in enumerate(parsed):
            recs = []
            for j in range(res.rows.shape[1]):
                r = int(res.rows[i, j])
                if r < 0:
                    continue
                bits = int(res.src[i, j])
                recs.append(Recommendation(
                    item_id=int(self.catalog.item_ids[r]),
                    title=self.catalog.titles[r] if self.catalog.titles is not None else None,
                    score=float(res.scores[i, j]),
                    sources=tuple(s for s in SOURCES if bits & _SRC_BIT[s]),
                    sid=None if sids is None else tuple(int(c) for c in sids[i, j]),
                    action_probs=None if res.probs is None else
                    {a: float(res.probs[i, j, c]) for c, a in enumerate(self.actions)},
                    sid_logprob=None if np.isnan(res.sid_lp[i, j]) else float(res.sid_lp[i, j]),
                    ann_score=None if np.isnan(res.ann_score[i, j]) else float(res.ann_score[i, j])))
            outs.append(RecommendationList(recs, timings_ms=res.timings_ms, dropped_items=p["dropped"],
                                           history_used=len(p["rows"]), history_truncated=p["truncated"]))
        # outside the pipeline's "total": parsing + batching, building the results, the whole call
        extra = {"parse": t_parse, "respond": _ms(t0), "wall": _ms(t_wall)}
        for o in outs:
            o.timings_ms.update(extra)
        return outs if is_batch else outs[0]

def find_checkpoint(workdir: str | Path, checkpoint: str | Path | None = None) -> Path:
    """The checkpoint folder a command serves or evaluates: ``checkpoint`` None = BEST if marked else LATEST;
    "BEST" / "LATEST"; or a folder. A clear :class:`ConfigError` when there is none."""
    wd = WorkDir(workdir)
    if checkpoint is None or str(checkpoint).upper() in (BEST, LATEST):
        marks = (BEST, LATEST) if checkpoint is None else (str(checkpoint).upper(),)
        ckpt = next((c for m in marks if (c := resolve_checkpoint(wd.checkpoints, m)) is not None), None)
        if ckpt is None:
            raise ConfigError(f"no checkpoint under {wd.checkpoints} ({checkpoint or 'BEST/LATEST'}): "
                              f"run `genrec train {wd.root}` first")
        return ckpt
    ckpt = resolve_checkpoint(Path(checkpoint))
    if ckpt is None:
        raise ConfigError(f"checkpoint {checkpoint}: not a checkpoint folder (one holding model.safetensors and "
                          f"meta.json, or a checkpoints root with LATEST); or give BEST / LATEST for those under "
                          f"{wd.checkpoints}")
    return ckpt


@dataclass
class SourceIds:
    """The source file's own ids of a dataset prepared with ``map_ids`` (users and items numbered
    0..n-1 in the tables): ``users`` / ``items`` map an original id, as text, to the table's id;
    ``item_original`` maps back. What a person types and reads is the original id."""

    users: dict[str, int]
    items: dict[str, int]
    item_original: dict[int, Any]

    @classmethod
    def of(cls, workdir: str | Path) -> "SourceIds | None":
        """The maps of WORKDIR's tables, or None when its ids were not remapped."""
        import json

        store = open_store(workdir)
        extra = store.info().extra or {}
        if not extra.get("map_ids"):
            return None
        users = {str(u): i for i, u in enumerate(extra.get("user_ids") or [])}
        it = store.read_items()
        back: dict[int, Any] = {}
        for iid, attrs in zip(it.column("item_id").to_pylist(), it.column("attributes").to_pylist()):
            orig = json.loads(attrs or "{}").get("original_id")
            if orig is not None:
                back[int(iid)] = orig
        return cls(users, {str(o): i for i, o in back.items()}, back)

    def user(self, original: str) -> int:
        if str(original) not in self.users:
            raise DataError(f"user {original!r} is not in the source data (its ids were remapped with map_ids: "
                            f"give the id as it appears in the source file)", field="user_id")
        return self.users[str(original)]


def user_history(workdir: str | Path, user_id: int) -> list[dict[str, Any]]:
    """All events of ``user_id`` in WORKDIR's tables, in ``seq`` order, as history entries."""
    return user_case(workdir, user_id)[0]


def user_case(workdir: str | Path, user_id: int, role: str | None = None,
              split_kind: str = "loo") -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``user_id``'s events as history entries, and with ``role`` ("valid" / "test") the evaluation case
    ``genrec eval`` scores for them under ``split_kind``: the events before that split's target, and the
    target ({item_id, action, ts, seq}). ``role`` None: every event, no target."""
    store = open_store(workdir)
    bucket = int(user_bucket(np.array([user_id], dtype=np.int64), store.n_buckets)[0])
    ev = store.read_events(bucket)
    ev = ev.filter(pc.equal(ev.column("user_id"), user_id))
    if ev.num_rows == 0:
        raise DataError(f"user {user_id} has no events", path=WorkDir(workdir).tables, field="user_id")
    ev = ev.sort_by("seq")
    hist = [{"item_id": int(i), "action": a, "surface": s, "ts": int(t)} for i, a, s, t in zip(
        ev.column("item_id").to_pylist(), ev.column("action").to_pylist(), ev.column("surface").to_pylist(),
        ev.column("timestamp").to_pylist())]
    if role is None:
        return hist, None
    if role not in ("valid", "test"):
        raise ConfigError(f"--as-of: 'valid' or 'test', got {role!r}")
    spec = SplitSpec(kind=split_kind)  # type: ignore[arg-type]
    if spec.kind == "temporal":  # the cut is a quantile of every event's time, not this user's
        spec = spec.resolve(store.read_events(columns=["timestamp"]).column("timestamp"))
    t = int(compute_cutoffs(ev, spec).target_seq(role)[0])  # type: ignore[arg-type]
    if t < 0:
        raise DataError(f"user {user_id} has no {role} case under the {split_kind} split (too few events, or none "
                        f"on both sides of the cut)", field="user_id")
    seqs = ev.column("seq").to_pylist()
    j = seqs.index(t)
    return hist[:j], {**hist[j], "seq": t}


def _dataset_vocab(wd: WorkDir, mcfg: ModelConfig) -> tuple[list[str], list[str], list[str]]:
    """(actions, positive actions, surfaces) from the tables; generic names when the tables are gone."""
    store = TableStore(wd.tables)
    if store.exists():
        info = store.info()
        if len(info.actions) != mcfg.n_actions:
            raise ConfigError(f"{wd.tables}: {len(info.actions)} actions, the model has {mcfg.n_actions}")
        surfaces = list(info.surfaces) or ["default"]
        return list(info.actions), list(info.positive_actions), surfaces
    acts = [f"action{i}" for i in range(mcfg.n_actions)]
    return acts, acts, [f"surface{i}" for i in range(mcfg.n_surfaces)]


def _round_robin(lists: list[list[int]]) -> list[int]:
    out: list[int] = []
    seen: set[int] = set()
    for j in range(max((len(x) for x in lists), default=0)):
        for x in lists:
            if j < len(x) and x[j] not in seen:
                seen.add(x[j])
                out.append(x[j])
    return out


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0
