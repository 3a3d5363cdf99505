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
