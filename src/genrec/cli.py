"""The ``genrec`` command: a thin layer over public library functions."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
data_app = typer.Typer(no_args_is_help=True, help="Ingest raw logs into canonical tables.")
features_app = typer.Typer(no_args_is_help=True, help="Item vectors: content and engagement.")
sid_app = typer.Typer(no_args_is_help=True, help="Semantic IDs: codes, prefix trie, SID->item index.")
app.add_typer(data_app, name="data")
app.add_typer(features_app, name="features")
app.add_typer(sid_app, name="sid")


@app.command()
def version() -> None:
    """Print the genrec version."""
    from genrec import __version__

    typer.echo(__version__)


if __name__ == "__main__":
    app()
