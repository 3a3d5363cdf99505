"""benchmarks/sweep_item_block.py: exits cleanly without a GPU; its --tiny mode runs end to end
(checks, timings, composite, JSON) on CPU under TRITON_INTERPRET=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SWEEP = Path(__file__).resolve().parents[2] / "benchmarks" / "sweep_item_block.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU exit path only exists without a GPU")
def test_sweep_exits_cleanly_without_gpu(benchmark_script, capsys: pytest.CaptureFixture[str]) -> None:
    mod = benchmark_script("sweep_item_block")
    assert mod.main([]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


def test_sweep_tiny_smoke_run_under_interpreter(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "sweep.json"
    args = [sys.executable, str(SWEEP), "--tiny", "--iters", "1", "--warmup", "0", "--out", str(out)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["errors"] == []
    assert result["checks"] and all(c["status"] == "ok" for c in result["checks"])
    assert len(result["coupled"]) == 1 and result["coupled"][0]["name"] == "bm64 bn64"  # the original default
    assert {r["kernel"] for r in result["per_kernel"]} == {"dq", "dense_kv", "sid_kv"}
    (comp,) = result["composite"]
    assert comp["config"]["split_tail"] and comp["config"]["fuse_delta"] and comp["config"]["fuse_sid_kv"]
    assert all(r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in result["coupled"] + result["composite"])
    assert set(next(iter(result["breakdown"].values()))) == {"original default", "composite"}
    assert "sorted by fwd+bwd" in proc.stdout
