"""``genrec bench kernels`` (genrec.bench.kernels + genrec.bench.decode, also reachable as
benchmarks/bench_kernels.py) imports on a CPU machine and exits cleanly with a message; its tiny
smoke run works under the Triton interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kernels.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU exit path only exists without a GPU")
def test_bench_exits_cleanly_without_gpu(benchmark_script, capsys: pytest.CaptureFixture[str]) -> None:
    mod = benchmark_script("bench_kernels")
    assert mod.main(["--quick"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


def test_bench_tiny_smoke_run_under_interpreter(tmp_path: Path) -> None:
    """The whole script (checks, timings, JSON) on tiny shapes, CPU + TRITON_INTERPRET=1."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    args = [sys.executable, str(BENCH), "--tiny", "--quick", "--iters", "1", "--warmup", "0", "--sustain", "0.01"]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no CUDA GPU" not in proc.stdout
    result = json.loads((tmp_path / "bench_kernels.json").read_text())
    assert result["errors"] == []
    assert result["checks"] and all(c["status"] == "ok" for c in result["checks"].values())
    assert {r["impl"] for r in result["train"]} >= {"item-block (tuned)", "item-block triton only (tuned)", "sdpa explicit mask"}
    # --sustain: every row also timed back to back (its clock columns only where nvidia-smi answers)
    assert all(r["sustained_ms"] > 0 and r.get("sm_clock_mhz", 1) > 0 for r in result["train"]), result["train"]
    assert "sustained" in proc.stdout
    assert len(result["cascade"]) == 2 and all(r["triton_ms"] is not None for r in result["cascade"])
    assert all(r["triton_s1_trusted_ms"] > 0 for r in result["cascade"])  # per call as the decode calls it
    assert all(r["b2b_triton_s1_trusted_ms"] > 0 and r["b2b_per_beam_ms"] > 0 for r in result["cascade"])  # back to back
    assert "b2b x" in proc.stdout
    assert "correctness checks" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs the CPU (interpreter) path")
@pytest.mark.parametrize("fault", ["raises", "fails"])
def test_bench_fails_when_a_check_fails_or_cannot_run(fault: str, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A check that fails, or that cannot run at all (on the H200 a kernel once failed to launch inside the
    checks), makes the run exit 1 and say which: the timings after it are not to be trusted."""
    from genrec.bench import kernels as bk

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(bk, "RESULTS", {k: type(v)() for k, v in bk.RESULTS.items()})

    def broken_checks() -> None:
        if fault == "raises":
            raise RuntimeError("out of resource: shared memory")
        bk.RESULTS["checks"]["item_block D=128 float32"] = {"out": 0.5, "status": "FAIL"}

    monkeypatch.setattr(bk, "check_correctness", broken_checks)
    assert bk.main(["--tiny", "--only", "correctness"]) == 1
    err = capsys.readouterr().err
    assert ("out of resource" in err) if fault == "raises" else ("item_block D=128 float32" in err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU exit path only exists without a GPU")
def test_cli_bench_kernels_without_gpu() -> None:
    from typer.testing import CliRunner

    from genrec.cli import app

    r = CliRunner().invoke(app, ["bench", "kernels", "--quick"])
    assert r.exit_code == 0, r.output
    assert "no CUDA GPU" in r.output


def test_the_machine_a_figure_came_from() -> None:
    from genrec.bench.timing import machine

    m = machine()
    assert m["cpus"] == os.cpu_count() and m["machine"]
    assert m["gpu"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "model name" in info:  # the model name /proc/cpuinfo gives, not the platform's generic one
        assert m["cpu_model"] and f"model name\t: {m['cpu_model']}\n" in info
