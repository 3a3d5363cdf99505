"""benchmarks/trace_breakdown.py charges each GPU kernel to the genrec frames that launched it, and a
backward kernel to the frames of the forward op with its autograd sequence number, on a hand-built trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "trace_breakdown.py"


@pytest.fixture
def tb(benchmark_script):  # type: ignore[no-untyped-def]
    return benchmark_script("trace_breakdown")


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "args": args}


def _trace() -> list[dict]:
    src = "/x/src/genrec"
    return [
        # the forward, on the main thread: objective -> fusion, then objective -> backbone
        _x("python_function", f"{src}/train/objective.py(154): training_step", 0, 100),
        _x("python_function", f"{src}/model/fusion.py(68): forward_codes", 10, 20),
        _x("python_function", "torch/nn/functional.py(2100): linear", 12, 10),
        _x("cpu_op", "aten::linear", 14, 6, **{"Sequence number": 7}),
        _x("cuda_runtime", "cudaLaunchKernel", 15, 1, correlation=1),
        _x("python_function", f"{src}/model/backbone.py(81): forward", 40, 50),
        _x("cpu_op", "aten::mm", 50, 5, **{"Sequence number": 8}),
        _x("cuda_driver", "cuLaunchKernelEx", 51, 1, correlation=2),  # a Triton launch
        # the backward, on autograd's thread: no Python frames; sequence numbers lead back
        _x("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 200, 10, tid=2, **{"Sequence number": 7}),
        _x("cpu_op", "MmBackward0", 201, 8, tid=2, **{"Sequence number": 7}),
        _x("cuda_runtime", "cudaLaunchKernel", 202, 1, tid=2, correlation=3),
        # kernels
        _x("kernel", "gemm_a", 300, 3, tid=9, correlation=1),
        _x("kernel", "triton_poi_fused_add_12", 310, 4, tid=9, correlation=2),
        _x("kernel", "gemm_b", 320, 6, tid=9, correlation=3),
        _x("kernel", "orphan", 330, 2, tid=9, correlation=99),
    ]


def test_kernels_are_charged_to_their_launching_frames_and_the_backward_to_its_forward(tb) -> None:
    totals = tb.breakdown(_trace(), depth=3)
    assert totals == {
        ("fwd", ("objective:training_step", "fusion:forward_codes")): 3,
        ("fwd", ("objective:training_step", "backbone:forward")): 4,
        ("bwd", ("objective:training_step", "fusion:forward_codes")): 6,
        ("?", ("(launch not in the trace)",)): 2,
    }
    assert tb.breakdown(_trace(), depth=1)[("bwd", ("fusion:forward_codes",))] == 6


def test_kernel_table_groups_numbered_kernels(tb, tmp_path: Path) -> None:
    kernels = tb.by_kernel(_trace() + [_x("kernel", "triton_poi_fused_add_7", 400, 5, tid=9, correlation=4)])
    assert kernels["triton_poi_fused_add_#"] == 9
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _trace()}))
    out = subprocess.run([sys.executable, str(SCRIPT), str(path), "--kernels"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "fwd 0.01 ms" in out.stdout and "objective:training_step > fusion:forward_codes" in out.stdout


def test_gpu_span_counts_overlapping_kernels_once(tb) -> None:
    events = [_x("kernel", "a", 0, 10, tid=9), _x("kernel", "b", 5, 10, tid=8), _x("kernel", "c", 30, 5, tid=9)]
    assert tb.gpu_span(events) == (35, 20)
    assert tb.gpu_span([]) == (0.0, 0.0)


def test_without_kernels_the_leaf_cpu_ops_are_charged(tb) -> None:
    events = [e for e in _trace() if e["cat"] in ("python_function", "cpu_op")]
    totals = tb.breakdown(events, depth=3)
    # leaves: aten::linear (6) under fusion, aten::mm (5) under backbone, MmBackward0 (8) inside its evaluate_function
    assert totals[("fwd", ("objective:training_step", "fusion:forward_codes"))] == 6
    assert totals[("fwd", ("objective:training_step", "backbone:forward"))] == 5
    assert totals[("bwd", ("objective:training_step", "fusion:forward_codes"))] == 8
