"""``genrec serve`` refuses bad --precision / --cuda-graphs values before loading anything."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from genrec.cli import app


def test_bad_serving_options_are_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["serve", str(tmp_path), "--cuda-graphs", "maybe"])
    assert r.exit_code == 2 and "--cuda-graphs must be off, sid or all" in r.output
    r = CliRunner().invoke(app, ["serve", str(tmp_path), "--precision", "fp8"])
    assert r.exit_code == 2 and "--precision must be float32 or bf16" in r.output
