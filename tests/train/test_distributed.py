"""DDP helpers, and a real 2-process torchrun (gloo) run equal to a 1-process run on the same global batch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from genrec.train.distributed import DistInfo, all_reduce_weighted, count_weighted_loss, shard_batch, shard_bounds

HERE = Path(__file__).resolve().parent


def _standin():
    spec = importlib.util.spec_from_file_location("genrec_test_standin", HERE / "test_standin_model.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


@settings(deadline=None)
@given(n=st.integers(0, 50), world=st.integers(1, 8))
def test_shard_bounds_partition(n: int, world: int) -> None:
    bounds = [shard_bounds(n, r, world) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    for (a, b), (c, _) in zip(bounds, bounds[1:]):
        assert b == c  # contiguous, no overlap, no gap
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_shard_batch_nested() -> None:
    batch = {"seq": torch.arange(10).reshape(5, 2), "w": torch.arange(5.0), "meta": "x",
             "parts": [torch.arange(5), torch.arange(5) * 2]}
    a, b = shard_batch(batch, 0, 2), shard_batch(batch, 1, 2)
    assert a["seq"].shape == (3, 2) and b["seq"].shape == (2, 2)
    assert torch.equal(torch.cat([a["w"], b["w"]]), batch["w"])
    assert a["meta"] == "x" and torch.equal(b["parts"][1], torch.tensor([6, 8]))
    with pytest.raises(ValueError, match="different leading sizes"):
        shard_batch({"a": torch.zeros(3), "b": torch.zeros(4)}, 0, 2)
    with pytest.raises(ValueError, match="rank 2 out of range"):
        shard_bounds(4, 2, 2)


def test_single_process_reductions_are_identity() -> None:
    info = DistInfo()
    vals, total = all_reduce_weighted({"a": 2.0, "b": -1.0}, 4.0, info)
    assert vals == {"a": 2.0, "b": -1.0} and total == 4.0
    loss = torch.tensor(3.0)
    assert count_weighted_loss(loss, 7, info) is loss


def test_torchrun_two_processes_match_one_process(tmp_path: Path) -> None:
    steps = 6
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    for attempt in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
             str(HERE / "test_standin_model.py"), "--workdir", str(tmp_path / f"ddp{attempt}"), "--steps", str(steps),
             "--out", str(tmp_path / "ddp_out")],
            env=env, capture_output=True, text=True, timeout=120)
        # gloo on a loaded 2-core box now and then aborts a rank from a C++ thread with no Python
        # error ("terminate called without an active exception", ~1 run in 10 here): one retry
        # for exactly that; any other failure, or a second abort, fails the test
        if proc.returncode == 0 or "terminate called without an active exception" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    meta = json.loads((tmp_path / "ddp_out.json").read_text())
    rank1 = json.loads((tmp_path / "ddp_out.rank1.json").read_text())
    assert meta["world"] == 2 and meta["backend"] == "gloo"
    # count-weighted mean: rank 0 has x=1 (count 2), rank 1 has x=2 (count 3) -> 8/5, not (1+2)/2
    assert meta["reduced"]["x"] == pytest.approx(8 / 5) and meta["total"] == 5.0
    assert rank1["reduced"]["x"] == pytest.approx(8 / 5)
    assert rank1["bcast"] == {"from": 0, "v": [1.5, "a"]}

    # the same global batch on one process, in this process
    m = _standin()
    torch.manual_seed(0)
    model = m.TinyNextItem(dropout=0.0)
    cfg = m.tiny_config(total_steps=steps, ckpt_every=0, log_every=1, batch_size=16, grad_clip=0.5)
    data = m.make_sequences()
    # the two ranks hold different numbers of targets, so mean-of-means would differ from the global mean
    halves = [m.shard_batch({"seq": data[:16]}, r, 2)["seq"] for r in (0, 1)]
    counts = [int(((h[:, :-1] > 0) & (h[:, 1:] > 0)).sum()) for h in halves]
    assert counts[0] != counts[1]
    result = m.Trainer(model, m.make_factory(data), cfg, tmp_path / "single", dist_info=DistInfo()).fit(resume=False)

    ddp_params = load_file(str(tmp_path / "ddp_out.safetensors"))
    single = model.state_dict()
    assert set(ddp_params) == set(single)
    for k, v in single.items():
        torch.testing.assert_close(ddp_params[k], v, atol=1e-5, rtol=0, msg=lambda s, k=k: f"{k}: {s}")
    # the parameters actually moved (the comparison is not trivially true)
    torch.manual_seed(0)
    init = m.TinyNextItem(dropout=0.0).state_dict()
    assert (init["emb.weight"] - single["emb.weight"]).abs().max() > 1e-3
    # the logged losses are count-weighted global means: equal to the 1-process losses step by step
    logged = [json.loads(line) for line in (tmp_path / f"ddp{attempt}" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(1, steps + 1))
    for r, ref in zip(logged, result.history):
        assert r["loss"] == pytest.approx(ref["loss"], abs=1e-5)
    assert len(meta["history"]) == steps


def _torchrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(HERE / "test_standin_model.py"), "--out", str(tmp_path / "out"), *args],
                          env=env, capture_output=True, text=True, timeout=120)


def test_torchrun_resumed_between_log_steps_logs_the_global_window(tmp_path: Path) -> None:
    """Two processes, log every 3 steps, checkpoints every 2, both ranks crash before step 6: the checkpoint of
    step 4 carries the open window (step 4, summed over both ranks), so the resumed run's line at step 6 is the
    count-weighted mean of steps 4-6 over both ranks -- the uninterrupted one-process run's line."""
    wd = str(tmp_path / "ddp")
    common = ["--workdir", wd, "--steps", "6", "--log-every", "3", "--ckpt-every", "2"]
    crashed = _torchrun(tmp_path, *common, "--crash-at", "5")
    assert crashed.returncode != 0 and "simulated crash" in crashed.stdout + crashed.stderr
    for attempt in range(2):  # gloo's rare abort on a loaded 2-core box (see above): one retry
        done = _torchrun(tmp_path, *common, "--resume")
        if done.returncode == 0 or "terminate called without an active exception" not in done.stderr:
            break
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    m = _standin()
    torch.manual_seed(0)
    cfg = m.tiny_config(total_steps=6, ckpt_every=0, log_every=3, batch_size=16, grad_clip=0.5)
    m.Trainer(m.TinyNextItem(dropout=0.0), m.make_factory(m.make_sequences()), cfg, tmp_path / "single",
              dist_info=DistInfo()).fit(resume=False)
    ddp, single = ([json.loads(x) for x in (Path(d) / "train_log.jsonl").read_text().splitlines()]
                   for d in (wd, tmp_path / "single"))
    assert [r["step"] for r in ddp] == [r["step"] for r in single] == [3, 6]
    for r, ref in zip(ddp, single):
        assert r["loss"] == pytest.approx(ref["loss"], abs=1e-5), r["step"]
