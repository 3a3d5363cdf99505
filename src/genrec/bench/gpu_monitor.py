"""The clock a GPU timing was taken at: samples the SM clock, the power draw and the active
clock-event ("throttle") reasons with ``nvidia-smi`` while a workload runs.

An H200 at its 700 W limit lowers its SM clock by different amounts for different kernels (1.47 to
1.73 GHz under the training-attention workloads), so two timings taken minutes
apart, or one kernel against another, can differ by the clock as much as by the code. The
benchmarks print the clock beside each sustained timing.

    with GpuMonitor() as mon:
        ...  # run the workload for a second or more
    mon.result  # GpuSample(clock_mhz=..., power_w=..., reasons=("sw_power_cap",), n=...) or None

No ``nvidia-smi`` on the PATH (a CPU machine), or no usable samples: ``result`` is None.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
from dataclasses import dataclass
from types import TracebackType

FIELDS = ("clocks.sm", "power.draw", "power.limit", "clocks_event_reasons.active")

# nvidia-smi's clocks_event_reasons bits (``nvidia-smi -q -d PERFORMANCE`` names them)
REASON_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


@dataclass(frozen=True)
class GpuSample:
    """Medians over the samples taken while a workload ran, and every clock-event reason seen."""

    clock_mhz: float
    power_w: float
    power_limit_w: float
    reasons: tuple[str, ...]
    n: int


def decode_reasons(mask: int) -> tuple[str, ...]:
    """The names of the bits set in an ``clocks_event_reasons.active`` mask (unknown bits as hex)."""
    names = [name for bit, name in REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(REASON_BITS)
    return tuple(names + ([hex(rest)] if rest else []))


def parse_samples(text: str, skip: int = 1) -> GpuSample | None:
    """Summarise ``nvidia-smi --query-gpu=<FIELDS> --format=csv,noheader,nounits`` output. The first
    ``skip`` samples are dropped (they may predate the load) unless nothing else is left; rows that do not
    parse ("[N/A]", a header) are ignored. None when no row parses."""
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        try:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2]), int(parts[3], 16)))
        except ValueError:
            continue
    if not rows:
        return None
    rows = rows[skip:] or rows
    mask = 0
    for r in rows:
        mask |= r[3]
    return GpuSample(clock_mhz=statistics.median(r[0] for r in rows), power_w=statistics.median(r[1] for r in rows),
                     power_limit_w=rows[0][2], reasons=decode_reasons(mask), n=len(rows))


class GpuMonitor:
    """A context manager that runs ``nvidia-smi -lms interval_ms`` for GPU ``index`` while its body runs;
    ``result`` (a :class:`GpuSample` or None) is set on exit. It never raises for want of
    ``nvidia-smi``: a benchmark goes on without the clock."""

    def __init__(self, interval_ms: int = 100, index: int = 0) -> None:
        self.interval_ms, self.index = interval_ms, index
        self.result: GpuSample | None = None
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> GpuMonitor:
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            self._proc = subprocess.Popen(
                [exe, f"--id={self.index}", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits",
                 "-lms", str(self.interval_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            out, _ = self._proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
        self.result = parse_samples(out or "")


def describe(s: GpuSample | None) -> str:
    """One line: clock, power and reasons, or that there was no sample."""
    if s is None:
        return "no clock sample (nvidia-smi missing or silent)"
    return (f"SM clock {s.clock_mhz:.0f} MHz, power {s.power_w:.0f} W of {s.power_limit_w:.0f}, "
            f"reasons {','.join(s.reasons) or 'none'} [{s.n} samples]")
