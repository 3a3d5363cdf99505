"""``genrec train`` with streaming input (data.stream=true) on MovieLens 100K: a run stopped mid-epoch and resumed
equals the uninterrupted run, across a window's edge and an epoch's end."""

from __future__ import annotations

from genrec.recipes.training import train_run
from genrec.train.run import RunConfig


def test_streamed_run_resumes_exactly(fork):  # noqa: ANN001
    # 943 users in 2 buckets, 128 a batch: 7 steps an epoch, a window (one bucket) ends inside step 4
    common = ["data.stream=true", "data.window_buckets=1", "train.batch_size=128", "data.valid_cases=16",
              "train.decay=constant"]
    over = [*common, "train.total_steps=10", "train.ckpt_every=5"]
    straight = train_run(fork("stream-straight"), RunConfig.from_name("cpu-tiny", over), resume=False)
    wd = fork("stream-resumed")
    train_run(wd, RunConfig.from_name("cpu-tiny", [*common, "train.total_steps=5", "train.ckpt_every=5"]),
              resume=False)
    resumed = train_run(wd, RunConfig.from_name("cpu-tiny", over), resume=True)
    a, b = straight["last_loss"], resumed["last_loss"]
    assert a["step"] == b["step"] == 10
    for key in ("loss", "sid", "item", "action"):
        assert abs(a[key] - b[key]) <= 1e-6 * max(1.0, abs(a[key])), (key, a[key], b[key])
    assert straight["train_examples"] == 943  # every user (MovieLens users have >= 20 ratings)


def test_streamed_run_under_torchrun_gives_each_rank_its_buckets(fork, tmp_path):  # noqa: ANN001
    """``genrec train`` under torchrun with streaming: two gloo processes, each reading only its own bucket of the
    two (ranks 0 and 1 of the plan), train in step past the first epoch's end and log the global loss."""
    import json
    import os
    import subprocess
    import sys

    wd = fork("stream-ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    # 943 users in 2 buckets, 8 examples per rank a step: about 58 steps an epoch; 60 steps cross its end
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "genrec.cli", "train", str(wd), "--preset", "cpu-tiny", "--no-resume",
                           "data.stream=true", "train.batch_size=16", "train.total_steps=60", "train.ckpt_every=0",
                           "train.log_every=30", "data.valid_cases=16"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    logged = [json.loads(line) for line in (wd / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [30, 60]
