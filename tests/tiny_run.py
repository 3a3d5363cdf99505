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
              source: Path | None = None, seed: int = 1, overrides: tuple[str, ...] = ()) -> Path:
    """Prepare, features (random, drawn with ``seed``), SIDs and ``steps`` training steps in ``root``
    (``overrides``: more ``key=value`` training overrides)."""
    P.prepare(root, dataset, source=source, data_dir=data_root)
    ids = np.asarray(P.open_store(root).read_items().column("item_id").to_numpy(), dtype=np.int64)
    rng = np.random.default_rng(seed)
    ItemVectors(ids, rng.normal(size=(len(ids), 12)).astype(np.float32),
                rng.normal(size=(len(ids), 12)).astype(np.float32)).save(WorkDir(root).features)
    P.build_semantic_ids(root, levels=2, codebook_size=8)
    train_run(root, RunConfig.from_name("cpu-tiny", [f"train.total_steps={steps}", "train.ckpt_every=0",
                                                     "data.valid_cases=16", "data.context_len=12", *overrides]))
    return root


def write_string_id_log(path: Path, *, users: int = 40, items: int = 60, per_user: int = 12, seed: int = 3) -> set[str]:
    """A log as one is exported (``u7,m42,<ISO time>,like``): string user and item ids, so ``data prepare
    generic`` remaps them (``map_ids``). No dataset needed. Returns the item ids it holds."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, items + 1)  # a few popular items, a long tail
    lines, seen = ["user_id,item_id,timestamp,action"], set()
    for u in range(users):
        picks = rng.choice(items, size=per_user, replace=False, p=pop / pop.sum())
        for j, it in enumerate(picks):
            t = 1_700_000_000 + u * 10_000 + j * 60
            lines.append(f"u{u},m{it * 7 + 3},{t},{'like' if rng.random() < 0.4 else 'view'}")
            seen.add(f"m{it * 7 + 3}")
    path.write_text("\n".join(lines) + "\n")
    return seen


def build_string_id_run(root: Path, *, steps: int = 4, ckpt_every: int = 2) -> Path:
    """:func:`write_string_id_log` prepared (ids remapped), random features, 2-level SIDs and ``steps`` training
    steps, a checkpoint every ``ckpt_every`` steps; the log at ``root.parent / (root.name + '.csv')``."""
    src = root.parent / f"{root.name}.csv"
    write_string_id_log(src)
    P.prepare(root, "generic", source=src)
    return _features_sids_train(root, steps, ckpt_every)


def _features_sids_train(root: Path, steps: int, ckpt_every: int) -> Path:
    ids = np.asarray(P.open_store(root).read_items().column("item_id").to_numpy(), dtype=np.int64)
    rng = np.random.default_rng(1)
    ItemVectors(ids, rng.normal(size=(len(ids), 12)).astype(np.float32),
                rng.normal(size=(len(ids), 12)).astype(np.float32)).save(WorkDir(root).features)
    P.build_semantic_ids(root, levels=2, codebook_size=8)
    train_run(root, RunConfig.from_name("cpu-tiny", [f"train.total_steps={steps}", f"train.ckpt_every={ckpt_every}",
                                                     "data.valid_cases=8", "data.context_len=12"]))
    return root


def build_titled_run(root: Path, *, string_ids: bool, steps: int = 4) -> Path:
    """:func:`write_string_id_log`'s log -- its string ids (remapped), or the same ids as integers (``u7`` -> 7,
    ``m52`` -> 52: kept) -- with an items file giving every item a title (``Title of m52`` / ``Title of 52``), then
    as :func:`build_string_id_run` (one checkpoint). The log is ``root.parent / 'log' / 'events.csv'`` beside its
    ``items.csv``."""
    src = root.parent / "log"
    src.mkdir(parents=True)
    items = sorted(write_string_id_log(src / "events.csv"))
    if not string_ids:
        text = (src / "events.csv").read_text()
        lines = [text.splitlines()[0]] + [",".join([u[1:], m[1:], *rest]) for u, m, *rest in
                                           (ln.split(",") for ln in text.splitlines()[1:])]
        (src / "events.csv").write_text("\n".join(lines) + "\n")
        items = [i[1:] for i in items]
    (src / "items.csv").write_text("item_id,title\n" + "".join(f"{i},Title of {i}\n" for i in items))
    P.prepare(root, "generic", source=src / "events.csv")
    return _features_sids_train(root, steps, steps)
