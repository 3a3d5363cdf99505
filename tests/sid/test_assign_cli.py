"""`genrec sid assign` from the command line: new items get codes in a new version, items that already had
codes are counted and named (their vectors are not used), bad vectors name their file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from genrec.cli import app
from genrec.sid.build import build_sids, open_current


def test_sid_assign_cli_reports_new_and_already_present_items(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 8)).astype(np.float32)
    build_sids(x, np.arange(60), tmp_path / "sid", levels=2, codebook_size=4, niter=5)
    v0 = open_current(tmp_path / "sid").version
    new = tmp_path / "new"
    new.mkdir()
    np.save(new / "vectors.npy", rng.normal(size=(3, 8)).astype(np.float32))
    np.save(new / "item_ids.npy", np.array([5, 100, 101]))  # 5 already has codes
    r = CliRunner().invoke(app, ["sid", "assign", str(tmp_path), "--vectors", str(new / "vectors.npy")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{"):r.output.rindex("}") + 1])
    assert out["new_items"] == 2 and out["already_present"] == 1 and out["items"] == 62
    assert "1 of the 3 items already had codes" in r.output
    sb = open_current(tmp_path / "sid")
    assert sb.version != v0 and sb.index.contains(np.array([100, 101])).all()
    v1 = sb.version
    r = CliRunner().invoke(app, ["sid", "assign", str(tmp_path), "--vectors", str(new / "vectors.npy")])
    assert r.exit_code == 0, r.output  # the same items again: all known, no new version
    out = json.loads(r.output[r.output.index("{"):r.output.rindex("}") + 1])
    assert out["unchanged"] and out["new_items"] == 0 and out["version"] == v1
    assert "no new version written" in r.output and open_current(tmp_path / "sid").version == v1
    np.save(new / "vectors.npy", np.full((3, 8), np.nan, np.float32))
    r = CliRunner().invoke(app, ["sid", "assign", str(tmp_path), "--vectors", str(new / "vectors.npy")])
    assert r.exit_code == 2 and "vectors.npy" in r.output and "row 1 (counting from 1)" in r.output, r.output
