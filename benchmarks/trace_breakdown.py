"""Where a training step's time goes, by genrec call site: reads a torch.profiler chrome trace written
with Python stacks (``bench_train.py --trace PREFIX``) and sums device time per chain of genrec frames.

    python benchmarks/trace_breakdown.py TRACE.json [--depth 4] [--top 30] [--kernels]

Each GPU kernel is charged to the genrec frames that were on the Python stack when the host launched
it. Kernels launched by the backward (autograd's thread has no Python stack) are charged to the frames
of the forward op with the same autograd sequence number, tagged ``bwd``. Without GPU kernels in the
trace (a CPU run) the leaves are the CPU ops that enclose no other op, with their wall time. A chain
is the genrec frames from outermost to innermost, each ``file:function``, cut to the innermost
``--depth``; frames outside ``genrec/`` are left out. ``--kernels`` adds a table by kernel name (digits
dropped, so inductor's numbered kernels of one kind group together), for compiled steps whose frames are
the compiled graph's.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from typing import Any

_FRAME = re.compile(r"(?:^|/)genrec/(?P<file>[\w/]+)\.py\(\d+\): (?P<fn>\w+)$")


def _nested(frames: list[dict], points: list[tuple[float, Any]]) -> dict[Any, list[dict]]:
    """For each (time, key) point, the frames (X events of one thread) that enclose it, outermost first."""
    frames = sorted(frames, key=lambda e: (e["ts"], -e["dur"]))
    out: dict[Any, list[dict]] = {}
    stack: list[dict] = []
    i = 0
    for t, key in sorted(points, key=lambda p: p[0]):
        while i < len(frames) and frames[i]["ts"] <= t:
            f = frames[i]
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= f["ts"]:
                stack.pop()
            stack.append(f)
            i += 1
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= t:
            stack.pop()
        out[key] = [f for f in stack if f["ts"] + f["dur"] > t]
    return out


def _chain(frames: list[dict], depth: int) -> tuple[str, ...]:
    names = []
    for f in frames:
        m = _FRAME.search(f["name"])
        if m and not m["file"].startswith("bench"):
            names.append(f"{m['file'].split('/')[-1]}:{m['fn']}")
    return tuple(names[-depth:]) if names else ("(outside genrec)",)


def breakdown(events: list[dict], depth: int) -> dict[tuple[str, tuple[str, ...]], float]:
    """-> {(phase, chain): microseconds}; phase is ``fwd``, ``bwd``, ``opt`` (under an optimiser frame) or ``?``
    (a kernel whose launch the trace lacks)."""
    by_tid: dict[Any, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("python_function", "cpu_op", "cuda_runtime", "cuda_driver"):
            # a launch by the runtime (most of torch) or by the driver (Triton's kernels)
            by_tid[e["tid"]]["launch" if e["cat"].startswith("cuda_") else e["cat"]].append(e)
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    launch = {e["args"].get("correlation"): e for d in by_tid.values() for e in d["launch"]}
    leaves: list[tuple[dict, float]] = []  # (host event the work is charged through, microseconds)
    totals: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
    if kernels:
        for k in kernels:
            host = launch.get(k["args"].get("correlation"))
            if host is not None:
                leaves.append((host, k["dur"]))
            else:
                totals[("?", ("(launch not in the trace)",))] += k["dur"]
    else:
        for d in by_tid.values():
            ops = sorted(d["cpu_op"], key=lambda e: (e["ts"], -e["dur"]))
            for j, e in enumerate(ops):
                nxt = ops[j + 1] if j + 1 < len(ops) else None
                if nxt is None or nxt["ts"] >= e["ts"] + e["dur"]:  # encloses no other op
                    leaves.append((e, e["dur"]))
    # the forward op of each autograd sequence number: its Python frames
    fwd_frames: dict[int, list[dict]] = {}
    seq_ops: dict[int, dict] = {}
    for d in by_tid.values():
        for e in d["cpu_op"]:
            seq = e.get("args", {}).get("Sequence number")
            if seq is not None and "Backward" not in e["name"] and "evaluate_function" not in e["name"]:
                if seq not in seq_ops or e["dur"] > seq_ops[seq]["dur"]:
                    seq_ops[seq] = e
    for tid, d in by_tid.items():
        mine = [(e["ts"], s) for s, e in seq_ops.items() if e["tid"] == tid]
        fwd_frames.update(_nested(d["python_function"], mine))
    for tid, d in by_tid.items():
        mine = [(h, us) for h, us in leaves if h["tid"] == tid]
        if not mine:
            continue
        stacks = _nested(d["python_function"], [(h["ts"], id(h)) for h, _ in mine])
        ops = _nested(d["cpu_op"], [(h["ts"], id(h)) for h, _ in mine])
        for h, us in mine:
            frames = stacks.get(id(h), [])
            phase = "fwd"
            bwd = [o for o in ops.get(id(h), []) + [h] if "Backward" in o["name"]
                   and o.get("args", {}).get("Sequence number") is not None]
            if bwd:
                phase = "bwd"
                frames = fwd_frames.get(bwd[0]["args"]["Sequence number"], [])
            elif any("optimizer" in f["name"].lower() or "adamw" in f["name"].lower() for f in frames):
                phase = "opt"
            totals[(phase, _chain(frames, depth))] += us
    return totals


def by_kernel(events: list[dict]) -> dict[str, float]:
    """-> {kernel name with digits dropped, cut to 70 characters: microseconds}."""
    out: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            out[re.sub(r"\d+", "#", e["name"])[:70]] += e["dur"]
    return out


def gpu_span(events: list[dict]) -> tuple[float, float]:
    """-> (microseconds from the first kernel's start to the last one's end, microseconds with a kernel
    running): their gap is the time the GPU waited, on the host or otherwise."""
    ks = sorted(((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"))
    if not ks:
        return 0.0, 0.0
    busy, end = 0.0, ks[0][0]
    for a, z in ks:  # union of the intervals (kernels of several streams may overlap)
        if z > end:
            busy += z - max(a, end)
            end = z
    return ks[-1][1] - ks[0][0], busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--kernels", action="store_true", help="also a table by kernel name")
    a = ap.parse_args()
    for path in a.traces:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        totals = breakdown(events, a.depth)
        by_phase: dict[str, float] = defaultdict(float)
        for (phase, _), us in totals.items():
            by_phase[phase] += us
        print(f"== {path}: " + ", ".join(f"{p} {us / 1e3:.2f} ms" for p, us in sorted(by_phase.items()))
              + f", total {sum(by_phase.values()) / 1e3:.2f} ms")
        span, busy = gpu_span(events)
        if span:
            print(f"   kernels from first start to last end {span / 1e3:.2f} ms, some kernel running {busy / 1e3:.2f} ms "
                  f"({100 * busy / span:.0f}%)")
        print(f"{'ms':>8s} {'phase':5s} chain")
        for (phase, chain), us in sorted(totals.items(), key=lambda kv: -kv[1])[: a.top]:
            print(f"{us / 1e3:8.3f} {phase:5s} {' > '.join(chain)}")
        if a.kernels:
            print(f"{'ms':>8s} kernel")
            for name, us in sorted(by_kernel(events).items(), key=lambda kv: -kv[1])[: a.top]:
                print(f"{us / 1e3:8.3f} {name}")


if __name__ == "__main__":
    main()
