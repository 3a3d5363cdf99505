"""``genrec serve`` refuses bad --precision / --cuda-graphs / --batch-buckets values before loading anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from genrec.cli import app


def test_bad_serving_options_are_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["serve", str(tmp_path), "--cuda-graphs", "maybe"])
    assert r.exit_code == 2 and "--cuda-graphs must be off, sid or all" in r.output
    r = CliRunner().invoke(app, ["serve", str(tmp_path), "--precision", "fp8"])
    assert r.exit_code == 2 and "--precision must be float32 or bf16" in r.output
    r = CliRunner().invoke(app, ["serve", str(tmp_path), "--two-process", "--kv-pool-device", "gpu"])
    assert r.exit_code == 2 and "--kv-pool-device must be auto, cpu or cuda" in r.output
    r = CliRunner().invoke(app, ["serve", str(tmp_path), "--batch-buckets", "8,4"])
    assert r.exit_code == 2 and "batch buckets: distinct positive integers in increasing order" in r.output
    r = CliRunner().invoke(app, ["serve", str(tmp_path), "--micro-batch-linger-ms", "-1"])
    assert r.exit_code == 2 and "--micro-batch-linger-ms must be >= 0" in r.output, r.output
    r = CliRunner().invoke(app, ["serve", str(tmp_path), "--two-process", "--pool-slots", "-1"])
    assert r.exit_code == 2 and "--pool-slots must be >= 0" in r.output, r.output
    for bad, say in ((["--warm-beams", "20,x"], "--warm-beams must be comma-separated beam widths"),
                     (["--warm-beams", "0"], "--warm-beams: each width must be in 1..256"),
                     (["--warm-beams", "20,300"], "--warm-beams: each width must be in 1..256")):
        r = CliRunner().invoke(app, ["serve", str(tmp_path), *bad])
        assert r.exit_code == 2 and say in r.output, r.output
    for bad in (["--fronts", "-1"], ["--fronts", "2", "--workers", "2"]):
        r = CliRunner().invoke(app, ["serve", str(tmp_path), *bad])
        assert r.exit_code == 2 and "--fronts must be >= 0 and goes with --workers 1" in r.output, r.output


def test_kv_pool_device_follows_the_server_device(tmp_path: Path) -> None:
    """auto: shared memory on a CPU server; "cuda" on a CPU server is refused with a message."""
    from genrec.errors import ConfigError
    from genrec.serve.config import ServeConfig
    from genrec.serve.service import Service

    assert Service(ServeConfig(workdir=tmp_path, two_process=True)).pool_on_gpu is False
    assert Service(ServeConfig(workdir=tmp_path, two_process=True, device="cuda:0")).pool_on_gpu is True
    assert Service(ServeConfig(workdir=tmp_path, two_process=True, device="cuda:0",
                               kv_pool_device="cpu")).pool_on_gpu is False
    with pytest.raises(ConfigError, match="needs the server on a GPU"):
        Service(ServeConfig(workdir=tmp_path, two_process=True, kv_pool_device="cuda"))
    with pytest.raises(ConfigError, match="'auto', 'cpu' or 'cuda'"):
        Service(ServeConfig(workdir=tmp_path, two_process=True, kv_pool_device="shm"))


def test_the_kv_pool_holds_a_whole_micro_batch_by_default(tmp_path: Path) -> None:
    """--pool-slots 0 (the default): max(16, --micro-batch) slots, so a micro-batch is ranked in one call; a number
    given is kept."""
    from genrec.serve.config import ServeConfig

    assert ServeConfig(workdir=tmp_path).kv_slots == 32  # the default micro-batch
    assert ServeConfig(workdir=tmp_path, micro_batch=64).kv_slots == 64
    assert ServeConfig(workdir=tmp_path, micro_batch=1).kv_slots == 16
    assert ServeConfig(workdir=tmp_path, micro_batch=64, pool_slots=8).kv_slots == 8


def test_front_processes_by_default_only_on_a_gpu_server_that_micro_batches() -> None:
    """Without --fronts: min(4, cores // 4) fronts (at least 1) on a CUDA server whose engine micro-batches under the
    busy policy (ranking in its own process or not); none on a CPU, beside --workers, without micro-batching or under
    the timed policy."""
    from genrec.serve.config import default_fronts

    assert default_fronts("cuda", cpus=16) == 4 and default_fronts("cuda:1", cpus=64) == 4
    assert default_fronts("cuda", cpus=8) == 2 and default_fronts("cuda", cpus=2) == 1
    assert default_fronts("cpu", cpus=64) == 0
    assert default_fronts("cuda", cpus=16, workers=2) == 0
    assert default_fronts("cuda", cpus=16, micro_batch=1) == 0
    assert default_fronts("cuda", cpus=16, micro_batch_policy="timed") == 0


def test_a_gpu_server_with_fronts_lingers_3_ms_by_default() -> None:
    """Without --micro-batch-linger-ms: 3 ms on a CUDA server with front processes under the busy policy (what was
    measured: fronts4l3), 0 elsewhere."""
    from genrec.serve.config import default_linger_ms

    assert default_linger_ms("cuda", 4) == 3.0 and default_linger_ms("cuda:1", 1) == 3.0
    assert default_linger_ms("cuda", 0) == 0.0 and default_linger_ms("cpu", 4) == 0.0
    assert default_linger_ms("cuda", 4, "timed") == 0.0


def test_the_server_warms_each_beam_width_it_is_told(tmp_path: Path, run_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``warm_beams``: Engine.load warms every bucket at each width once (20 by default, the requests' default);
    a width outside a request's bounds is refused by the service."""
    from genrec.errors import ConfigError
    from genrec.infer.recommender import Recommender
    from genrec.serve.config import ServeConfig
    from genrec.serve.engine import Engine
    from genrec.serve.service import Service

    seen: list[tuple[int, tuple[int, ...]]] = []
    real = Recommender.warmup

    def record(self: Recommender, **kw: object) -> list[int]:
        seen.append((int(kw["beam_width"]), tuple(kw["batch_sizes"])))  # type: ignore[arg-type, call-overload]
        return real(self, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Recommender, "warmup", record)
    Engine.load(run_dir, max_batch=4)
    Engine.load(run_dir, max_batch=4, warm_beams=(60, 20, 60))
    assert [w for w, _ in seen] == [20, 60, 20] and len({b for _, b in seen}) == 1
    assert ServeConfig(workdir=tmp_path).warm_beams == (20,)
    for bad in ((), (0,), (20, 257)):
        with pytest.raises(ConfigError, match="warm_beams must be SID beam widths in 1..256"):
            Service(ServeConfig(workdir=tmp_path, warm_beams=bad))


@pytest.mark.gpu
def test_warmed_beam_widths_capture_nothing_under_load(run_dir: Path) -> None:
    """On a GPU: after Engine.load warmed widths 20 and 60, requests at either width, at each warmed batch size,
    replay the encoder's and the beams' graphs only; a width not warmed captures its beams on first use. (The
    ranking step's graphs follow the candidates' count, which the histories decide, not the width.)"""
    from genrec.serve.engine import Engine

    rec = Engine.load(run_dir, device="cuda", max_batch=4, warm_beams=(20, 60)).rec
    before = {s: rec.graph_captures[s] for s in ("encode", "sid")}
    hist = [{"item_id": int(i)} for i in rec.catalog.item_ids[:40]]
    for width in (20, 60):
        for b in rec.buckets.up_to(4) if rec.buckets is not None else (1,):
            rec.recommend([hist] * b, k=10, beam_width=width)  # k: the warm-up's (the prefix beams keep k * 3)
    assert {s: rec.graph_captures[s] for s in before} == before, (before, rec.graph_captures)
    rec.recommend([hist], k=10, beam_width=33)
    assert rec.graph_captures["sid"] > before["sid"]
