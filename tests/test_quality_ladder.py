"""benchmarks/quality_ladder.py: a ``sid_from_rung`` rung waits for the named rung's training, is skipped when that
failed, and trains on SIDs built by ``genrec sid build --source model`` into its own folder; each rung's training
summary (steps, items/s, peak memory) comes from its train log."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest


def test_a_rung_waits_for_its_sid_from_rung(benchmark_script: Callable[[str], ModuleType], tmp_path: Path) -> None:
    q = benchmark_script("quality_ladder")
    plain, dep = {"name": "plain"}, {"name": "model-sids", "sid_from_rung": "joint"}
    assert q.readiness(plain, {"joint"}, set(), set(), tmp_path) == "go"
    assert q.readiness(dep, {"joint"}, set(), set(), tmp_path) == "wait"  # still to train
    assert q.readiness(dep, set(), {"joint"}, set(), tmp_path) == "wait"  # training
    assert q.readiness(dep, set(), set(), {"joint"}, tmp_path) == "skip"  # failed
    assert q.readiness(dep, set(), set(), set(), tmp_path) == "skip"  # not trained here, no checkpoints
    (tmp_path / "joint" / "checkpoints").mkdir(parents=True)
    assert q.readiness(dep, set(), set(), set(), tmp_path) == "go"  # trained (in this call or before)


def test_sid_from_rung_must_name_an_earlier_rung(benchmark_script: Callable[[str], ModuleType]) -> None:
    q = benchmark_script("quality_ladder")
    with pytest.raises(SystemExit, match="not an earlier rung"):
        q.resolve({"rungs": [{"name": "a", "sid_from_rung": "b"}, {"name": "b"}]})
    with pytest.raises(SystemExit, match="not both"):
        q.resolve({"rungs": [{"name": "b"}, {"name": "a", "sid_from_rung": "b", "sid_from": "{workdir}-x"}]})
    q.resolve({"rungs": [{"name": "b", "overrides": ["x=1"]}, {"name": "a", "base": "b", "sid_from_rung": "b"}]})


def test_model_sid_command_links_its_own_sid_folder(benchmark_script: Callable[[str], ModuleType],
                                                    tmp_path: Path) -> None:
    q = benchmark_script("quality_ladder")
    base, root = tmp_path / "wd", tmp_path / "wd-ladder"
    for part in ("tables", "features", "sid"):
        (base / part).mkdir(parents=True)
    (root / "model-sids").mkdir(parents=True)
    (root / "model-sids" / "sid").symlink_to(base / "sid")  # an earlier call's link to WORKDIR's SIDs
    cmd = q.model_sid_command(base, root, {"name": "model-sids", "sid_from_rung": "joint",
                                           "sid_args": ["--codebook-size", 64]})
    sdir = root / "model-sids-sid"
    assert cmd[cmd.index("sid"):] == ["sid", "build", str(sdir), "--source", "model", "--from-run",
                                      str(root / "joint"), "--codebook-size", "64"]
    assert (sdir / "tables").resolve() == base / "tables" and (sdir / "features").resolve() == base / "features"
    assert (sdir / "sid").is_dir() and not (sdir / "sid").is_symlink()
    assert (root / "model-sids" / "sid").resolve() == (sdir / "sid").resolve()


def test_train_summary_reads_each_rungs_log(benchmark_script: Callable[[str], ModuleType], tmp_path: Path) -> None:
    """Steps from the last entry, items/s the median after the first window (start-up), the peak memory the
    largest logged; a rung without a log is left out."""
    q = benchmark_script("quality_ladder")
    (tmp_path / "a").mkdir()
    logs = [{"step": 10, "items_per_s": 5.0, "peak_mem_mib": 100.0}, {"step": 20, "items_per_s": 50.0,
            "peak_mem_mib": 300.0}, {"step": 30, "items_per_s": 70.0, "peak_mem_mib": 200.0},
            {"step": 40, "items_per_s": 60.0}]
    (tmp_path / "a" / "train_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in logs))
    ladder = {"rungs": [{"name": "a"}, {"name": "b"}]}
    rows = q.train_summary(tmp_path, ladder, {"a": 12.0})
    assert rows == [{"rung": "a", "steps": 40, "items_per_s": 60.0, "peak_mem_mib": 300.0, "seconds": 12.0}]
    assert "| a | 40 | 60 | 300 | 12 |" in q.train_table(rows)


def test_sid_variants_are_built_once_each(benchmark_script: Callable[[str], ModuleType], tmp_path: Path) -> None:
    """The ladder's ``sids`` become ``genrec sid build WORKDIR-sid-<name> ARGS`` over WORKDIR's linked tables and
    features; a variant already built is not built again."""
    q = benchmark_script("quality_ladder")
    base = tmp_path / "wd"
    for part in ("tables", "features", "sid"):
        (base / part).mkdir(parents=True)
    ladder = {"sids": {"e1x8": ["--source", "engagement", "--levels", 1, "--codebook-size", 8], "c": []}, "rungs": []}
    cmds = q.sid_variants(base, ladder)
    assert [c[c.index("sid"):] for c in cmds] == [
        ["sid", "build", str(tmp_path / "wd-sid-e1x8"), "--source", "engagement", "--levels", "1", "--codebook-size",
         "8"], ["sid", "build", str(tmp_path / "wd-sid-c")]]
    v = tmp_path / "wd-sid-e1x8"
    assert (v / "tables").resolve() == base / "tables" and (v / "features").resolve() == base / "features"
    assert not (v / "sid").exists()  # the build makes it
    (v / "sid").mkdir()
    (v / "sid" / "CURRENT").write_text("v0001\n")
    assert [c[c.index("sid") + 2] for c in q.sid_variants(base, ladder)] == [str(tmp_path / "wd-sid-c")]


def test_every_ladders_sid_from_is_declared_in_its_sids() -> None:
    """A rung that trains on ``{workdir}-sid-X`` finds X among its ladder's ``sids`` (built before training)."""
    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("ladder-*.json"))
    assert configs
    for path in configs:
        ladder = json.loads(path.read_text())
        for r in ladder["rungs"]:
            src = r.get("sid_from")
            if src is not None:
                assert src.startswith("{workdir}-sid-"), (path.name, r["name"], src)
                assert src.removeprefix("{workdir}-sid-") in ladder.get("sids", {}), (path.name, r["name"], src)


def test_l0l1_scores_what_genrec_eval_reports(benchmark_script: Callable[[str], ModuleType], tmp_path: Path,
                                              data_root: Path) -> None:
    """``--l0l1``: a rung's fusion is chosen on validation and stored with its checkpoint, and its L0 -> L1 path on
    each split equals what `genrec eval` reports for that checkpoint (same fusion, the SID stage as served)."""
    import argparse

    from genrec.eval.evaluate import EvalConfig, evaluate

    from tests.tiny_run import build_run

    ql = benchmark_script("quality_ladder")
    root = tmp_path / "runs-ladder"
    build_run(root / "joint", data_root, steps=4)
    ladder = {"rungs": [{"name": "joint", "change": "a tiny joint model"}]}
    a = argparse.Namespace(sid_beam=6, l0l1=True, fusion_users=40, n_boot=10)
    users = np.array([str(u) for u in range(1, 944)])  # MovieLens 100K's users; a plain SASRec that hits every target
    zero = np.zeros(943, np.int64)
    np.savez(root / ql.YARD_RANKS, users=users, valid=zero, test=zero, test_excl=zero)
    res = ql.score(root, ladder, a)
    row = res["rows"][0]
    for key in ("test/l0l1/recall@10", "valid/ann/ndcg@10"):  # paired user by user: the ratio to 1.0 everywhere
        assert row[f"{key}/vs_plain"][0] == pytest.approx(row[key])
    assert row["test/ann/recall@10/vs_plain_excl"][0] == pytest.approx(row["test/ann/recall@10"])
    assert "valid/ann/recall@10/vs_plain_excl" not in row  # the plain SASRec's history-excluded figure: test only
    assert row["fusion"]["sid_mode"] == "dense" and row["fusion"]["cases"] == 40
    assert (root / "joint" / "fusion").is_dir()
    for split in ("valid", "test"):
        want = evaluate(root / "joint", EvalConfig(split=split, max_users=0, beam_width=6, ranking=False))
        for m in ("recall@10", "ndcg@10", "recall@20"):
            assert row[f"{split}/l0l1/{m}"] == pytest.approx(want["paths"]["l0l1"][m], abs=1e-12), (split, m)
    assert "| joint | a tiny joint model | l0l1 |" in ql.table(res, None)


def test_the_yardstick_child_records_the_ranks_its_figures_come_from(benchmark_script: Callable[[str], ModuleType],
                                                                      tmp_path: Path) -> None:
    """The plain SASRec run through ``--yardstick-child``: one rank per user and split, in its data's user order,
    giving back the R@10 and N@10 the script itself printed (a mis-sliced record would not)."""
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "shared" / "yardstick" / "sasrec.py"
    if not script.exists():
        pytest.skip(f"the plain SASRec is not at {script}")
    from genrec.eval.metrics import topk_metrics

    ql = benchmark_script("quality_ladder")
    rng = np.random.default_rng(0)
    p5 = tmp_path / "p5"
    p5.mkdir()
    lines = [" ".join(map(str, [u, *rng.integers(1, 40, rng.integers(5, 12))])) for u in range(1, 81)]
    (p5 / "sequential_data.txt").write_text("\n".join(lines) + "\n")
    ranks, out = tmp_path / "ranks.npz", tmp_path / "yard.jsonl"
    subprocess.run([sys.executable, ql.__file__, "--yardstick-child", str(script), str(ranks), str(p5), "--loss", "ce",
                    "--epochs", "4", "--d", "8", "--out", str(out)], check=True, capture_output=True,
                   env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    z, res = np.load(ranks), json.loads(out.read_text().splitlines()[-1])
    assert z["users"].tolist() == [str(u) for u in range(1, 81)]
    for split, key in (("valid", "valid"), ("test", "test"), ("test_excl", "test_excl_history")):
        got = topk_metrics(z[split], (10,))
        assert got["recall@10"] == pytest.approx(res[key]["R@10"]) and got["ndcg@10"] == pytest.approx(res[key]["N@10"])
    assert ql.yardstick_ranks(tmp_path / "nothing") is None
    # YARDSTICK_SEED shifts the script's fixed seeds: another seed, other ranks (the same seed gave these)
    subprocess.run([sys.executable, ql.__file__, "--yardstick-child", str(script), str(tmp_path / "r1.npz"), str(p5),
                    "--loss", "ce", "--epochs", "4", "--d", "8"], check=True, capture_output=True,
                   env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "YARDSTICK_SEED": "1"})
    assert not np.array_equal(np.load(tmp_path / "r1.npz")["valid"], z["valid"])
