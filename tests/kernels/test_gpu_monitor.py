"""genrec.bench.gpu_monitor: nvidia-smi's samples parsed into the clock a timing ran at; without
nvidia-smi the monitor yields no sample and does not fail (CI has no GPU)."""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from genrec.bench.gpu_monitor import GpuMonitor, decode_reasons, describe, parse_samples

SMI_LINES = """\
345, 78.21, 700.00, 0x0000000000000001
1590, 693.10, 700.00, 0x0000000000000004
1610, 698.00, 700.00, 0x0000000000000004
[N/A], [N/A], 700.00, 0x0000000000000004
1570, 690.50, 700.00, 0x0000000000000024
"""


def test_parse_samples_takes_medians_and_every_reason() -> None:
    s = parse_samples(SMI_LINES)
    assert s is not None
    # the first (idle) sample is dropped, the unparsable one ignored: clocks 1590, 1610, 1570
    assert s.n == 3
    assert s.clock_mhz == 1590 and s.power_w == 693.10 and s.power_limit_w == 700.0
    assert s.reasons == ("sw_power_cap", "sw_thermal_slowdown")
    assert "1590 MHz" in describe(s) and "sw_power_cap" in describe(s)


def test_parse_samples_edge_cases() -> None:
    assert parse_samples("") is None
    assert parse_samples("clocks.sm [MHz], power.draw [W]\ngarbage\n") is None
    one = parse_samples("1400, 650, 700, 0x0\n")  # a single sample is kept even though skip=1
    assert one is not None and one.n == 1 and one.reasons == ()
    assert decode_reasons(0x4 | 0x1000) == ("sw_power_cap", "0x1000")
    assert describe(None).startswith("no clock sample")


def test_monitor_without_nvidia_smi_yields_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no nvidia-smi
    with GpuMonitor() as mon:
        pass
    assert mon.result is None


def test_monitor_runs_and_stops_a_sampler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A stand-in executable named nvidia-smi on the PATH, printing a sample every 20 ms until
    # terminated: the monitor must start it with the query, stop it on exit and parse what it printed.
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/args\"\n"
                   "while true; do echo '1700, 650.5, 700.00, 0x0000000000000004'; sleep 0.02; done\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with GpuMonitor(interval_ms=20) as mon:
        time.sleep(0.3)
    assert mon.result is not None and mon.result.n >= 2
    assert mon.result.clock_mhz == 1700 and mon.result.reasons == ("sw_power_cap",)
    args = (tmp_path / "args").read_text()
    assert "--query-gpu=clocks.sm,power.draw,power.limit,clocks_event_reasons.active" in args and "-lms 20" in args
