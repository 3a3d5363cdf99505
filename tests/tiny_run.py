"""The tiny trained run many tests share: MovieLens-100K (the real one or its synthetic stand-in, whichever
``data_root`` holds; or another dataset from ``source``), random item features (fast), 2-level SIDs, the
cpu-tiny preset for a few steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from genrec.features.store import ItemVectors
from genrec.recipes import pipeline as P
from genrec.recipes.training import train_run
from genrec.train.run import RunConfig
from genrec.workdir import WorkDir


def build_run(root: Path, data_root: Path, *, steps: int = 6, dataset: str = "movielens-100k",
              source: Path | None = None, seed: int = 1) -> Path:
    """Prepare, features (random, drawn with ``seed``), SIDs and ``steps`` training steps in ``root``."""
    P.prepare(root, dataset, source=source, data_dir=data_root)
    ids = np.asarray(P.open_store(root).read_items().column("item_id").to_numpy(), dtype=np.int64)
    rng = np.random.default_rng(seed)
    ItemVectors(ids, rng.normal(size=(len(ids), 12)).astype(np.float32),
                rng.normal(size=(len(ids), 12)).astype(np.float32)).save(WorkDir(root).features)
    P.build_semantic_ids(root, levels=2, codebook_size=8)
    train_run(root, RunConfig.from_name("cpu-tiny", [f"train.total_steps={steps}", "train.ckpt_every=0",
                                                     "data.valid_cases=16", "data.context_len=12"]))
    return root
