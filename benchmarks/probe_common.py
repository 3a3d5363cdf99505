"""What the GPU probes share: the command line of a probe that runs each variant in its own process,
that run, the versions header, and the matmul ceiling timed in the same run."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch


def probe_args(steps: int) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--variant", default="")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per variant subprocess")
    ap.add_argument("--compile-only", action="store_true")
    return ap


def run_isolated(script: str, variant: str, a: argparse.Namespace) -> tuple[str, bool]:
    """Run ``script --variant VARIANT`` in its own process (a fault or a hang costs that variant only):
    -> (its output, with stderr's tail if it failed; whether it timed out)."""
    cmd = [sys.executable, script, "--variant", variant, "--iters", str(a.iters), "--steps", str(a.steps)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        return r.stdout + ("" if r.returncode == 0 else f"\n    (exit {r.returncode})\n" + r.stderr[-3000:]), False
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return out + f"\n    TIMEOUT after {a.timeout} s (hang?)", True


def run_variants(script: str, variants, a: argparse.Namespace) -> dict[str, dict]:
    """``run_isolated`` for each variant in turn: prints its output (warnings dropped) under a ``--- name``
    header and returns the JSON of its ``RESULT {...}`` line per variant (none if it printed none)."""
    results = {}
    for variant in variants:
        print(f"--- {variant}", flush=True)
        text, _ = run_isolated(script, variant, a)
        for ln in text.splitlines():
            if ln.startswith("RESULT "):
                results[variant] = json.loads(ln[7:])
            elif "warn" not in ln.lower():
                print(ln, flush=True)
    return results


def matmul_peak(iters: int) -> float:
    """Print the versions, then time an 8,192^3 bf16 matmul from a CUDA graph: TFLOP/s, this run's ceiling."""
    import triton

    from genrec.bench.kernels import _time_graph

    print(f"triton {triton.__version__} ({Path(triton.__file__).parent}), torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    def ms() -> float:
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        return _time_graph(lambda: x @ x, 3, iters, reps=5)

    peak = 2 * 8192**3 / ms() / 1e9
    torch.cuda.empty_cache()
    print(f"bf16 matmul 8192^3: {peak:.1f} TFLOP/s", flush=True)
    return peak
