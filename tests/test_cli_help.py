"""Every option and argument of every `genrec` command says what it is for (issue 38 item 4), and
`genrec train` says how to list its override keys."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

from genrec.cli import app


def _commands(cmd: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf command under ``cmd`` (typer vendors its own click: groups are told by ``commands``)."""
    subs = getattr(cmd, "commands", None)
    if subs is None:
        yield path, cmd
        return
    for name, sub in subs.items():
        yield from _commands(sub, (*path, name))


def test_every_option_and_argument_has_help() -> None:
    leaves = list(_commands(typer.main.get_command(app), ("genrec",)))
    assert len(leaves) >= 20 and all(c.params is not None for _, c in leaves)  # the walk reached the leaves
    missing = [f"{' '.join(path)} {p.opts[0] if p.opts else p.name}" for path, c in leaves for p in c.params
               if not (getattr(p, "help", None) or "").strip()]
    assert not missing, f"options / arguments without help: {missing}"
    assert sum(len(c.params) for _, c in leaves) > 100


def test_train_help_says_how_to_list_the_override_keys() -> None:
    r = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "--show-config" in r.output and "TrainConfig" in r.output, r.output


def test_show_config_lists_every_key_as_an_override_that_round_trips(tmp_path: Any) -> None:
    from genrec.train.run import RunConfig

    r = CliRunner().invoke(app, ["train", str(tmp_path / "unused"), "--preset", "cpu-tiny", "--show-config",
                                 "train.lr=0.01"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    keys = [x.split("=", 1)[0] for x in lines]
    assert {"variant", "model.d_model", "data.split", "objective.w_sid", "train.lr", "train.progress",
            "train.early_stopping.metric"} <= set(keys)
    assert "train.lr=0.01" in lines
    # each line is an override: applied to the preset they give back the configuration shown (but the
    # "the model preset's" placeholders, model sizes 0 and dropout -1, which cannot be typed)
    typed = [x for x in lines if x not in ("model.item_dim=0", "model.dropout=-1.0")]
    assert len(typed) == len(lines) - 2
    assert RunConfig.from_name("cpu-tiny", typed) == RunConfig.from_name("cpu-tiny", ["train.lr=0.01"])
    assert not (tmp_path / "unused").exists()  # nothing trained, nothing written


def test_one_name_per_concept_and_no_double_negative_flags() -> None:
    """The CLI says a concept the way the HTTP API does (beam_width -> --beam-width, diversity_lambda ->
    --diversity-lambda); a boolean is an --x/--no-x pair, never a flag whose negation reads --no-no-x."""
    leaves = list(_commands(typer.main.get_command(app), ("genrec",)))
    opts = {(" ".join(path), o) for path, c in leaves for p in c.params for o in [*p.opts, *p.secondary_opts]}
    names = {o for _, o in opts}
    assert not [x for x in opts if x[1].startswith("--no-no-")], sorted(x for x in opts if x[1].startswith("--no-no-"))
    assert not names & {"--beam", "--lambda", "--no-ranking-metrics"}, names & {"--beam", "--lambda"}
    for cmd in ("genrec eval", "genrec recommend", "genrec fusion tune"):
        assert (cmd, "--beam-width") in opts, cmd
    for cmd in ("genrec eval", "genrec recommend"):
        assert (cmd, "--diversity-lambda") in opts, cmd
    assert ("genrec recommend", "--no-rank") in opts and ("genrec eval", "--no-ranking") in opts
