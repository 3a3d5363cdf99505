"""The daily cycle (issue 41 item 3), two "days" end to end with the real commands and a real server:

day 1: `genrec data prepare` -> `features build` -> `sid build` -> `train` -> serve (uvicorn, the app's own hot
swap machinery); day 2, the server still running: `data append` -> `sid assign` (the new items, with the frozen
encoder and codebooks) -> `train --init-from` day 1's run -> `eval` -> `POST /admin/reload`. Then the server
answers with day 2's tables, SID and checkpoint versions, a day-2 item is served, and nothing of day 1 is lost:
its checkpoint, SID version and table snapshot all still read back as they were.

The logs: MovieLens 100K's movies with ids above 1000 (682 of them, 7,693 ratings: small for CI's 2 cores) cut at
the 80% timestamp quantile, day 1's items file holding only what day 1 rates; without ../shared/datasets a
MovieLens-form log made here (tests/daily_logs.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from genrec.cli import app
from tests.daily_logs import fake_movielens, split_by_time

from tests.serve._server import ServerThread

TRAIN = ["--preset", "cpu-tiny", "train.total_steps=4", "train.ckpt_every=0", "data.valid_cases=16",
         "data.context_len=12"]


def _run(*args: Any, parse: bool = True) -> Any:
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, f"genrec {' '.join(map(str, args))}:\n{r.output}"
    out = r.output
    return json.loads(out[out.index("{"):out.rindex("}") + 1]) if parse else out


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("daily-logs")
    ml = Path(os.environ["GENREC_DATA_DIR"]) / "movielens-100k"
    if (ml / "u.data").exists() and (ml / "u.item").exists():
        return split_by_time(ml, root, frac=0.8, min_item=1000)
    return split_by_time(fake_movielens(root / "all"), root, frac=0.8)


def test_two_days_hot_swapped_and_nothing_lost(days: tuple[Path, Path], tmp_path: Path) -> None:
    from genrec.catalog import open_store
    from genrec.model.checkpoint_io import load_checkpoint
    from genrec.model.config import ModelConfig
    from genrec.model.genrec_model import GenRecModel
    from genrec.serve.app import create_app
    from genrec.serve.config import ServeConfig
    from genrec.sid.build import open_version
    from genrec.workdir import read_json

    day1, day2 = days
    wd = tmp_path / "run"
    # ---- day 1
    _run("data", "prepare", "movielens-100k", wd, "--source", day1, "--buckets", 4)
    _run("features", "build", wd, "--content-dim", 16, "--engagement-dim", 8)
    _run("sid", "build", wd, "--levels", 2, "--codebook-size", 6)
    _run("train", wd, *TRAIN)
    store1 = open_store(wd)
    events1, items1 = store1.read_events(), store1.read_items()
    sid1 = open_version(wd / "sid", "v0001")
    codes1 = np.asarray(sid1.codes).copy()
    ckpt1 = wd / "checkpoints" / "step-000004"
    weights1 = (ckpt1 / "model.safetensors").read_bytes()
    assert read_json(ckpt1 / "extra.json")["tables"] == store1.tables_version == "genrec_v0001.1"

    application = create_app(ServeConfig(workdir=wd))
    with ServerThread(application) as srv, httpx.Client(base_url=srv.url, timeout=120) as http:
        ready1 = http.get("/readyz").json()
        v1 = ready1["versions"]
        assert v1["tables"] == "genrec_v0001.1" and v1["sid"] == "v0001"
        assert v1["checkpoint"] == "checkpoints/step-000004"
        assert v1["trained_on"]["tables"] == "genrec_v0001.1" and v1["trained_on"]["sid"] == "v0001"
        hist = [{"item_id": int(i)} for i in events1.column("item_id").to_numpy()[:5]]
        first = http.post("/v1/recommend", json={"history": hist, "k": 5, "beam_width": 8}).json()
        assert first["index_version"] == ready1["index_version"] and "+genrec_v0001.1+v0001" in first["index_version"]

        # ---- day 2, the server still serving day 1
        app_out = _run("data", "append", wd, "--source", day2)
        assert app_out["tables_version"] == "genrec_v0001.2" and app_out["added"]["items"] > 0, app_out
        new_items = np.setdiff1d(open_store(wd).read_items().column("item_id").to_numpy(),
                                 items1.column("item_id").to_numpy())
        assert len(new_items) == app_out["added"]["items"]
        assigned = _run("sid", "assign", wd, "--publish")  # a retrain follows: CURRENT even if the last level grew
        assert assigned["version"] == "v0002" and assigned["new_items"] == len(new_items), assigned
        assert assigned["added_to_catalogue"] == len(new_items)
        trained = _run("train", wd, *TRAIN, "--init-from", wd)
        assert Path(trained["init_from"]).name == "step-000004" and "previous-runs" in trained["init_from"]
        _run("eval", wd, "--split", "test", "--max-users", 30, parse=False)
        evaluated = read_json(next((wd / "reports").glob("eval-test-*.json")))
        assert evaluated["versions"]["tables"] == "genrec_v0001.2" and evaluated["versions"]["sid"] == "v0002"
        assert http.get("/readyz").json()["versions"] == v1  # nothing swapped until asked

        reload = http.post("/admin/reload").json()
        assert reload["ok"] and reload["swapped"], reload
        ready2 = http.get("/readyz").json()
        v2 = ready2["versions"]
        assert v2["tables"] == "genrec_v0001.2" and v2["sid"] == "v0002", v2
        assert v2["trained_on"] == {"tables": "genrec_v0001.2", "sid": "v0002", "init_from": trained["init_from"]}
        assert v2["checkpoint"] == "checkpoints/step-000004" and v2["weights_sha256"] != v1["weights_sha256"]
        # every answer names day 2's versions
        new = int(new_items[0])
        rec = http.post("/v1/recommend", json={"history": [*hist, {"item_id": new}], "k": 5, "beam_width": 8}).json()
        assert rec["index_version"] == ready2["index_version"] != ready1["index_version"]
        assert "+genrec_v0001.2+v0002" in rec["index_version"]
        assert rec["dropped_items"] == []  # a day-2 item is in the served catalogue ...
        ranked = http.post("/v1/rank", json={"history": hist, "candidates": [new, hist[0]["item_id"]]}).json()
        assert ranked["unknown_candidates"] == [] and new in [x["item_id"] for x in ranked["items"]]  # ... rankable
        assert ranked["index_version"] == ready2["index_version"]

    # ---- nothing of day 1 is lost
    ckpt1_now = Path(trained["init_from"])
    assert (ckpt1_now / "model.safetensors").read_bytes() == weights1  # day 1's checkpoint, moved aside whole
    model = GenRecModel(ModelConfig.from_dict(read_json(ckpt1_now / "config.json")["model"]))
    load_checkpoint(ckpt1_now, model)  # and it loads
    assert read_json(ckpt1_now / "extra.json")["sid_version"] == "v0001"
    assert np.array_equal(np.asarray(open_version(wd / "sid", "v0001").codes), codes1)  # day 1's SIDs
    store = open_store(wd)
    assert [h["tables_version"] for h in store.history()] == ["genrec_v0001.1", "genrec_v0001.2"]
    then = store.at(1)  # Iceberg time travel to day 1's snapshots: exactly day 1's rows
    assert then.read_events().equals(events1) and then.read_items().equals(items1)
    assert then.read_feedviews().equals(store1.read_feedviews())
    now = store.read_events()
    assert now.num_rows == events1.num_rows + app_out["added"]["events"]
