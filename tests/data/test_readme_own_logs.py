"""The README's "Your own logs" example runs as written (so the doc cannot rot): the two CSVs between the
`own-logs-example` markers are saved as events.csv and impressions.csv and every command after them runs, in
order, in a fresh folder; the impressions' label-0 items reach the feedviews; `genrec recommend --user u196`
answers with the CSVs' own item ids."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from genrec.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"


def own_logs_example() -> tuple[str, str, list[list[str]]]:
    """(the events CSV, the impressions CSV, the commands as argument lists without `genrec`) between the markers
    of README.md."""
    text = README.read_text(encoding="utf-8")
    m = re.search(r"<!-- own-logs-example:start -->(.*?)<!-- own-logs-example:end -->", text, re.S)
    assert m, "README.md lost its <!-- own-logs-example:start/end --> markers"
    blocks = re.findall(r"```(\w+)\n(.*?)```", m.group(1), re.S)
    assert [lang for lang, _ in blocks] == ["csv", "csv", "bash"], \
        f"the example holds two csv blocks (events, impressions) and one bash block, found {blocks}"
    cmds = []
    for line in blocks[2][1].splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            assert argv[0] == "genrec", f"the example's commands are genrec commands (the test runs them): {line!r}"
            cmds.append(argv[1:])
    return blocks[0][1], blocks[1][1], cmds


def test_the_own_logs_example_runs_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    csv_text, imp_text, cmds = own_logs_example()
    lines = csv_text.strip().splitlines()
    assert len(lines) == 10 and lines[0] == "user_id,item_id,timestamp,action"  # the promised ten-line CSV
    items = {ln.split(",")[1] for ln in lines[1:]}
    assert all(not i.isdigit() for i in items)  # string ids: the point of the example
    shown_rows = imp_text.strip().splitlines()
    assert shown_rows[0] == "request_id,user_id,item_id,timestamp,position,action"
    assert any(ln.endswith(",") for ln in shown_rows[1:])  # an impression-only row: the point of the file
    items |= {ln.split(",")[2] for ln in shown_rows[1:]}
    assert [c[:2] for c in cmds] == [["data", "prepare"], ["features", "build"], ["sid", "build"],
                                     ["train", "runs/mine"], ["recommend", "runs/mine"]]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "events.csv").write_text(csv_text)
    (tmp_path / "impressions.csv").write_text(imp_text)
    for argv in cmds:
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 0, (argv, r.output)
        if argv[:2] == ["data", "prepare"]:
            assert "--impressions" in argv and "From the impressions file" in r.stdout
            from genrec.data.store import TableStore

            labels = [lab for row in TableStore(tmp_path / "runs/mine/tables").read_feedviews().to_pylist()
                      for lab in row["labels"]]
            assert len(labels) == len(shown_rows) - 1 and 0 in labels
    shown = re.findall(r"\b(m\d+) \(#\d+\)", r.stdout)  # recommend's table: 'm51 (#3)', the log's id first
    assert shown and set(shown) <= items, r.stdout
