"""Checkpoints: exact round trip (weights, AdamW, LambdaLR, RNG), no pickle, pruning, and a
SIGKILL during a write leaving the previous checkpoint loadable with LATEST pointing at it."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from torch import nn

from genrec.train import checkpoint as ck
from genrec.train.checkpoint import (
    CheckpointError,
    flatten_state,
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    unflatten_state,
)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 4)
        self.mid = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.out = nn.Linear(4, 11, bias=False)
        self.out.weight = self.emb.weight  # tied
        self.register_buffer("counter", torch.zeros(3, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(torch.relu(self.mid(self.emb(x)))))


def _trained(seed: int = 0, steps: int = 3):
    torch.manual_seed(seed)
    model = Tied()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    for _ in range(steps):
        x = torch.randint(0, 11, (5,))
        loss = nn.functional.cross_entropy(model(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.counter += 7
    return model, opt, sched


def test_roundtrip_is_exact(tmp_path: Path) -> None:
    model, opt, sched = _trained()
    path = save_checkpoint(tmp_path, 3, model, opt, sched, {"sid_version": "v0002", "n": 3},
                           config={"train": {"lr": 0.01}})
    assert path.name == "step-000003" and (tmp_path / "LATEST").read_text().strip() == "step-000003"
    after_save = (torch.rand(3), np.random.rand(2), random.random())

    fresh, fopt, fsched = _trained(seed=1, steps=1)
    extra = load_checkpoint(tmp_path, fresh, fopt, fsched)
    assert extra == {"sid_version": "v0002", "n": 3}
    for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), k
    assert fresh.out.weight is fresh.emb.weight  # tying survives
    s1, s2 = opt.state_dict(), fopt.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for i in s1["state"]:
        for k in s1["state"][i]:
            assert torch.equal(s1["state"][i][k], s2["state"][i][k])
    assert fsched.state_dict()["last_epoch"] == sched.state_dict()["last_epoch"] == 3
    assert fopt.param_groups[0]["betas"] == (0.8, 0.95)  # tuples come back as tuples
    # RNG restored: the same draws as right after saving
    again = (torch.rand(3), np.random.rand(2), random.random())
    assert torch.equal(after_save[0], again[0]) and np.array_equal(after_save[1], again[1])
    assert after_save[2] == again[2]
    # both runs continue identically
    x = torch.randint(0, 11, (5,))
    for m, o in ((model, opt), (fresh, fopt)):
        o.zero_grad()
        nn.functional.cross_entropy(m(x), x).backward()
        o.step()
    assert torch.equal(model.mid.weight, fresh.mid.weight)


class FlatViews(nn.Module):
    """Parameters that are partial views of one flat storage, as cuDNN lays out RNN weights on CUDA."""

    def __init__(self) -> None:
        super().__init__()
        base = torch.randn(10)
        self.w1 = nn.Parameter(torch.empty(0))
        self.w2 = nn.Parameter(torch.empty(0))
        self.w1.data = base[:4].view(2, 2)
        self.w2.data = base[4:]


def test_partial_views_of_one_storage_are_saved_apart(tmp_path: Path) -> None:
    torch.manual_seed(0)
    src = FlatViews()
    assert src.w1.untyped_storage().data_ptr() == src.w2.untyped_storage().data_ptr()
    ck.save_weights(src, tmp_path / "w.safetensors")
    dst = FlatViews()
    ck.load_weights(dst, tmp_path / "w.safetensors")
    assert torch.equal(dst.w1, src.w1) and torch.equal(dst.w2, src.w2)
    # tied (exact alias) tensors are stored once and restored under both names
    tied = Tied()
    ck.save_weights(tied, tmp_path / "t.safetensors")
    assert set(load_file(str(tmp_path / "t.safetensors"))) == set(tied.state_dict()) - {"out.weight"}
    (tmp_path / "torn.safetensors").write_bytes(b"\x10\x00garbage")
    with pytest.raises(CheckpointError, match="torn.safetensors"):
        ck.load_weights(tied, tmp_path / "torn.safetensors")


def test_no_pickle_only_safetensors_and_json(tmp_path: Path) -> None:
    model, opt, sched = _trained()
    path = save_checkpoint(tmp_path, 1, model, opt, sched, {}, config={"a": 1})
    names = sorted(p.name for p in path.iterdir())
    assert names == ["config.json", "extra.json", "meta.json", "model.safetensors", "state.json", "state.safetensors"]
    for p in path.iterdir():
        head = p.read_bytes()[:2]
        assert head != b"\x80\x04" and head != b"PK", f"{p.name} looks like a pickle/zip"
    assert "mid.weight" in load_file(str(path / "model.safetensors"))
    assert ck.load_config_dict(tmp_path) == {"a": 1}


def test_keep_last_and_best_is_protected(tmp_path: Path) -> None:
    model, opt, sched = _trained(steps=1)
    for step in range(1, 7):
        save_checkpoint(tmp_path, step, model, opt, sched, {"s": step}, keep_last=2, mark_best=(step == 2))
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 5, 6]
    assert resolve_checkpoint(tmp_path) == tmp_path / "step-000006"
    assert resolve_checkpoint(tmp_path, "BEST") == tmp_path / "step-000002"
    assert load_checkpoint(tmp_path, model, which="BEST", restore_rng=False) == {"s": 2}
    assert ck.checkpoint_step(tmp_path) == 6


def test_errors_name_the_problem(tmp_path: Path) -> None:
    model, opt, sched = _trained(steps=1)
    assert resolve_checkpoint(tmp_path / "nothing") is None
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path, model)
    save_checkpoint(tmp_path, 1, model, opt, sched, {})
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(tmp_path, nn.Linear(3, 3))
    (tmp_path / "LATEST").write_text("step-000009\n")
    with pytest.raises(CheckpointError, match="step-000009"):
        load_checkpoint(tmp_path, model)
    with pytest.raises(CheckpointError, match="without pickle"):
        save_checkpoint(tmp_path, 2, model, opt, sched, {"bad": object()})
    (tmp_path / "LATEST").write_text("../etc\n")
    with pytest.raises(CheckpointError, match="does not name"):
        resolve_checkpoint(tmp_path)


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=5),
                  st.floats(allow_nan=False), st.just(math.inf), st.just(-math.inf))
_tree = st.recursive(_leaf, lambda c: st.one_of(
    st.lists(c, max_size=3), st.tuples(c, c), st.dictionaries(st.one_of(st.integers(0, 9), st.text(max_size=3)),
                                                               c, max_size=3)), max_leaves=12)


@settings(deadline=None, max_examples=50)
@given(_tree)
def test_flatten_roundtrip(tree) -> None:
    import json

    tensors: dict[str, torch.Tensor] = {}
    skel = json.loads(json.dumps(flatten_state(tree, tensors, "x")))
    assert unflatten_state(skel, tensors) == tree


def test_flatten_tensors_and_nan() -> None:
    tensors: dict[str, torch.Tensor] = {}
    obj = {0: {"step": torch.tensor(3.0), "m": torch.arange(4)}, "r": np.arange(3, dtype=np.uint32), "n": math.nan}
    back = unflatten_state(flatten_state(obj, tensors, "o"), tensors)
    assert torch.equal(back[0]["m"], obj[0]["m"]) and back["r"].dtype == np.uint32
    assert np.array_equal(back["r"], obj["r"]) and math.isnan(back["n"])


def test_crash_before_pointer_update_keeps_old_latest(tmp_path: Path, monkeypatch) -> None:
    model, opt, sched = _trained(steps=1)
    save_checkpoint(tmp_path, 1, model, opt, sched, {"s": 1})

    def boom(path, data):
        raise KeyboardInterrupt("killed while updating LATEST")

    monkeypatch.setattr(ck, "atomic_write_bytes", boom)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, model, opt, sched, {"s": 2})
    monkeypatch.undo()
    assert load_checkpoint(tmp_path, model, restore_rng=False) == {"s": 1}


_KILL_SCRIPT = textwrap.dedent("""
    import sys, time, torch
    from torch import nn
    import genrec.train.checkpoint as ck

    root = sys.argv[1]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    opt = torch.optim.AdamW(model.parameters())
    ck.save_checkpoint(root, 1, model, opt, None, {"s": 1})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    real = ck.save_weights

    def slow_save(m, filename, metadata=None):
        real(m, filename, metadata=metadata)
        with open(filename, "r+b") as f:   # leave a torn file behind, as a kill mid-write would
            f.truncate(64)
        print("WRITING", flush=True)
        time.sleep(120)

    ck.save_weights = slow_save
    ck.save_checkpoint(root, 2, model, opt, None, {"s": 2})
    print("FINISHED", flush=True)
""")


def test_sigkill_during_write_leaves_previous_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_KILL_SCRIPT)
    root = tmp_path / "ckpts"
    proc = subprocess.Popen([sys.executable, str(script), str(root)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = proc.stdout.readline()
        assert line.strip() == "WRITING", line
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    assert (root / "LATEST").read_text().strip() == "step-000001"
    assert any(p.name.startswith(".tmp-step-000002") for p in root.iterdir())  # the torn write is set aside
    assert not (root / "step-000002").exists()
    torch.manual_seed(0)
    expected = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    target = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    assert load_checkpoint(root, target, restore_rng=False) == {"s": 1}
    for a, b in zip(expected.state_dict().values(), target.state_dict().values()):
        assert torch.equal(a, b)
    # the next save cleans the leftover
    save_checkpoint(root, 3, target, None, None, {})
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())
