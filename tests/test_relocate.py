"""A run directory moved (``mv``) or copied (``cp -r``) elsewhere, its first home deleted, still opens: the
tables read back the same rows from the new place, the trained model recommends and evaluates, training
resumes, and the data can be prepared again there. Opening a moved run writes nothing (a read-only server)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from genrec.data.store import TableStore
from genrec.infer.recommender import Recommender
from genrec.recipes import pipeline as P
from genrec.workdir import WorkDir


def _tables(root: Path) -> dict[str, pa.Table]:
    st = P.open_store(root)
    return {"events": st.read_events().sort_by([("user_id", "ascending"), ("seq", "ascending")]),
            "feedviews": st.read_feedviews().sort_by([("user_id", "ascending"), ("request_seq", "ascending")]),
            "items": st.read_items()}


def _history(items: pa.Table) -> list[dict[str, Any]]:
    return [{"item_id": int(i)} for i in items.column("item_id").to_pylist()[:5]]


def _recs(root: Path, history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    rec = Recommender.from_checkpoint(root)
    return [(r.item_id, round(r.score, 5)) for r in rec.recommend(history, k=10, beam_width=8)]


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` and the sha256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A tiny synthetic run built in one place, what it reads and recommends there, then ``mv``'d elsewhere (its
    first home gone)."""
    base = tmp_path_factory.mktemp("relocate")
    first = base / "first" / "run"
    P.synthesize(first, users=120, items=300, events=4000, n_buckets=2)
    P.build_item_features(first, content_dim=16, engagement_dim=8)
    P.build_semantic_ids(first, levels=2, codebook_size=8)
    P.train_model(first, "cpu-tiny", ["train.total_steps=3", "train.ckpt_every=0", "data.valid_cases=16"])
    tables = _tables(first)
    history = _history(tables["items"])
    want = {"tables": tables, "history": history, "recs": _recs(first, history)}
    second = base / "second" / "run"
    second.parent.mkdir()
    shutil.move(first, second)
    shutil.rmtree(base / "first")
    return second, want


def _same_tables(root: Path, want: dict[str, Any]) -> None:
    got = _tables(root)
    for name, t in want["tables"].items():
        assert got[name].equals(t), name
    for f in P.open_store(root).planned_files("events"):
        assert f.removeprefix("file://").startswith(str(WorkDir(root).tables)), f


def test_a_moved_run_reads_recommends_and_writes_nothing(moved: tuple[Path, dict[str, Any]]) -> None:
    root, want = moved
    before = _tree(root / "tables")
    _same_tables(root, want)
    assert _recs(root, want["history"]) == want["recs"]
    assert _tree(root / "tables") == before  # opening a moved run changes nothing there: a read-only open


def test_a_copied_run_evaluates_trains_and_prepares_again(moved: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    src, want = moved
    copy = tmp_path / "copy" / "run"
    shutil.copytree(src, copy)
    _same_tables(copy, want)
    assert _recs(copy, want["history"]) == want["recs"]
    report = P.evaluate(copy, split="valid", max_users=20, write=False)
    assert report["protocol"]["cases"] == 20 and report["paths"]
    assert Path(report["checkpoint"]).is_relative_to(copy.resolve())
    out = P.train_model(copy, "cpu-tiny", ["train.total_steps=4", "train.ckpt_every=0", "data.valid_cases=16"])
    assert out["step"] == 4
    before = _tree(src)
    P.synthesize(copy, users=60, items=100, events=1500, n_buckets=3)  # prepare the copy again, in place
    st = TableStore(WorkDir(copy).tables)
    assert st.n_buckets == 3 and st.counts()["events"] == 1500
    assert _tree(src) == before  # the run it was copied from is untouched
    _same_tables(src, want)
