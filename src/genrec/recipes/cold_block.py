"""ANN recall of a ``genrec cold-start`` run for several lengths of the cold items' imputed engagement block
(``genrec.catalog.load_catalog(cold_engagement_scale=...)``), on the protocol's VALIDATION cases, to choose
``genrec.catalog.COLD_ENGAGEMENT_SCALE`` without looking at test (docs/RESULTS.md, C1).

The cold-start protocol keeps a withheld item's event only where it is a user's last one (the test target), so its
own validation split has no cold target. The validation cases here are the protocol applied one event earlier: the
base run's events without each user's last one, the same items withheld (same fraction and seed, so the same
items), and each user's last remaining event -- the original leave-one-out validation target -- asked for from
the history before it without the withheld items. No such event was trained on: a cold item's events are all out
of the run's training split, a warm target is the run's own validation target.

    python -m genrec.recipes.cold_block runs/ml runs/ml-cold-ce [--scales 0,0.6,0.7,0.8,0.9,1] [--split test]

:func:`score_scales` gives one dict per scale (the command prints each as a JSON line): ANN recall@10/@20 on all
cases, the cold and the warm ones, and the share of all top-10 slots that cold items fill (beside their share of the
catalogue).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from genrec.catalog import load_catalog
from genrec.data.join import BucketJoinReader
from genrec.data.splits import SplitSpec
from genrec.data.store import TableStore
from genrec.errors import ConfigError
from genrec.eval.retrieval import evaluate_retrieval, make_eval_set
from genrec.infer.catalog_model import CatalogModel
from genrec.infer.load import find_checkpoint, load_model, read_run_config
from genrec.recipes import pipeline
from genrec.recipes.coldstart import withhold_items
from genrec.workdir import WorkDir, read_json


def validation_store(base: Path, frac: float, seed: int, cold: np.ndarray, into: Path) -> TableStore:
    """Tables whose leave-one-out test cases are the cold-start protocol's validation cases (module docstring)."""
    ds = TableStore(WorkDir(base).tables).read()
    users = ds.events.column("user_id").to_numpy()
    last = np.r_[users[1:] != users[:-1], True]  # events are sorted by (user, seq)
    ds = dataclasses.replace(ds, events=ds.events.filter(pa.array(~last)))
    ds, again = withhold_items(ds, frac, seed)
    if not np.array_equal(np.sort(again), np.sort(cold)):
        raise ConfigError(f"{base}: frac {frac} / seed {seed} withhold other items than the cold-start run did")
    store = TableStore(into)
    store.write(ds, n_buckets=4, overwrite=True)
    return store


def score_scales(base: str | Path, run: str | Path, scales: Sequence[float],
                 split: str = "valid") -> list[dict[str, Any]]:
    """ANN recall@10/@20 of cold-start ``run`` (made from the prepared run ``base``) on the ``split`` cases, all,
    cold and warm, and the cold items' share of all top-10 slots, per cold-block length in ``scales``."""
    if split not in ("valid", "test"):
        raise ConfigError(f"split must be 'valid' or 'test', got {split!r}")
    run = Path(run)
    rep = read_json(run / "reports" / "cold_start.json")
    cold = np.asarray(rep["cold_item_ids"], np.int64)
    info = TableStore(WorkDir(run).tables).read().info.extra["cold_start"]
    ckpt = find_checkpoint(run)
    model, _ = load_model(ckpt)
    ctx = int(read_run_config(ckpt).get("run", {}).get("data", {}).get("context_len", 50))
    with tempfile.TemporaryDirectory() as tmp:
        if split == "valid":
            store = validation_store(Path(base), float(info["frac"]), int(info["seed"]), cold, Path(tmp))
        else:
            store = pipeline.open_store(run)
        recs = list(BucketJoinReader(store, split=SplitSpec("loo"), role="test", context_len=ctx))
    rows_out = []
    for s in scales:
        cat = load_catalog(run, cold_engagement_scale=float(s))
        cm = CatalogModel(model.eval(), cat)
        es = make_eval_set(recs, cat)
        rows = cat.rows(cold)
        is_cold = np.isin(es.target_rows, rows)
        out: dict[str, Any] = {"split": split, "scale": float(s), "cases": len(es), "cold_cases": int(is_cold.sum())}
        for group, pick in (("all", np.arange(len(es))), ("cold", np.flatnonzero(is_cold)),
                            ("warm", np.flatnonzero(~is_cold))):
            lists: dict[str, np.ndarray] = {}
            got = evaluate_retrieval(cm, es.subset(pick), paths=("ann",), ks=(10, 20), context_len=ctx,
                                     lists_out=lists)
            out[group] = {k: round(v, 4) for k, v in got["ann"].items() if k.startswith("recall")}
            if group == "all":
                out["cold_share_top10"] = round(float(np.isin(lists["ann"][:, :10], rows).mean()), 4)
        out["cold_share_catalogue"] = round(len(cold) / len(cat), 4)
        rows_out.append(out)
    return rows_out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("base", type=Path, help="the prepared run the cold-start run was made from")
    ap.add_argument("run", type=Path, help="the `genrec cold-start` run (trained, cold items assigned)")
    ap.add_argument("--scales", default="0,0.6,0.7,0.8,0.9,1")
    ap.add_argument("--split", choices=("valid", "test"), default="valid")
    a = ap.parse_args()
    for row in score_scales(a.base, a.run, [float(x) for x in a.scales.split(",")], a.split):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
