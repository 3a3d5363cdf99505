"""Cold-start protocol (issue 4; served path, issue 41): can a model retrieve items it never saw in training?

A random ``frac`` of the catalogue is withheld: every interaction with those items is
removed from the users' histories, except a user's LAST event (the leave-one-out test
target), so the test set still asks for them. Item vectors are built on the reduced data
(content from text for every item; engagement from the train split, which never contains a
cold item -- their engagement vectors are zero). Semantic IDs are quantised on the warm
items only, from ``source`` (``genrec sid build``'s default, content beside engagement, or content alone);
the cold items get codes from the frozen codebook as ``genrec sid assign`` gives them
(:func:`genrec.sid.source.new_item_vectors`: a collaborative codebook's engagement block imputed from the
nearest warm items by content; :func:`genrec.sid.build.assign_sids`). Two orders:

* ``assign="after"`` (default; the served path): the model trains on the warm catalogue, then the cold
  items are assigned with their content vectors -- a new SID version the Recommender loads without
  retraining, exactly as a new item reaches a running server. Their final codes are codes the model never
  saw a positive for (or past its last-level head when the level grew): full-code beams miss them, the
  coarse-prefix retrieval (:mod:`genrec.decode.prefix`) scores them by the new-code rule.
* ``assign="before"`` (the first protocol): the cold items are coded before training, so they sit in the
  training catalogue (as negatives) and the model's head covers their codes.

Recall@K is reported per path -- full-code SID, the served coarse-prefix retrieval ("prefix", "merged"),
ANN -- on the test cases whose target is a cold item, and beside it on those whose target is warm (the
warm baseline, same model and paths). An ID-only model has nothing to retrieve cold items with; genrec's
SID path (content-derived codes) and ANN path (content-fed item vectors: a cold item's engagement block, and its ID
vector in a model with them, imputed from its content neighbours, :mod:`genrec.infer.catalog_model`) can.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genrec.data.ingest.feedviews import build_feedviews
from genrec.data.join import BucketJoinReader
from genrec.data.schema import Dataset
from genrec.data.splits import SplitSpec
from genrec.data.store import TableStore
from genrec.errors import ConfigError
from genrec.eval.retrieval import evaluate_retrieval, make_eval_set
from genrec.features.store import ItemVectors
from genrec.infer.recommender import Recommender
from genrec.recipes import pipeline
from genrec.recipes.training import train_run
from genrec.sid.build import assign_sids, build_sids, open_current
from genrec.sid.source import choose_sid_source, features_text_quality, new_item_vectors, sid_input_vectors
from genrec.train.run import RunConfig
from genrec.workdir import WorkDir, atomic_write_json

COLD_SOURCES = ("content", "content+engagement")
"""What the cold-start SIDs may quantise: sources that can code an item nobody engaged with."""


def withhold_items(ds: Dataset, frac: float, seed: int = 0) -> tuple[Dataset, np.ndarray]:
    """``ds`` without the interactions of a random ``frac`` of items (users' last events kept)."""
    if not 0.0 < frac < 1.0:
        raise ConfigError(f"cold-start fraction must be in (0, 1), got {frac}")
    ev = ds.events
    item_ids = ds.items.column("item_id").to_numpy()
    rng = np.random.default_rng(seed)
    cold = np.sort(rng.choice(item_ids, max(1, int(round(frac * len(item_ids)))), replace=False))
    users = ev.column("user_id").to_numpy()
    last = np.r_[users[1:] != users[:-1], True]  # events are sorted by (user, seq)
    is_cold = np.isin(ev.column("item_id").to_numpy(), cold)
    keep = ~is_cold | last
    ev = ev.filter(pa.array(keep))
    users = ev.column("user_id").to_numpy()
    starts = np.r_[0, np.flatnonzero(users[1:] != users[:-1]) + 1]
    new_seq = np.arange(len(users)) - np.repeat(starts, np.diff(np.r_[starts, len(users)]))
    ev = ev.set_column(ev.schema.get_field_index("seq"), "seq", pa.array(new_seq.astype(np.int32)))
    info = ds.info
    a_idx = np.asarray(pc.index_in(ev.column("action"), pa.array(info.actions)).to_numpy(zero_copy_only=False))
    s_idx = np.asarray(pc.index_in(ev.column("surface"), pa.array(info.surfaces)).to_numpy(zero_copy_only=False))
    fv = build_feedviews(user=users, seq=new_seq, timestamp=ev.column("timestamp").to_numpy(),
                         item=ev.column("item_id").to_numpy(), action_idx=a_idx, surface_idx=s_idx,
                         surfaces=info.surfaces)
    extra = dict(info.extra)
    extra["cold_start"] = {"frac": frac, "seed": seed, "n_cold_items": int(len(cold))}
    info2 = dataclasses.replace(info, extra=extra)
    return Dataset(info=info2, events=ev, items=ds.items, feedviews=fv, source=ds.source), cold


def run_cold_start(base: str | Path, out: str | Path, *, frac: float = 0.05, seed: int = 0,
                   preset: str = "quickstart", overrides: list[str] | None = None, levels: int = 3,
                   beam_width: int = 20, assign: str = "after", ks: tuple[int, ...] = (5, 10, 20),
                   source: str | None = None, engagement_weight: float = 1.0) -> dict[str, Any]:
    """Build the cold-start run in ``out`` from the prepared tables of ``base``; returns the metrics
    (``WORKDIR/reports/cold_start.json``). ``source``: what the SIDs quantise, ``"content"`` or
    ``"content+engagement"`` (the cold items' engagement block imputed from their content neighbours,
    :func:`genrec.sid.source.new_item_vectors`); None: ``genrec sid build``'s default."""
    if assign not in ("after", "before"):
        raise ConfigError(f"assign must be 'after' (the served path) or 'before' (training), got {assign!r}")
    if source not in (None, *COLD_SOURCES):
        raise ConfigError(f"cold-start --source must be one of {', '.join(COLD_SOURCES)}, got {source!r}")
    wd = WorkDir(out).ensure()
    ds, cold = withhold_items(TableStore(WorkDir(base).tables).read(), frac, seed)
    TableStore(wd.tables).write(ds, n_buckets=4, overwrite=True)
    pipeline.build_item_features(wd.root)
    vecs = ItemVectors.load(wd.features, mmap=False)
    ids = np.asarray(vecs.item_ids)
    warm = ~np.isin(ids, cold)
    content = np.asarray(vecs.content)
    engagement = np.asarray(vecs.engagement)
    choice = choose_sid_source(features_text_quality(wd.features), source, has_engagement=engagement.shape[1] > 0)
    if choice.source not in COLD_SOURCES:
        raise ConfigError(f"the SIDs here would quantise {choice.source!r} ({choice.message}), which cannot code an "
                          f"item nobody engaged with: pass --source content")
    if assign == "after":  # the model's catalogue holds the warm items only; the cold ones arrive after training
        ItemVectors(ids[warm], content[warm], engagement[warm], meta=vecs.meta).save(wd.features)
    inputs: dict[str, Any] = {"cold_start": "warm items only", "features": str(wd.features), "source": choice.source}
    if choice.source != "content":
        inputs["engagement_weight"] = float(engagement_weight)
    build_sids(sid_input_vectors(content[warm], engagement[warm], choice.source, engagement_weight), ids[warm],
               wd.sid, levels=levels, inputs=inputs)

    def add_cold() -> None:  # as `genrec sid assign` codes new items: new_item_vectors under the version's recipe
        x = new_item_vectors(open_current(wd.sid).path, content[~warm], open_current(wd.sid).quantizer.dim)
        assign_sids(wd.sid, x, ids[~warm], inputs={"cold_start": "withheld items"},
                    content=content[~warm] if assign == "after" else None)

    if assign == "before":
        add_cold()
    cfg = RunConfig.from_name(preset, list(overrides or []))
    res = train_run(wd.root, cfg, resume=False)
    if assign == "after":
        add_cold()  # a new SID version, CURRENT: the Recommender below loads it without retraining

    rec = Recommender.from_checkpoint(wd.root)
    store = pipeline.open_store(wd.root)
    recs = list(BucketJoinReader(store, split=SplitSpec("loo"), role="test", context_len=cfg.data.context_len))
    es_all = make_eval_set(recs, rec.catalog)
    is_cold = np.isin(es_all.target_rows, rec.catalog.rows(cold))
    metrics: dict[str, dict[str, dict[str, float]]] = {}
    for name, pick in (("cold", np.flatnonzero(is_cold)), ("warm", np.flatnonzero(~is_cold))):
        es = es_all.subset(pick)
        if not len(es):
            continue
        m: dict[str, dict[str, float]] = {}
        kw: dict[str, Any] = dict(ks=ks, beam_width=beam_width, context_len=cfg.data.context_len, trie=rec.trie,
                                  leaf_rows=rec.leaf_rows, known=rec.known_leaves)
        for mode in ("full", "prefix", "merged"):
            got = evaluate_retrieval(rec.catalog_model, es, paths=("ann", "sid") if mode == "full" else ("sid",),
                                     sid_mode=mode, **kw)
            if "ann" in got:
                m["ann"] = got["ann"]
            if "sid" in got:
                m["sid" if mode == "full" else f"sid_{mode}"] = got["sid"]
        metrics[name] = m
    k10 = 10 if 10 in ks else max(ks)
    sb = open_current(wd.sid)
    report = {"source": choice.source, "assign": assign, "cold_items": int(len(cold)), "cold_test_cases": int(is_cold.sum()),
              "warm_test_cases": int((~is_cold).sum()), "train_step": res["step"], "sid_version": sb.version,
              "codebook_sizes": [int(k) for k in sb.codebook_sizes],
              "model_codebook_sizes": list(rec.config.sid_codebook_sizes),
              "untrained_leaves": int((~rec.known_leaves).sum()) if rec.known_leaves is not None else 0,
              f"recall@{k10}": {g: {p: v[f"recall@{k10}"] for p, v in m.items()} for g, m in metrics.items()},
              "metrics": metrics, "cold_item_ids": [int(c) for c in cold]}
    wd.reports.mkdir(parents=True, exist_ok=True)
    atomic_write_json(wd.reports / "cold_start.json", report)
    return report
