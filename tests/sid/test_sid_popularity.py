"""`genrec sid build --disambiguation popularity`: the last level numbers the items of each semantic code most
popular first (train-split interactions, counted here by hand from the prepared events), and the choice is
recorded in the version's manifest."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from genrec.cli import app
from genrec.data.splits import SplitSpec, train_events
from genrec.features.store import ItemVectors
from genrec.recipes import pipeline as P
from genrec.sid import open_current
from genrec.workdir import WorkDir
from tests.tiny_run import write_string_id_log


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("popsid") / "run"
    src = root.parent / "run.csv"
    write_string_id_log(src, users=60, per_user=14)
    P.prepare(root, "generic", source=src)
    ids = np.asarray(P.open_store(root).read_items().column("item_id").to_numpy(), dtype=np.int64)
    rng = np.random.default_rng(4)
    ItemVectors(ids, rng.normal(size=(len(ids), 6)).astype(np.float32),
                rng.normal(size=(len(ids), 6)).astype(np.float32)).save(WorkDir(root).features)
    return root


def test_popularity_numbers_each_code_most_popular_first(run: Path) -> None:
    res = CliRunner().invoke(app, ["sid", "build", str(run), "--levels", "1", "--codebook-size", "4",
                                   "--disambiguation", "popularity"])
    assert res.exit_code == 0, res.output
    sb = open_current(WorkDir(run).sid)
    codes, ids = np.asarray(sb.codes), np.asarray(sb.item_ids)
    tr = train_events(P.open_store(run).read_events(), SplitSpec("loo"))
    count = Counter(tr.column("item_id").to_pylist())
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(ids)):
        groups[int(codes[i, 0])].append(i)
    assert max(len(g) for g in groups.values()) > 3  # codes shared: the order is exercised
    for rows in groups.values():
        want = sorted(rows, key=lambda i: (-count.get(int(ids[i]), 0), int(ids[i])))
        assert [int(codes[i, 1]) for i in want] == list(range(len(rows)))
    assert json.loads((sb.path / "manifest.json").read_text())["params"]["disambiguation"] == "popularity"


def test_popularity_is_the_default_and_a_bad_choice_is_named(run: Path) -> None:
    res = CliRunner().invoke(app, ["sid", "build", str(run), "--levels", "1", "--codebook-size", "4"])
    assert res.exit_code == 0, res.output
    sb = open_current(WorkDir(run).sid)
    assert json.loads((sb.path / "manifest.json").read_text())["params"]["disambiguation"] == "popularity"
    res = CliRunner().invoke(app, ["sid", "build", str(run), "--levels", "1", "--codebook-size", "4",
                                   "--disambiguation", "item-id"])
    assert res.exit_code == 0, res.output
    sb = open_current(WorkDir(run).sid)
    assert json.loads((sb.path / "manifest.json").read_text())["params"]["disambiguation"] == "item_id"
    codes, ids = np.asarray(sb.codes), np.asarray(sb.item_ids)
    for c in np.unique(codes[:, 0]):
        rows = np.flatnonzero(codes[:, 0] == c)
        assert [int(codes[i, 1]) for i in rows[np.argsort(ids[rows])]] == list(range(len(rows)))
    res = CliRunner().invoke(app, ["sid", "build", str(run), "--disambiguation", "random"])
    assert res.exit_code != 0 and "--disambiguation" in res.output
