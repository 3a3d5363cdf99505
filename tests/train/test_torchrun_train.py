"""``torchrun --nproc-per-node 2 -m genrec.cli train`` -- genrec's model and joint objective, gloo on CPU -- equals
one process training on the same global batches: the logged loss and each of its terms within 1e-5 at every
step, the same final weights, the same validations; and the 2-process run killed after a checkpoint and
resumed equals the uninterrupted one.

The run: a synthetic log (several actions, slates, so the SID, next-item and both action terms all train),
2-level SIDs, the cpu-tiny model, a global batch of 16 (8 rows a process) over 8 steps across an epoch
boundary, validated at steps 4 and 8. Dropout is 0 and no history action is masked (``objective.p_mask=0``):
both draw from a per-(seed, rank, step) stream, so a process's draws for its rows are not the one process's
draws for the same rows. The next-item loss is the full softmax (``objective.item_loss=full``): the sampled one
draws its negatives per process (its in-batch negatives are the process's rows' positives).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from genrec.recipes import pipeline as P
from genrec.recipes.training import train_run
from genrec.train.run import RunConfig

STEPS, STOP = 8, 3
OVERRIDES = [f"train.total_steps={STEPS}", "train.batch_size=16", "train.log_every=1", f"train.ckpt_every={STOP}",
             "train.keep_last=10", "train.eval_every=4", "train.early_stopping.metric=valid/ann/recall@10",
             "train.early_stopping.patience=5", "data.valid_cases=16", "model.dropout=0", "objective.p_mask=0",
             "objective.item_loss=full"]
TERMS = ("loss", "sid", "sid_l1", "sid_l2", "item", "action")


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tables, item features and SIDs of a small synthetic log (no dataset needed)."""
    wd = tmp_path_factory.mktemp("synth")
    P.synthesize(wd, users=120, items=80, events=2400, seed=0, n_buckets=2)
    P.build_item_features(wd, content_dim=16, engagement_dim=8)
    P.build_semantic_ids(wd, levels=2, codebook_size=8)
    return wd


def _fork(synth_run: Path, root: Path) -> Path:
    root.mkdir()
    for part in ("tables", "features", "sid"):
        (root / part).symlink_to(synth_run / part)
    return root


def _torchrun_train(run: Path, *more: str) -> str:
    """``torchrun --standalone --nproc-per-node 2 -m genrec.cli train RUN ...`` (a free port of its own); stdout."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "genrec.cli", "train", str(run), "--preset", "cpu-tiny", *OVERRIDES, *more],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def _log(run: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (run / name).read_text().splitlines()]


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step-{step:06d}" / "model.safetensors"))


def _assert_same_run(got: Path, want: Path, what: str) -> None:
    """Per-step logged terms within 1e-5, the same validations, final weights within 1e-5."""
    a, b = _log(got, "train_log.jsonl"), _log(want, "train_log.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1)), what
    for ra, rb in zip(a, b):
        terms = [k for k in TERMS if k in rb]  # (a run without the action loss logs no action term)
        assert len(terms) >= 4 and all(k in ra for k in terms), what
        for k in terms:
            assert abs(ra[k] - rb[k]) <= 1e-5, f"{what}: step {ra['step']} {k}: {ra[k]} vs {rb[k]}"
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-5), (what, ra["step"])
    # validated by rank 0, the metrics (and so early stopping's and BEST's decisions) shared by both ranks
    ea, eb = _log(got, "eval_log.jsonl"), _log(want, "eval_log.jsonl")
    assert [r["step"] for r in ea] == [r["step"] for r in eb] == [4, 8], what
    for ra, rb in zip(ea, eb):
        assert ra == pytest.approx(rb, abs=1e-4), what
    wa, wb = _weights(got, STEPS), _weights(want, STEPS)
    assert set(wa) == set(wb)
    for k, v in wb.items():
        x = wa[k]
        if k.endswith("attn.qkv.bias"):
            # the key bias's gradient is zero in exact arithmetic (softmax is shift-invariant per query): Adam
            # turns the two runs' different rounding noise there into steps of up to lr, so it is left out
            d = v.numel() // 3
            x, v = torch.cat([x[:d], x[2 * d:]]), torch.cat([v[:d], v[2 * d:]])
        torch.testing.assert_close(x, v, atol=1e-5, rtol=0, msg=lambda s, k=k: f"{what}: {k}: {s}")


def test_torchrun_two_processes_equal_one_and_resume(synth_run: Path, tmp_path: Path) -> None:
    one = _fork(synth_run, tmp_path / "one")
    summary = train_run(one, RunConfig.from_name("cpu-tiny", OVERRIDES))  # one process, the same global batches

    two = _fork(synth_run, tmp_path / "two")
    out = _torchrun_train(two)
    _assert_same_run(two, one, "2 processes vs 1")
    assert out.count('"train_examples"') == 1  # rank 0 alone prints the summary, whose last step is the global one
    last = json.loads(out)["last_loss"]
    assert last["step"] == STEPS and all(abs(last[k] - summary["last_loss"][k]) <= 1e-5 for k in TERMS), last
    # the comparison is not trivially true: the weights moved
    early = _weights(one, STOP)
    assert max((early[k] - v).abs().max().item() for k, v in _weights(one, STEPS).items()) > 1e-3

    # killed during step STOP + 1: the checkpoint of step STOP is the newest, no evaluation has been made yet,
    # the logs run on past it; the same command again resumes there and goes on to STEPS
    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed, symlinks=True)
    ckpts = resumed / "checkpoints"
    for d in ckpts.glob("step-*"):
        if int(d.name.split("-")[1]) > STOP:
            shutil.rmtree(d)
    (ckpts / "BEST").unlink()
    (ckpts / "LATEST").write_text(f"step-{STOP:06d}\n")
    _torchrun_train(resumed)
    _assert_same_run(resumed, two, "2 processes resumed vs uninterrupted")


def test_ctrl_c_on_torchrun_checkpoints_before_torchrun_kills_the_workers(synth_run: Path, tmp_path: Path) -> None:
    """Ctrl-C on ``torchrun`` (it sends SIGINT to its workers and kills them 30 s later): on the CPU the workers
    agree to stop at the next step, not at the next log boundary (here never: log_every 10^6), and write their
    checkpoint in time."""
    import signal
    import time

    run = _fork(synth_run, tmp_path / "ctrl-c")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    over = ["train.total_steps=1000000", "train.batch_size=16", "train.log_every=1000000", "train.ckpt_every=0",
            "train.eval_every=0", "data.valid_cases=16", "train.progress=off"]
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "genrec.cli", "train", str(run), "--preset", "cpu-tiny", *over], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.monotonic()
        while not (run / "checkpoints" / "config.json").exists() and time.monotonic() - t0 < 120:
            time.sleep(0.5)
        time.sleep(8)  # training steps
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    latest = run / "checkpoints" / "LATEST"
    assert latest.exists(), out[-4000:]
    step = int(latest.read_text().strip().removeprefix("step-"))
    assert step >= 1 and "SIGINT" in out, out[-4000:]
    assert "forcefully exiting" not in out, out[-4000:]


def test_torchrun_two_phases_equal_one_process(synth_run: Path, tmp_path: Path) -> None:
    """``retrieval_first`` under torchrun: one process group for both phases, rank 0 sets the retrieval phase aside,
    and both phases equal the one-process run's (logged terms, validations, weights)."""
    from genrec.recipes.retrieval_first import train

    one = _fork(synth_run, tmp_path / "one")
    train(one, RunConfig.from_name("cpu-tiny", [*OVERRIDES, "retrieval_first=on"]))
    two = _fork(synth_run, tmp_path / "two")
    out = _torchrun_train(two, "retrieval_first=on")
    assert out.count('"retrieval_first"') == 1
    (first_one,), (first_two,) = ((r / "previous-runs").iterdir() for r in (one, two))  # the retrieval phases
    _assert_same_run(first_two, first_one, "retrieval phase, 2 processes vs 1")
    _assert_same_run(two, one, "joint phase, 2 processes vs 1")
    start = json.loads((two / "checkpoints" / "config.json").read_text())["run"]["init_from"]
    assert Path(start) == first_two / "checkpoints" / f"step-{STEPS:06d}"
