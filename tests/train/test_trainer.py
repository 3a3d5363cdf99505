"""Trainer: exact resume after a crash, early stopping with the best checkpoint, schedule,
weight-decay groups, logs (JSONL + TensorBoard), protocol errors."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from genrec.errors import GenrecError
from genrec.train.checkpoint import load_checkpoint, resolve_checkpoint
from genrec.train.config import TrainConfig
from genrec.train.distributed import DistInfo
from genrec.train.optim import lr_multiplier, param_groups
from genrec.train.trainer import IterSpec, Trainer

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("genrec_test_standin", HERE / "test_standin_model.py")
standin = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(standin)


def _run(workdir: Path, *, seed_init: int, crash_at: int | None = None, total: int = 12, **kw):
    torch.manual_seed(seed_init)
    model = standin.TinyNextItem(dropout=0.1)  # dropout: per-step randomness must also replay
    cfg = standin.tiny_config(total_steps=total, ckpt_every=4, log_every=5, **kw)
    trainer = Trainer(model, standin.make_factory(standin.make_sequences(), crash_at=crash_at), cfg, workdir,
                      extra={"sid_version": "v0001"}, dist_info=DistInfo())
    return model, trainer


def test_resume_after_crash_replays_the_same_losses(tmp_path: Path) -> None:
    model_a, tr_a = _run(tmp_path / "a", seed_init=0)
    full = tr_a.fit()
    assert [r["step"] for r in full.history] == list(range(1, 13))
    assert full.history[-1]["loss"] < full.history[0]["loss"]

    _, tr_b = _run(tmp_path / "b", seed_init=0, crash_at=6)
    with pytest.raises(RuntimeError, match="simulated crash"):
        tr_b.fit()
    assert resolve_checkpoint(tmp_path / "b" / "checkpoints").name == "step-000004"

    # a new process: different init, everything must come from the checkpoint + the data position
    model_c, tr_c = _run(tmp_path / "b", seed_init=123)
    resumed = tr_c.fit()
    assert [r["step"] for r in resumed.history] == list(range(5, 13))
    for got, ref in zip(resumed.history, full.history[4:]):
        for key in ("loss", "user_norm", "grad_norm"):
            assert got[key] == pytest.approx(ref[key], abs=1e-6), (got["step"], key)
    for (k, a), (_, b) in zip(model_a.state_dict().items(), model_c.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=lambda s, k=k: f"{k}: {s}")
    assert tr_c.extra["sid_version"] == "v0001"
    # the crashed run's log lines past the checkpoint were dropped, then rewritten once
    logged = [json.loads(x)["step"] for x in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert logged == [5, 10, 12]
    assert resumed.step == 12 and resolve_checkpoint(tmp_path / "b" / "checkpoints").name == "step-000012"
    # resuming a finished run is a no-op
    assert _run(tmp_path / "b", seed_init=5)[1].fit().history == []


def test_a_run_resumed_between_log_steps_logs_the_uninterrupted_runs_windows(tmp_path: Path) -> None:
    """log_every 5, checkpoints every 4, a crash at step 6: the checkpoint of step 4 carries the open window (steps
    1-4), so the resumed run's line at step 5 averages steps 1-5 as the uninterrupted run's does; every logged term
    of every line matches (the rates are wall-clock and differ)."""
    _run(tmp_path / "a", seed_init=0)[1].fit()
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(tmp_path / "b", seed_init=0, crash_at=6)[1].fit()
    _run(tmp_path / "b", seed_init=123)[1].fit()
    full, resumed = ([json.loads(x) for x in (tmp_path / r / "train_log.jsonl").read_text().splitlines()]
                     for r in ("a", "b"))
    assert [x["step"] for x in full] == [x["step"] for x in resumed] == [5, 10, 12]
    for f, r in zip(full, resumed):
        for key in f:
            if key not in ("items_per_s", "tokens_per_s"):
                assert r[key] == pytest.approx(f[key], abs=1e-6), (f["step"], key)


def test_eval_log_drops_records_past_the_resumed_checkpoint(tmp_path: Path) -> None:
    cfg = standin.tiny_config(total_steps=4, eval_every=2, ckpt_every=4)
    make = lambda: Trainer(standin.TinyNextItem(), standin.make_factory(standin.make_sequences()), cfg,  # noqa: E731
                           tmp_path, eval_fn=lambda m: {"recall@10": 0.5}, dist_info=DistInfo())
    make().fit()
    log = tmp_path / "eval_log.jsonl"
    with open(log, "a") as f:  # what a run that crashed after its last checkpoint would have left
        f.write(json.dumps({"step": 6, "recall@10": 0.9, "best": True}) + "\n")
    make().fit()  # resumes at step 4 (finished): the record of step 6 goes
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [2, 4]


def test_without_resume_state_the_trajectory_differs(tmp_path: Path) -> None:
    """Guards the test above: restarting from scratch at step 4's data position does NOT match."""
    _, tr_a = _run(tmp_path / "a", seed_init=0, total=6)
    full = tr_a.fit()
    torch.manual_seed(0)
    model = standin.TinyNextItem(dropout=0.1)
    cfg = standin.tiny_config(total_steps=6, ckpt_every=4, log_every=5)
    fresh = Trainer(model, standin.make_factory(standin.make_sequences()), cfg, tmp_path / "c", dist_info=DistInfo())
    fresh.step = 4  # same data position, but no weights/optimizer state
    hist = fresh.fit(resume=False).history
    assert abs(hist[0]["loss"] - full.history[4]["loss"]) > 1e-3


def test_early_stopping_keeps_the_best_checkpoint(tmp_path: Path) -> None:
    scores = iter([0.1, 0.3, 0.2, 0.25, 0.9, 0.9])
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    torch.manual_seed(0)
    model = standin.TinyNextItem()

    def eval_fn(m: nn.Module) -> dict[str, float]:
        assert not m.training and not torch.is_grad_enabled()
        snapshots[len(snapshots) + 1] = {k: v.clone() for k, v in m.state_dict().items()}
        return {"recall@10": next(scores), "ndcg@10": 0.0}

    cfg = standin.tiny_config(total_steps=20, eval_every=2, ckpt_every=0, **{
        "early_stopping.metric": "recall@10", "early_stopping.patience": 2, "early_stopping.mode": "max"})
    res = Trainer(model, standin.make_factory(standin.make_sequences()), cfg, tmp_path, eval_fn=eval_fn,
                  dist_info=DistInfo()).fit()
    assert res.stopped_early and res.step == 8
    assert res.best_step == 4 and res.best_metric == pytest.approx(0.3)
    assert [e["step"] for e in res.evals] == [2, 4, 6, 8]
    logged = [json.loads(x) for x in (tmp_path / "eval_log.jsonl").read_text().splitlines()]  # the curve on disk
    assert [(r["step"], r["recall@10"], r["best"]) for r in logged] == [(2, 0.1, True), (4, 0.3, True),
                                                                         (6, 0.2, False), (8, 0.25, False)]
    ckpts = tmp_path / "checkpoints"
    assert resolve_checkpoint(ckpts, "BEST").name == "step-000004"
    assert resolve_checkpoint(ckpts).name == "step-000008"
    torch.manual_seed(9)
    probe = standin.TinyNextItem()
    extra = load_checkpoint(ckpts, probe, which="BEST", restore_rng=False)
    assert extra["_trainer"]["best_step"] == 4
    for k, v in probe.state_dict().items():
        assert torch.equal(v, snapshots[2][k]), k


def test_early_stopping_metric_must_exist(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = standin.tiny_config(total_steps=2, eval_every=1, **{"early_stopping.metric": "mrr"})
    tr = Trainer(standin.TinyNextItem(), standin.make_factory(standin.make_sequences()), cfg, tmp_path,
                 eval_fn=lambda m: {"recall@10": 0.5}, dist_info=DistInfo())
    with pytest.raises(GenrecError, match="'mrr' not among eval metrics"):
        tr.fit()


def test_lr_schedule_by_hand() -> None:
    cfg = TrainConfig(warmup_steps=4, total_steps=14, decay="cosine", min_lr_ratio=0.1)
    f = lr_multiplier(cfg)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == pytest.approx(1.0)
    assert f(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(14) == pytest.approx(0.1) and f(100) == pytest.approx(0.1)
    lin = lr_multiplier(TrainConfig(warmup_steps=0, total_steps=10, decay="linear", min_lr_ratio=0.0))
    assert [lin(s) for s in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])
    const = lr_multiplier(TrainConfig(warmup_steps=2, total_steps=10, decay="constant"))
    assert [const(s) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]


def test_lr_schedule_with_time_progress() -> None:
    """``decay_by="deadline"``: the decay's progress is max(step, time) clipped to [0, 1]; warm-up and
    constant decay ignore the clock."""
    for decay in ("cosine", "linear", "constant"):
        cfg = TrainConfig(warmup_steps=4, total_steps=14, decay=decay, min_lr_ratio=0.1)
        steps_only = lr_multiplier(cfg)
        at_zero = lr_multiplier(cfg, lambda: 0.0)
        assert [at_zero(s) for s in range(20)] == [steps_only(s) for s in range(20)]
        for t in (1.0, 3.0):  # the budget used up (or overrun): the floor right after warm-up
            done = lr_multiplier(cfg, lambda t=t: t)
            assert [done(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]  # warm-up stays step-based
            want = 1.0 if decay == "constant" else 0.1
            assert [done(s) for s in range(4, 20)] == pytest.approx([want] * 16)
    cfg = TrainConfig(warmup_steps=4, total_steps=1000, decay="cosine", min_lr_ratio=0.1)
    half = lr_multiplier(cfg, lambda: 0.5)
    assert half(5) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # time ahead of steps
    assert half(900) == pytest.approx(lr_multiplier(cfg)(900))  # steps ahead of time
    assert lr_multiplier(cfg, lambda: -1.0)(4) == pytest.approx(1.0)  # clipped below at 0


def _deadline_fit(workdir: Path, monkeypatch: pytest.MonkeyPatch, decay_by: str,
                  max_minutes: float = 1.0) -> tuple[Trainer, list[dict]]:
    import genrec.train.trainer as trainer_mod

    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(trainer_mod.time, "perf_counter", lambda: 2.0 * next(ticks))  # 2 s per call
    torch.manual_seed(0)
    cfg = standin.tiny_config(total_steps=1000, log_every=1, ckpt_every=0, max_minutes=max_minutes, decay_by=decay_by)
    tr = Trainer(standin.TinyNextItem(), standin.make_factory(standin.make_sequences()), cfg, workdir,
                 dist_info=DistInfo())
    tr.fit()
    return tr, [json.loads(x) for x in (workdir / "train_log.jsonl").read_text().splitlines()]


def test_deadline_decay_reaches_the_floor_when_time_runs_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A time-capped run far from ``total_steps``: by steps the LR would still be near its peak; with
    ``decay_by=deadline`` it falls with the clock and the last step logs lr * min_lr_ratio."""
    tr, log = _deadline_fit(tmp_path / "a", monkeypatch, "deadline")
    cfg = tr.cfg
    assert cfg.decay_by == "deadline" and 3 < tr.step < 20
    assert log[-1]["step"] == tr.step and log[-1]["lr"] == pytest.approx(cfg.lr * cfg.min_lr_ratio)
    steps_only = lr_multiplier(cfg)
    after_warmup = [r for r in log if r["step"] >= cfg.warmup_steps]
    assert all(r["lr"] < cfg.lr * steps_only(r["step"]) - 1e-9 for r in after_warmup)
    assert [r["lr"] for r in after_warmup] == sorted((r["lr"] for r in after_warmup), reverse=True)
    _, log_steps = _deadline_fit(tmp_path / "b", monkeypatch, "steps")  # the same clock, by steps
    assert log_steps[-1]["step"] == tr.step
    assert log_steps[-1]["lr"] == pytest.approx(cfg.lr * steps_only(tr.step)) and log_steps[-1]["lr"] > 0.9 * cfg.lr


def test_time_budget_covers_the_whole_run_across_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The time used is saved in the checkpoint: resuming a run whose budget is spent takes no step;
    resuming with a larger budget continues the deadline decay from where it stopped (not from the
    peak) and reaches the floor again at the new deadline. The schedule's closure is not saved."""
    wd = tmp_path / "a"
    tr, log = _deadline_fit(wd, monkeypatch, "deadline")
    first, spent = tr.step, tr._elapsed
    assert spent > 60.0
    again, log_again = _deadline_fit(wd, monkeypatch, "deadline")  # same budget: nothing left
    assert again.step == first and log_again == log and again._elapsed >= spent
    assert "time budget is spent" in capsys.readouterr().err
    more, log_more = _deadline_fit(wd, monkeypatch, "deadline", max_minutes=2.0)  # twice the budget
    assert [r["step"] for r in log_more][:first] == list(range(1, first + 1))  # old lines kept
    new = [r for r in log_more if r["step"] > first]
    assert new and more.step > first and more._elapsed > 120.0
    cfg = more.cfg
    floor = cfg.lr * cfg.min_lr_ratio
    # half of the doubled budget was used: the first new step sits mid-decay, below the peak
    assert floor < new[0]["lr"] < 0.6 * cfg.lr
    assert [r["lr"] for r in new] == sorted((r["lr"] for r in new), reverse=True)
    assert new[-1]["lr"] == pytest.approx(floor)
    assert set(more.scheduler.state_dict()["lr_lambdas"]) == {None}


def test_step_budget_run_records_its_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a time budget the elapsed time is still recorded, so a later time-capped resume counts it."""
    wd = tmp_path / "s"
    import genrec.train.trainer as trainer_mod

    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(trainer_mod.time, "perf_counter", lambda: 2.0 * next(ticks))
    cfg = standin.tiny_config(total_steps=5, log_every=1, ckpt_every=0)
    tr = Trainer(standin.TinyNextItem(), standin.make_factory(standin.make_sequences()), cfg, wd, dist_info=DistInfo())
    tr.fit()
    assert tr.step == 5 and tr._elapsed > 0
    tr2 = Trainer(standin.TinyNextItem(), standin.make_factory(standin.make_sequences()),
                  standin.tiny_config(total_steps=10, log_every=1, ckpt_every=0), wd, dist_info=DistInfo())
    assert tr2.resume() and tr2._elapsed == pytest.approx(tr._elapsed)


def test_no_weight_decay_on_norms_biases_embeddings() -> None:
    model = standin.TinyNextItem()
    groups = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = sorted(names[id(p)] for p in groups[0]["params"])
    no_decay = sorted(names[id(p)] for p in groups[1]["params"])
    assert groups[0]["weight_decay"] == 0.05 and groups[1]["weight_decay"] == 0.0
    assert decay == ["gru.weight_hh_l0", "gru.weight_ih_l0", "proj.weight"]
    assert no_decay == ["emb.weight", "gru.bias_hh_l0", "gru.bias_ih_l0", "norm.bias", "norm.weight", "proj.bias"]
    assert len(decay) + len(no_decay) == len(list(model.parameters()))


def test_logs_tensorboard_and_config(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = standin.tiny_config(total_steps=6, log_every=3, tensorboard="true")
    res = Trainer(standin.TinyNextItem(), standin.make_factory(standin.make_sequences()), cfg, tmp_path,
                  config_extra={"model": {"d": 16}}, dist_info=DistInfo()).fit()
    logs = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logs] == [3, 6]
    # the logged loss is the count-weighted mean of the per-step losses in the window
    assert logs[0]["items_per_s"] > 0 and logs[0]["tokens_per_s"] > 0
    assert {"loss", "item", "user_norm", "grad_norm", "lr"} <= set(logs[0])
    assert all(r["loss"] == pytest.approx(r["item"]) for r in res.history)
    assert any((tmp_path / "tb").glob("events.out.tfevents.*"))
    saved = json.loads((tmp_path / "checkpoints" / "config.json").read_text())
    assert saved == {"train": cfg.to_dict(), "model": {"d": 16}}
    assert TrainConfig.from_dict(saved["train"]) == cfg


def test_logged_window_mean_is_count_weighted(tmp_path: Path) -> None:
    class Fixed(nn.Module):
        """loss_t = w·t with n_items = t: the window mean must be Σ loss·n / Σ n."""

        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))
            self.t = 0

        def training_step(self, batch):
            self.t += 1
            return {"loss": self.w * 0 + float(self.t), "n_items": torch.tensor(self.t)}

    cfg = standin.tiny_config(total_steps=3, log_every=3, grad_clip=0)
    Trainer(Fixed(), lambda spec: iter([torch.zeros(2)] * 10), cfg, tmp_path, dist_info=DistInfo()).fit()
    rec = json.loads((tmp_path / "train_log.jsonl").read_text().splitlines()[0])
    assert rec["loss"] == pytest.approx((1 * 1 + 2 * 2 + 3 * 3) / 6)  # not (1+2+3)/3


def test_non_finite_loss_stops_with_a_clear_error(tmp_path: Path) -> None:
    class Diverges(nn.Linear):
        def training_step(self, batch):
            return {"loss": self(batch).sum() * float("nan")}

    cfg = standin.tiny_config(total_steps=6, log_every=2)
    tr = Trainer(Diverges(2, 2), lambda s: iter([torch.ones(1, 2)] * 9), cfg, tmp_path, dist_info=DistInfo())
    with pytest.raises(GenrecError, match="non-finite .* step 2"):
        tr.fit()


def test_protocol_errors(tmp_path: Path) -> None:
    cfg = standin.tiny_config(total_steps=2)
    with pytest.raises(TypeError, match="training_step"):
        Trainer(nn.Linear(2, 2), lambda s: iter([]), cfg, tmp_path, dist_info=DistInfo())

    class NoLoss(nn.Linear):
        def training_step(self, batch):
            return {"item": self(batch).sum()}

    tr = Trainer(NoLoss(2, 2), lambda s: iter([torch.zeros(1, 2)] * 3), cfg, tmp_path, dist_info=DistInfo())
    with pytest.raises(GenrecError, match="'loss'"):
        tr.fit()

    class VecLoss(nn.Linear):
        def training_step(self, batch):
            return {"loss": self(batch).sum(0)}

    tr = Trainer(VecLoss(2, 2), lambda s: iter([torch.zeros(1, 2)] * 3), cfg, tmp_path / "v", dist_info=DistInfo())
    with pytest.raises(GenrecError, match="scalar"):
        tr.fit()


def test_iterator_exhaustion_ends_training(tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = standin.make_sequences()
    seen: list[IterSpec] = []

    def factory(spec: IterSpec):
        seen.append(spec)
        return iter([{"seq": data[:16]}] * 3)

    res = Trainer(standin.TinyNextItem(), factory, standin.tiny_config(total_steps=10), tmp_path,
                  dist_info=DistInfo()).fit()
    assert res.step == 3 and seen == [IterSpec(0, 0, 0, 1, 16, 0)]
    assert resolve_checkpoint(tmp_path / "checkpoints").name == "step-000003"


@pytest.mark.gpu
def test_cuda_bf16_smoke(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = standin.tiny_config(total_steps=8, device="cuda", bf16="true")
    res = Trainer(standin.TinyNextItem(), standin.make_factory(standin.make_sequences()), cfg, tmp_path,
                  dist_info=DistInfo()).fit()
    assert all(math.isfinite(r["loss"]) for r in res.history)
    assert res.history[-1]["loss"] < res.history[0]["loss"]


def test_max_minutes_stops_with_an_eval_and_a_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_minutes``: the step where the clock runs out is treated as the last one (evaluated,
    BEST-marked if best, checkpointed); a fake clock makes the limit hit at a known step."""
    import genrec.train.trainer as trainer_mod

    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(trainer_mod.time, "perf_counter", lambda: 25.0 * next(ticks))  # 25 s per call
    torch.manual_seed(0)
    evals: list[int] = []

    def eval_fn(m: nn.Module) -> dict[str, float]:
        evals.append(1)
        return {"recall@10": 0.5}

    cfg = standin.tiny_config(total_steps=1000, eval_every=0, ckpt_every=0, max_minutes=2.0,
                              **{"early_stopping.metric": "recall@10"})
    res = Trainer(standin.TinyNextItem(), standin.make_factory(standin.make_sequences()), cfg, tmp_path,
                  eval_fn=eval_fn, dist_info=DistInfo()).fit()
    assert 1 < res.step < 20 and not res.stopped_early
    assert evals == [1] and res.best_step == res.step
    assert resolve_checkpoint(tmp_path / "checkpoints", "BEST").name == f"step-{res.step:06d}"
    with pytest.raises(Exception, match="max_minutes"):
        standin.tiny_config(max_minutes=-1.0)
