"""The multi-process load generator (:mod:`genrec.serve.loadtest`): clients spread over processes answer what
the one-process client answers against the real service, every request counted once, with the client
processes' CPU; the process-tree CPU reading counts a child's work."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genrec.errors import ConfigError
from genrec.serve.config import ServeConfig
from genrec.serve.loadgen import run_load
from genrec.serve.loadtest import ClientProcs, drive, proc_tree_cpu_s, run_load_procs, split
from genrec.serve.schemas import INT64

from ._server import ServerThread, serving

# good histories and histories whose item id is out of the int64 range (422)
MIX = [[1, 50, 172], [INT64 + 1], [7, 9, 99999999], [2 ** 64, 3]]
BODY = {"k": 3, "beam_width": 4, "rank": True}


@pytest.fixture(scope="module")
def server(run_dir: Path):
    yield from serving(ServeConfig(workdir=run_dir))


def test_split_spreads_clients_evenly() -> None:
    assert split(64, 4) == [16] * 4 and split(10, 4) == [3, 3, 2, 2] and split(2, 8) == [1, 1] and split(1, 1) == [1]
    assert sum(split(17, 5)) == 17


def test_processes_count_every_request_once_as_one_process_does(server: ServerThread) -> None:
    one = asyncio.run(run_load(server.url, MIX, duration=60, concurrency=3, max_requests=12, body=BODY))
    many = run_load_procs(server.url, MIX, procs=2, concurrency=3, max_requests=12, duration=60, body=BODY,
                          server_pid=os.getpid())
    assert one.requests == many.requests == len(many.latencies_ms) == 12 and many.procs == 2
    # process 0 sends MIX[0::2] (good), process 1 MIX[1::2] (422); one process cycles through all four
    assert one.statuses == many.statuses == {200: 6, 422: 6} and many.errors == 6
    assert 0 < many.client_cpu_s and 0 < many.client_busy < 4
    assert many.server_cpu_s is not None and many.server_cpu_s > 0  # this process serves (a thread)
    s = many.summary()
    assert s["procs"] == 2 and s["client_cpu_per_s"] > 0 and "client_busy" in many.table()
    assert one.client_cpu_s > 0 and one.procs == 1 and one.server_cpu_s is None


def test_client_processes_serve_run_after_run_as_fresh_ones_do(server: ServerThread) -> None:
    """:class:`ClientProcs` keeps its processes from run to run (bench_serve's warm-up, run and modes): each run counts
    as a run on freshly spawned processes does, including one with fewer clients than processes (the idle one only
    takes its place at the start) and one after a run that failed in a process."""
    fresh = run_load_procs(server.url, MIX, procs=2, concurrency=3, max_requests=12, duration=60, body=BODY)
    with ClientProcs(2) as cp:
        pids = [p.pid for p in cp._ps]
        for _ in range(2):
            res = cp.run(server.url, MIX, concurrency=3, max_requests=12, duration=60, body=BODY)
            assert (res.requests, res.statuses, res.procs) == (fresh.requests, fresh.statuses, 2)
        one = drive(server.url, MIX[:1], concurrency=2, procs=2, max_requests=4, body=BODY, pool=cp)
        assert one.statuses == {200: 4} and one.procs == 2
        with pytest.raises(RuntimeError, match="load process"):  # a body the processes cannot encode (a set)
            cp.run(server.url, MIX, concurrency=2, max_requests=4, duration=60, body={"k": {1, 2}})
        res = cp.run(server.url, MIX, concurrency=3, max_requests=12, duration=60, body=BODY)
        assert res.statuses == fresh.statuses and [p.pid for p in cp._ps] == pids and all(p.is_alive() for p in cp._ps)
    assert not any(p.is_alive() for p in cp._ps)


def test_drive_runs_one_process_for_one_client(server: ServerThread) -> None:
    res = drive(server.url, MIX[:1], concurrency=1, procs=4, max_requests=3, body=BODY, server_pid=os.getpid())
    assert res.procs == 1 and res.statuses == {200: 3} and res.server_cpu_s is not None


def test_process_tree_cpu_counts_a_busy_child() -> None:
    busy = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\nsys.stdin.read()"
    before = proc_tree_cpu_s(os.getpid())
    if before is None:
        pytest.skip("no /proc here")
    own = time.process_time()
    child = subprocess.Popen([sys.executable, "-c", busy], stdin=subprocess.PIPE)
    try:
        t_end = time.time() + 30
        # wait on both figures: the tree's counts this process's own polling too, so under load it can reach
        # 0.5 s before the child's own does
        while ((proc_tree_cpu_s(os.getpid()) or 0) - before < 0.5 or (proc_tree_cpu_s(child.pid) or 0) < 0.5) \
                and time.time() < t_end:
            time.sleep(0.1)
        grew = (proc_tree_cpu_s(os.getpid()) or 0) - before
        assert grew >= 0.5 > time.process_time() - own  # the child's CPU, not this process's own
        assert proc_tree_cpu_s(child.pid) >= 0.5  # type: ignore[operator]
    finally:
        child.communicate(b"")
    assert proc_tree_cpu_s(child.pid) is None  # gone


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigError, match="loopback"):
        run_load_procs("http://10.0.0.1:80", MIX, procs=2, concurrency=2)
    with pytest.raises(ConfigError, match="positive"):
        run_load_procs("http://127.0.0.1:9", MIX, procs=0, concurrency=2)
    with pytest.raises(ConfigError, match="no histories"):
        run_load_procs("http://127.0.0.1:9", [], procs=2, concurrency=2)
