"""Cold-start protocol (issue 4): can a model retrieve items it never saw in training?

A random ``frac`` of the catalogue is withheld: every interaction with those items is
removed from the users' histories, except a user's LAST event (the leave-one-out test
target), so the test set still asks for them. Item vectors are rebuilt on the reduced data
(content from text for every item; engagement from the train split, which never contains a
cold item — their engagement vectors are zero). Semantic IDs are quantised on the warm
items only; the cold items get codes afterwards from the frozen codebook
(:func:`genrec.sid.build.assign_sids`, as ``genrec sid assign`` does), exactly as a new item
would in production. The joint model trains on the reduced data, and Recall@K is reported
per path on the test cases whose target is a cold item. An ID-only model has nothing to
retrieve them with; genrec's SID path (content-derived codes) and ANN path (content-fed item
vectors) can.
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
from genrec.eval.retrieval import EvalSet, evaluate_retrieval, make_eval_set
from genrec.infer.recommender import Recommender
from genrec.recipes import pipeline
from genrec.recipes.training import train_run
from genrec.sid.build import assign_sids, build_sids, open_current
from genrec.train.run import RunConfig
from genrec.workdir import WorkDir, atomic_write_json


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
                   beam_width: int = 20) -> dict[str, Any]:
    """Build the cold-start run in ``out`` from the prepared tables of ``base``; returns the metrics."""
    wd = WorkDir(out).ensure()
    ds, cold = withhold_items(TableStore(WorkDir(base).tables).read(), frac, seed)
    TableStore(wd.tables).write(ds, n_buckets=4, overwrite=True)
    vecs = pipeline.build_item_features(wd.root)
    ids = np.asarray(vecs.item_ids)
    warm = ~np.isin(ids, cold)
    content = np.asarray(vecs.content)
    build_sids(content[warm], ids[warm], wd.sid, levels=levels, inputs={"cold_start": "warm items only"})
    assign_sids(wd.sid, content[~warm], ids[~warm], inputs={"cold_start": "withheld items"})
    cfg = RunConfig.from_name(preset, list(overrides or []))
    res = train_run(wd.root, cfg, resume=False)

    store = pipeline.open_store(wd.root)
    catalog = pipeline.load_catalog(wd.root)
    recs = list(BucketJoinReader(store, split=SplitSpec("loo"), role="test", context_len=cfg.data.context_len))
    es_all = make_eval_set(recs, catalog)
    cold_rows = set(catalog.rows(cold).tolist())
    pick = [i for i, r in enumerate(es_all.target_rows.tolist()) if r in cold_rows]
    es = EvalSet([es_all.examples[i] for i in pick], es_all.target_rows[pick])
    rec = Recommender.from_checkpoint(wd.root)
    sb = open_current(wd.sid)
    trie, leaf_rows = rec.trie, rec.leaf_rows  # the device trie and leaf map the Recommender serves with
    metrics = evaluate_retrieval(rec.catalog_model, es, beam_width=beam_width, context_len=cfg.data.context_len,
                                 trie=trie, leaf_rows=leaf_rows) if len(es) else {}
    if len(es) and "sid" in metrics:  # coarse-prefix SID retrieval (levels 1..L-1, then the index)
        L = len(sb.codebook_sizes)
        expansion = (np.asarray(sb.trie.leaf_start[L - 1]), np.asarray(sb.trie.codes[L - 1]))
        metrics["sid_prefix"] = evaluate_retrieval(
            rec.catalog_model, es, paths=("sid",), beam_width=beam_width, context_len=cfg.data.context_len, trie=trie,
            leaf_rows=leaf_rows, prefix_expansion=expansion)["sid"]
    report = {"cold_items": int(len(cold)), "cold_test_cases": len(es), "all_test_cases": len(es_all),
              "recall@10": {p: m["recall@10"] for p, m in metrics.items()},
              "metrics": metrics, "train_step": res["step"], "sid_version": sb.version,
              "cold_item_ids": [int(c) for c in cold]}
    wd.reports.mkdir(parents=True, exist_ok=True)
    atomic_write_json(wd.reports / "cold_start.json", report)
    return report
