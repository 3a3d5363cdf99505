"""`genrec serve` says what it is doing (issue 38 item 2): the URL it listens on, the checkpoint and the served
index_version it loaded, the device, and when it is ready; --access-log turns uvicorn's access log on (off by
default). And its default --threads follows the machine (issue 38 item 3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from genrec.cli import app
from genrec.serve.loadgen import _free_port

START_TIMEOUT_S = 150.0  # torch's import and the bundle's load on a busy 2-core box


class _Server:
    """A child `genrec serve` whose stdout and stderr (together) are read line by line as they come."""

    def __init__(self, run_dir: Path, *extra: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "genrec.cli", "serve", str(run_dir), "--port",
                                      str(self.port), *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> str:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            hit = next((x for x in list(self.lines) if text in x), None)
            if hit is not None:
                return hit
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} within {timeout:.0f} s (exit code {self.proc.poll()}); "
                             f"output so far:\n{self.output}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)


@pytest.mark.parametrize("access_log", [False, True], ids=["default", "access-log"])
def test_serve_says_where_it_listens_what_it_loaded_and_when_it_is_ready(run_dir: Path, access_log: bool) -> None:
    srv = _Server(run_dir, *(["--access-log"] if access_log else []))
    try:
        ready = srv.wait_for("ready on", START_TIMEOUT_S)
        assert srv.url in ready, srv.output
        body = httpx.get(srv.url + "/readyz", timeout=10).json()
        version = body["index_version"]
        assert version and f"index_version {version}" in ready, srv.output
        out = srv.output
        assert f"starting on {srv.url}" in out, out
        loaded = next(x for x in srv.lines if "loaded checkpoint" in x)
        assert "device cpu" in loaded and version in loaded and str(run_dir) in loaded, out
        cores = os.cpu_count() or 1
        threads = min(4, cores)  # the machine's defaults (test_default_threads_follow_the_machine)
        torch_threads = max(1, cores // threads)
        assert (f"{threads} request thread{'s' if threads > 1 else ''} x {torch_threads} torch "
                f"thread{'s' if torch_threads > 1 else ''}") in loaded, loaded
        assert f"access log {'on' if access_log else 'off'}" in out, out
        # the lines come in order: where, what was loaded, ready
        assert out.index("starting on") < out.index("loaded checkpoint") < out.index("ready on"), out
        assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 200
        if access_log:
            srv.wait_for('"GET /healthz HTTP/1.1" 200', 10)
        else:
            time.sleep(0.5)  # (an access line would be written before the response is sent)
            assert "HTTP/1.1\" 200" not in srv.output, srv.output
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- --threads' default
def test_default_threads_follow_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from genrec.serve.config import default_threads, default_torch_threads

    for cores, threads in ((1, 1), (2, 2), (3, 3), (4, 4), (16, 4), (64, 4)):
        monkeypatch.setattr(os, "cpu_count", lambda c=cores: c)
        assert default_threads("cpu") == default_threads("cuda") == threads, cores
        # the forwards side by side use each core once; on a GPU torch keeps its own default (0)
        assert default_torch_threads("cpu") == max(1, cores // threads), cores
        assert default_torch_threads("cuda:0") == 0
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert default_torch_threads("cpu", threads=2) == 8 and default_torch_threads("cpu", threads=4, workers=2) == 2
    assert default_torch_threads("cpu", threads=64) == 1
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one of each
    assert default_threads("cpu") == 1 and default_torch_threads("cpu") == 1


def test_serve_and_service_take_the_machine_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import genrec.infer.load as load
    import genrec.serve.app as appmod
    from genrec.serve.config import ServeConfig
    from genrec.serve.service import Service

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert Service(ServeConfig(workdir=tmp_path)).cfg.threads == 4  # the library's default
    assert Service(ServeConfig(workdir=tmp_path, threads=2)).cfg.threads == 2

    got: dict[str, Any] = {}
    monkeypatch.setattr(load, "find_checkpoint", lambda *a, **k: tmp_path)
    monkeypatch.setattr(appmod, "serve", lambda cfg, **kw: got.update(cfg=cfg, **kw))
    monkeypatch.delenv("GENREC_PRECISION", raising=False)  # (set by the command; put back afterwards)
    hup = signal.getsignal(signal.SIGHUP)
    try:
        for argv, threads, torch_threads in (([], 4, 2), (["--threads", "2"], 2, 4), (["--workers", "2"], 4, 1),
                                             (["--torch-threads", "3"], 4, 3), (["--device", "cuda"], 4, 0)):
            r = CliRunner().invoke(app, ["serve", str(tmp_path), *argv])
            assert r.exit_code == 0, r.output
            cfg = got["cfg"]
            assert (cfg.threads, cfg.torch_threads) == (threads, torch_threads), argv
            assert cfg.announce and got["access_log"] is False, argv
        r = CliRunner().invoke(app, ["serve", str(tmp_path), "--access-log"])
        assert r.exit_code == 0 and got["access_log"] is True, r.output
        for bad in ("--threads", "--torch-threads"):
            r = CliRunner().invoke(app, ["serve", str(tmp_path), bad, "0"])
            assert r.exit_code == 2 and f"{bad} must be >= 1" in r.output, r.output
    finally:
        signal.signal(signal.SIGHUP, hup)  # (the command ignores SIGHUP until the server's handler takes over)
