"""docs/USAGE.md's "Your own logs" example runs as written (so the doc cannot rot): the CSV between the
`own-logs-example` markers is saved as events.csv and every command after it runs, in order, in a fresh folder;
`genrec recommend --user u196` answers with the CSV's own item ids."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from genrec.cli import app

USAGE = Path(__file__).resolve().parents[2] / "docs" / "USAGE.md"


def own_logs_example() -> tuple[str, list[list[str]]]:
    """(the CSV text, the commands as argument lists without `genrec`) between the markers of docs/USAGE.md."""
    text = USAGE.read_text(encoding="utf-8")
    m = re.search(r"<!-- own-logs-example:start -->(.*?)<!-- own-logs-example:end -->", text, re.S)
    assert m, "docs/USAGE.md lost its <!-- own-logs-example:start/end --> markers"
    blocks = dict((lang, body) for lang, body in re.findall(r"```(\w+)\n(.*?)```", m.group(1), re.S))
    assert set(blocks) == {"csv", "bash"}, f"the example holds one csv and one bash block, found {list(blocks)}"
    cmds = []
    for line in blocks["bash"].splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            assert argv[0] == "genrec", f"the example's commands are genrec commands (the test runs them): {line!r}"
            cmds.append(argv[1:])
    return blocks["csv"], cmds


def test_the_own_logs_example_runs_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    csv_text, cmds = own_logs_example()
    lines = csv_text.strip().splitlines()
    assert len(lines) == 10 and lines[0] == "user_id,item_id,timestamp,action"  # the promised ten-line CSV
    items = {ln.split(",")[1] for ln in lines[1:]}
    assert all(not i.isdigit() for i in items)  # string ids: the point of the example
    assert [c[:2] for c in cmds] == [["data", "prepare"], ["features", "build"], ["sid", "build"],
                                     ["train", "runs/mine"], ["recommend", "runs/mine"]]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "events.csv").write_text(csv_text)
    for argv in cmds:
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 0, (argv, r.output)
    shown = re.findall(r"\b(m\d+) \(#\d+\)", r.stdout)  # recommend's table: 'm51 (#3)', the log's id first
    assert shown and set(shown) <= items, r.stdout
