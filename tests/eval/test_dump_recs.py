"""`genrec eval --dump-recs`: the dumped per-path top-K, scored by the independent yardstick scorer
(``../shared/yardstick/score.py``, which reads P5 data), reproduces genrec's own Recall/NDCG@5/10/20."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from genrec.eval.dump import recs_file, recs_lines
from genrec.eval.metrics import place_target, rank_in_list, rank_of_targets

from tests.tiny_run import build_run

SCORE = Path(__file__).resolve().parents[3] / "shared" / "yardstick" / "score.py"
KS = (5, 10, 20)


@pytest.fixture(scope="module")
def beauty_run(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> tuple[Path, Path]:
    """A P5-form slice of Amazon Beauty (every 100th user's line, as in the file: their ids and item ids
    are sparse, so a table row or a renumbered id would not pass for the original) and a tiny run on it."""
    full = data_root / "amazon-beauty-2014" / "sequential_data.txt"
    if not full.is_file():
        pytest.skip(f"Amazon Beauty not found at {full}")
    if not SCORE.is_file():
        pytest.skip(f"the yardstick scorer is not at {SCORE}")
    data = tmp_path_factory.mktemp("beauty-p5")
    lines = full.read_text().splitlines()[::100]
    (data / "sequential_data.txt").write_text("\n".join(lines) + "\n")
    root = build_run(tmp_path_factory.mktemp("dump"), data_root, steps=6, dataset="amazon-p5", source=data)
    return root, data


def _score(data: Path, recs: Path, split: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, str(SCORE), str(data), str(recs), "--split", split, "--ks", "5,10,20"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check(report: dict, data: Path, base: Path, split: str) -> None:  # type: ignore[type-arg]
    lines = [ln.split() for ln in (data / "sequential_data.txt").read_text().splitlines()]
    users = {int(p[0]) for p in lines}
    items = {int(i) for p in lines for i in p[1:]}
    assert report["protocol"]["cases"] == len(users)  # every user of the file is a case (5-core: >= 5 items)
    paths = report["paths"]
    assert {"sid", "ann", "l0l1", "popularity"} <= set(paths)
    assert report["dumped_recs"] == {p: str(recs_file(base, p)) for p in paths}
    hits = 0.0
    for p, m in paths.items():
        f = recs_file(base, p)
        rows = [json.loads(x) for x in f.read_text().splitlines()]
        assert {r["user"] for r in rows} == users and len(rows) == len(users), p  # the source's user ids
        assert all(len(r["items"]) <= max(KS) and set(r["items"]) <= items for r in rows), p  # its item ids
        got = _score(data, f, split)
        assert got["users"] == got["covered"] == len(users), p
        for k in KS:
            assert got[f"R@{k}"] == pytest.approx(m[f"recall@{k}"], abs=1e-9), (p, k)
            assert got[f"N@{k}"] == pytest.approx(m[f"ndcg@{k}"], abs=1e-9), (p, k)
        hits += m["recall@20"]
    assert hits > 0  # something was found, so the equalities above compared hits, not only zeros


def test_dump_recs_library_valid_split_matches_score_py(beauty_run: tuple[Path, Path], tmp_path: Path) -> None:
    import genrec

    root, data = beauty_run
    base = tmp_path / "recs.jsonl"
    report = genrec.evaluate(root, split="valid", write=False, ranking=False, dump_recs=str(base))
    _check(report, data, base, "valid")  # score.py's validation target: the second-last item of each line


def test_dump_recs_cli_test_split_matches_score_py(beauty_run: tuple[Path, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from genrec.cli import app

    root, data = beauty_run
    base = tmp_path / "out" / "recs.jsonl"
    r = CliRunner().invoke(app, ["eval", str(root), "--split", "test", "--no-ranking", "--dump-recs", str(base)])
    assert r.exit_code == 0, r.output
    report_json = next(ln.split(": ", 1)[1] for ln in r.output.splitlines() if ln.startswith("json: "))
    report = json.loads(Path(report_json).read_text())
    assert f"recs ann: {recs_file(base, 'ann')}" in r.output
    _check(report, data, base, "test")  # score.py's test target: the last item of each line


def test_recs_file_names_and_original_ids() -> None:
    assert recs_file("out/recs.jsonl", "sid") == Path("out/recs.sid.jsonl")
    assert recs_file("recs", "ann") == Path("recs.ann")
    lists = np.array([[2, 0, -1], [1, -1, -1]])
    got = recs_lines(["u9", "u7"], lists, np.array([10, 11, 12]), {10: "A", 11: "B", 12: "C"})
    assert [json.loads(x) for x in got.decode().splitlines()] == [{"user": "u9", "items": ["C", "A"]},
                                                                 {"user": "u7", "items": ["B"]}]


def test_place_target_breaks_ties_against_the_target_as_the_rank_does() -> None:
    scores = np.array([[0.5, 0.9, 0.5, 0.5, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2]])
    targets = np.array([0, 4])
    ranks = rank_of_targets(lambda idx: scores[idx], 2, targets)  # pessimistic: [3, 4]
    top = np.argsort(-scores, axis=1, kind="stable")  # puts the target first among its ties
    for k in (2, 4, 5):
        lists = place_target(top, ranks, targets, k)
        want = np.where(ranks < k, ranks, -1)
        np.testing.assert_array_equal(rank_in_list(lists, targets), want)
        assert all(len(set(r[r >= 0])) == (r >= 0).sum() for r in lists)
