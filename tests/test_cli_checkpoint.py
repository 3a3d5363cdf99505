"""Issue 38: `--checkpoint` means the same in every command -- a name (best, last, a step number, a folder name
under WORKDIR/checkpoints) or a path -- resolved by one function (genrec.infer.load.find_checkpoint), with one help
text, and a value that is neither is one line listing the names the run's checkpoints answer to."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from genrec.cli import app
from genrec.errors import ConfigError
from genrec.infer.load import find_checkpoint

COMMANDS = (["recommend"], ["eval"], ["fusion", "tune"], ["fusion", "show"], ["serve"])


def _leaf(path: list[str]) -> Any:
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


def test_every_checkpoint_option_has_one_help_text() -> None:
    helps = {}
    for path in COMMANDS:
        opt = next(p for p in _leaf(path).params if "--checkpoint" in p.opts)
        helps[" ".join(path)] = opt.help
    assert len(set(helps.values())) == 1, helps
    text = next(iter(helps.values()))
    for word in ("best", "last", "step number", "step-000120", "path"):
        assert word in text, text


def test_find_checkpoint_takes_names_and_paths(string_id_run: Path) -> None:
    ck = string_id_run / "checkpoints"
    two, four = ck / "step-000002", ck / "step-000004"
    for value, want in ((None, four), ("last", four), ("LATEST", four), ("Last", four), ("2", two), ("4", four),
                        ("step-000002", two), (str(two), two), (two, two), (str(ck), four)):
        assert find_checkpoint(string_id_run, value) == want, value
    for bad in ("best", "3", "step-3", "nope", str(string_id_run / "nope"), ""):
        with pytest.raises(ConfigError) as e:
            find_checkpoint(string_id_run, bad)
        msg = str(e.value)
        assert f"--checkpoint {bad!r}" in msg and "last -> step-000004" in msg, msg
        assert "step-000002 (or 2)" in msg and "step-000004 (or 4)" in msg, msg


def test_the_commands_take_a_step_number_and_a_name(string_id_run: Path) -> None:
    run = CliRunner().invoke
    wd = str(string_id_run)
    for value, step in (("2", 2), ("step-000002", 2), ("last", 4), (str(string_id_run / "checkpoints" / "step-000002"),
                                                                     2)):
        r = run(app, ["recommend", wd, "--history", "m3,m10", "--k", "2", "--json", "--checkpoint", value])
        assert r.exit_code == 0, (value, r.output)
        assert json.loads(r.stdout)["step"] == step, value
        r = run(app, ["fusion", "show", wd, "--checkpoint", value])
        assert r.exit_code == 0 and json.loads(r.stdout)["step"] == step, (value, r.output)
    r = run(app, ["eval", wd, "--split", "valid", "--max-users", "4", "--no-ranking", "--checkpoint", "2"])
    assert r.exit_code == 0, r.output
    report = next(Path(line.split(": ", 1)[1]) for line in r.stdout.splitlines() if line.startswith("json: "))
    assert json.loads(report.read_text())["checkpoint"].endswith("step-000002")


def test_a_value_that_is_neither_is_one_line_naming_the_choices(string_id_run: Path) -> None:
    hup = signal.getsignal(signal.SIGHUP)
    try:
        for cmd in (["recommend", str(string_id_run), "--history", "m3"], ["fusion", "show", str(string_id_run)],
                    ["serve", str(string_id_run)], ["eval", str(string_id_run), "--split", "valid"]):
            r = CliRunner().invoke(app, [*cmd, "--checkpoint", "7"])
            assert r.exit_code == 2, (cmd, r.output)
            out = " ".join(r.output.split())
            assert "--checkpoint '7': neither a name" in out and "last -> step-000004" in out, out
            assert "Traceback" not in r.output
    finally:
        signal.signal(signal.SIGHUP, hup)
