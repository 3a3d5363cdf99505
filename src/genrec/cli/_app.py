"""The ``genrec`` command's typer apps, shared arguments and helpers (see :mod:`genrec.cli`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

import typer


app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="genrec: one transformer for SID beams, ANN retrieval and ranking.")
data_app = typer.Typer(no_args_is_help=True, help="Ingest raw logs into canonical tables.")
features_app = typer.Typer(no_args_is_help=True, help="Item vectors: content and engagement.")
sid_app = typer.Typer(no_args_is_help=True, help="Semantic IDs: codes, prefix trie, SID->item index.")
app.add_typer(data_app, name="data")
app.add_typer(features_app, name="features")
fusion_app = typer.Typer(no_args_is_help=True, help="L1 score fusion: choose the weights on validation, show them.")
app.add_typer(sid_app, name="sid")
app.add_typer(fusion_app, name="fusion")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: serving load (serve), kernel and decode speed (kernels), "
                                                  "the training step by layout (train).")
app.add_typer(bench_app, name="bench")

WORKDIR = typer.Argument(..., help="Run directory (created if missing).")
RUNDIR = typer.Argument(..., help="Run directory made by `genrec data prepare` (and, before training, `features "
                                   "build` and `sid build`).")
CHECKPOINT = typer.Option(
    None, "--checkpoint", show_default=False,
    help="Which checkpoint: best, last (or latest), a step number (120), a folder name under WORKDIR/checkpoints "
         "(step-000120), or a path to a checkpoint folder (or to a checkpoints folder: its last). Names are looked "
         "up before paths. Default: best if training marked one, else last.")
"""Every command's ``--checkpoint``: one rule (:data:`genrec.infer.load.CHECKPOINT_RULE`), resolved by
:func:`genrec.infer.load.find_checkpoint`."""


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print genrec's own errors as one clear line (exit 2) instead of a traceback."""

    @wraps(fn)
    def inner(*a: Any, **k: Any) -> Any:
        from genrec.errors import GenrecError

        try:
            return fn(*a, **k)
        except (GenrecError, FileNotFoundError, KeyError) as e:
            typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from None

    return inner


def working(msg: str) -> Any:
    """A spinner on stderr while a step runs (rich shows it only on a terminal)."""
    from rich.console import Console

    return Console(stderr=True).status(msg)


def echo_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


def check_micro_batch(policy: str | None, wait_ms: float, size: int | None = None) -> None:
    """--micro-batch-policy / --micro-batch-wait-ms / --micro-batch as given (None: the server's default)."""
    if size is not None and size < 1:
        raise typer.BadParameter(f"--micro-batch must be >= 1 (1 = off), got {size}")
    if policy is not None and policy not in ("busy", "timed"):
        raise typer.BadParameter(f"--micro-batch-policy must be busy or timed, got {policy!r}")
    if wait_ms < 0:
        raise typer.BadParameter(f"--micro-batch-wait-ms must be >= 0, got {wait_ms}")


def floats(text: str, what: str) -> tuple[float, ...]:
    from genrec.errors import ConfigError

    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{what}: expected comma-separated numbers, got {text!r}") from None


@app.command()
def version() -> None:
    """Print the genrec version."""
    from genrec._version import __version__

    typer.echo(__version__)
