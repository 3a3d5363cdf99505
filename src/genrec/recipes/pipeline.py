"""The pipeline steps as library functions (the CLI and notebooks call these; ``genrec.<name>`` too).

data -> features -> sid -> train -> eval / serve, each reading and writing one run
directory (:class:`genrec.workdir.WorkDir`). Every step records what it read in its
manifest, so a later step can check it is looking at the versions it expects::

    import genrec
    genrec.prepare("runs/ml", "movielens-100k", data_dir="datasets")   # genrec data prepare
    # (a later day's logs: genrec.append("runs/ml", "day2/")            # genrec data append)
    # (or a synthetic log of any size: genrec.synthesize("runs/syn", users=10**5, items=10**5, events=10**7))
    genrec.build_item_features("runs/ml")                                # genrec features build
    genrec.build_semantic_ids("runs/ml")                                 # genrec sid build
    genrec.train_model("runs/ml", "cpu-small", ["train.total_steps=500"])  # genrec train
    genrec.tune_fusion("runs/ml")                                        # genrec fusion tune
    report = genrec.evaluate("runs/ml", split="valid")                   # genrec eval
    rec = genrec.recommender("runs/ml")                                  # recommend / serve's model
    rec.recommend([{"item_id": 50, "action": "like"}, 172], k=10)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from genrec.catalog import load_catalog, open_store
from genrec.data.append import append_dataset, append_options
from genrec.data.ingest import REGISTRY, IngestOptions, prepare_dataset
from genrec.data.splits import SplitSpec, train_events
from genrec.data.store import TableStore, catalog_config
from genrec.data.synth import synthesize
from genrec.errors import ConfigError
from genrec.eval.evaluate import EvalConfig, run_eval
from genrec.eval.evaluate import evaluate as _evaluate
from genrec.eval.fusion_tune import tune_fusion as _tune
from genrec.features.build import build_features
from genrec.features.extend import new_item_content
from genrec.features.store import ItemVectors
from genrec.infer.recommender import Recommender
from genrec.recipes import retrieval_first
from genrec.recipes.model_sids import model_item_vectors, new_item_model_vectors
from genrec.sid.build import assign_sids, build_sids, open_current
from genrec.sid.source import (MODEL_SOURCE, choose_sid_source, features_text_quality, new_item_vectors,
                               sid_input_vectors)
from genrec.train.run import RunConfig
from genrec.workdir import WorkDir, clean_stale_tmp, read_json

__all__ = ["append", "assign_new_items", "build_item_features", "build_semantic_ids", "default_split", "evaluate",
           "load_catalog", "new_item_sid_vectors", "open_store",
           "prepare", "recommender", "synthesize", "train_model", "tune_fusion"]


def prepare(workdir: str | Path, dataset: str, *, source: str | Path | None = None,
            data_dir: str | Path | None = None, n_buckets: int = 16, overwrite: bool = True,
            options: IngestOptions | None = None) -> dict[str, Any]:
    """Ingest ``dataset`` into canonical Iceberg tables under ``WORKDIR/tables``; returns the manifest.
    (The run directory comes first, as everywhere in this module; the CLI reads ``DATASET WORKDIR``.)"""
    if str(dataset) not in REGISTRY and str(workdir) in REGISTRY:
        raise ConfigError(f"prepare(workdir, dataset): {str(workdir)!r} is a dataset name and {str(dataset)!r} is "
                          f"not -- the arguments look swapped (the CLI's order is `genrec data prepare DATASET "
                          f"WORKDIR`)")
    ds = prepare_dataset(dataset, source, data_dir=data_dir, options=options)  # errors before any folder is made
    wd = WorkDir(workdir).ensure()
    store = TableStore(wd.tables, catalog_config())
    return store.write(ds, n_buckets=n_buckets, overwrite=overwrite)


def append(workdir: str | Path, source: str | Path, *, skip_duplicates: bool = False,
           columns: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """``genrec data append``: a later day's logs (``source``, read by the ingestor the tables were prepared
    with, under their rules: :func:`genrec.data.append.append_options`; ``columns`` and ``options`` for what
    the new files need) added to WORKDIR's tables as one new data version, atomically
    (:mod:`genrec.data.append`). Returns the new ``tables_version``, what was added and the totals."""
    store = open_store(workdir)
    info = store.info()
    if info.name not in REGISTRY:
        raise ConfigError(f"{store.tables_dir} holds {info.name!r} tables (not read from files by an ingestor): "
                          f"`genrec data append` can only add logs to tables `genrec data prepare` made")
    ds = prepare_dataset(info.name, source, options=append_options(info, columns=columns, **options))
    man, plan = append_dataset(store, ds, skip_duplicates=skip_duplicates, where=str(source))
    return {"tables_version": man.get("tables_version"), "data_version": man.get("data_version"),
            "added": plan.added, "counts": man["counts"], "notes": plan.notes}


DISAMBIGUATIONS = ("item-id", "popularity")


def default_split(store: TableStore) -> SplitSpec:
    return SplitSpec(kind="loo")


def build_item_features(workdir: str | Path, *, content: str = "tfidf", content_dim: int = 64,
                        engagement_dim: int = 64, seed: int = 0, split: SplitSpec | None = None) -> Any:
    """Content + engagement vectors; engagement sees the TRAIN split only (no valid/test leakage)."""
    wd = WorkDir(workdir)
    store = open_store(wd.root)
    spec = split or default_split(store)
    events = store.read_events()
    tr = train_events(events, spec)
    clean_stale_tmp(wd.root)
    return build_features(store.read_items(), tr, wd.features, content=content, content_dim=content_dim,
                          engagement_dim=engagement_dim, seed=seed,
                          inputs={"tables_manifest": str(store.manifest_path), "split": spec.kind})


def build_semantic_ids(workdir: str | Path, *, levels: int | None = None, codebook_size: int | None = None,
                       method: str = "rqkmeans", seed: int = 0, source: str | None = None,
                       engagement_weight: float = 1.0, from_run: str | Path | None = None,
                       checkpoint: str | Path | None = None, disambiguation: str = "popularity") -> Any:
    """Quantise the item vectors into a new SID version under ``WORKDIR/sid``: the content
    vectors (``source="content"``, PinGER's choice), content beside engagement (collaborative
    SIDs, see :func:`genrec.sid.source.sid_input_vectors`), engagement alone, or (``"model"``) the item
    vectors of the model trained in run ``from_run`` (``checkpoint`` of it; its ANN index's vectors:
    :mod:`genrec.recipes.model_sids`). ``None``: content beside engagement (content without engagement
    vectors), or engagement when ``features build`` found the item text degenerate (said on stderr; :func:`genrec.sid.source.choose_sid_source`).
    ``levels`` None: :func:`genrec.sid.build.default_levels` (one level of up to 1,024 codes up to 16,384 items).
    ``disambiguation``: how items sharing a semantic code are numbered on the last level -- ``popularity`` (most
    train-split interactions first) or ``item-id``."""
    if disambiguation not in DISAMBIGUATIONS:
        raise ConfigError(f"--disambiguation must be one of {', '.join(DISAMBIGUATIONS)}, got {disambiguation!r}")
    wd = WorkDir(workdir)
    if (source == MODEL_SOURCE) != (from_run is not None):
        raise ConfigError("--source model needs --from-run RUN (the trained run whose item vectors are quantised)"
                          if from_run is None else f"--from-run {from_run}: only with --source model (got "
                          f"--source {source or 'the default'})")
    if checkpoint is not None and from_run is None:
        raise ConfigError("--checkpoint: only with --source model --from-run RUN (a checkpoint of RUN)")
    vecs = ItemVectors.load(wd.features)
    has_eng = vecs.engagement is not None and np.asarray(vecs.engagement).shape[-1] > 0
    choice = choose_sid_source(features_text_quality(wd.features), source, has_engagement=has_eng)
    if choice.message is not None:
        print(choice.message, file=sys.stderr)
    source = choice.source
    inputs: dict[str, Any] = {"features": str(wd.features), "source": source}
    if from_run is not None:  # (source "model": checked above)
        x, made = model_item_vectors(from_run, np.asarray(vecs.item_ids), checkpoint=checkpoint, workdir=wd.root)
        inputs.update(made)
    else:
        x = sid_input_vectors(np.asarray(vecs.content), np.asarray(vecs.engagement), source, engagement_weight)
    if source not in ("content", MODEL_SOURCE):
        inputs["engagement_weight"] = float(engagement_weight)
    ids = np.asarray(vecs.item_ids)
    popularity = None
    if disambiguation == "popularity":
        store = open_store(wd.root)
        popularity = train_item_counts(store, default_split(store), ids)
    return build_sids(x, ids, wd.sid, levels=levels, codebook_size=codebook_size, method=method, seed=seed,
                      inputs=inputs, popularity=popularity)


def train_item_counts(store: TableStore, spec: SplitSpec, item_ids: np.ndarray) -> np.ndarray:
    """int64 per item of ``item_ids``: its interactions in the train split (0 for an item with none)."""
    seen, counts = np.unique(train_events(store.read_events(), spec).column("item_id").to_numpy(),
                             return_counts=True)
    out = np.zeros(len(item_ids), dtype=np.int64)
    if len(seen):
        pos = np.minimum(np.searchsorted(seen, item_ids), len(seen) - 1)
        hit = seen[pos] == item_ids
        out[hit] = counts[pos[hit]]
    return out


def assign_new_items(workdir: str | Path, *, publish_if_grown: bool = False) -> Any:
    """``genrec sid assign WORKDIR`` (no ``--vectors``): the items of WORKDIR's tables that neither the item
    features nor the current SID version hold -- those a ``genrec data append`` added -- get content vectors
    from the features' own encoder (:func:`genrec.features.extend.new_item_content`) and codes from the
    current version's frozen codebooks, in a new SID version that adds them to the served catalogue
    (:func:`genrec.sid.build.assign_sids`; CURRENT unless the last level grew, or ``publish_if_grown``).
    No such item: the current version, unchanged."""
    wd = WorkDir(workdir)
    store = open_store(wd.root)
    cur = open_current(wd.sid)
    ids, content = new_item_content(wd.features, store.read_items(), exclude=np.asarray(cur.item_ids))
    inputs = {"tables_version": store.tables_version, "features": str(wd.features),
              "vectors": "content of new items from the features' encoder (genrec.features.extend)"}
    if not len(ids):
        cur.stats = {**cur.stats, "assigned": {"requested": 0, "new": 0, "already_present": 0,
                                               "reconstruction_new": [], "final_level_grew": False, "unchanged": True}}
        return cur
    x = new_item_sid_vectors(cur.path, content, ids, cur.quantizer.dim)
    return assign_sids(wd.sid, x, ids, inputs, content=content, publish_if_grown=publish_if_grown)


def new_item_sid_vectors(version_path: str | Path, content: Any, item_ids: Any, quantizer_dim: int) -> np.ndarray:
    """What ``sid assign`` quantises for NEW items (``content``: their content vectors, rows as ``item_ids``) under
    the recipe of the SID version at ``version_path``: :func:`genrec.sid.source.new_item_vectors`, or for a
    ``--source model`` version the recorded model's item vectors of them
    (:func:`genrec.recipes.model_sids.new_item_model_vectors`)."""
    inputs = read_json(Path(version_path) / "manifest.json").get("inputs", {})
    if inputs.get("source") == MODEL_SOURCE:
        return new_item_model_vectors(version_path, content, item_ids)
    return new_item_vectors(version_path, content, quantizer_dim)


def train_model(workdir: str | Path, preset: str = "cpu-small", overrides: list[str] | tuple[str, ...] = (), *,
                resume: bool = True) -> dict[str, Any]:
    """``genrec train``: the joint model on WORKDIR's tables, features and SIDs, from a named preset and
    ``key=value`` overrides (``variant=tiger``, ``train.lr=3e-4``, ...); returns the run's summary. As the command:
    a warm start resumed keeps its start, and ``retrieval_first`` trains two phases
    (:func:`genrec.recipes.retrieval_first.train`)."""
    return retrieval_first.train(workdir, RunConfig.from_name(preset, list(overrides)), resume=resume)


def evaluate(workdir: str | Path, *, split: str = "test", write: bool = True, **options: Any) -> dict[str, Any]:
    """``genrec eval``: every path, popularity and the ranking metrics on one split; ``options`` are
    :class:`genrec.eval.evaluate.EvalConfig` fields (``max_users``, ``beam_width``, ...). ``write``: also
    write the report files under ``WORKDIR/reports`` (their paths in the returned report's ``files``)."""
    cfg = EvalConfig(split=split, **options)
    if not write:
        return _evaluate(workdir, cfg)
    report, files = run_eval(workdir, cfg)
    return {**report, "files": {k: str(v) for k, v in files.items()}}


def tune_fusion(workdir: str | Path, **options: Any) -> dict[str, Any]:
    """``genrec fusion tune``: the L1 score-fusion weights chosen on validation, stored for the checkpoint
    (``options``: ``checkpoint``, ``max_users``, ``beam_width``, ``metric``, ...)."""
    return _tune(workdir, **options)


def recommender(workdir: str | Path, checkpoint: str | Path | None = None, *, device: str = "cpu") -> Recommender:
    """The trained model with its catalogue, SIDs and ANN index, as ``genrec recommend`` and ``genrec serve``
    load it (:class:`genrec.infer.recommender.Recommender`: ``recommend``, ``encode``, ``score_candidates``)."""
    return Recommender.from_checkpoint(workdir, checkpoint, device=device)
