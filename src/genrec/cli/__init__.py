"""The ``genrec`` command: a thin layer over public library functions (see genrec.recipes.pipeline).

One module per command group: :mod:`~genrec.cli.data`, :mod:`~genrec.cli.sid` (features and SIDs),
:mod:`~genrec.cli.train` (train, quickstart), :mod:`~genrec.cli.serve` (serve, recommend),
:mod:`~genrec.cli.bench`, :mod:`~genrec.cli.evaluate` (eval, fusion, cold-start); the apps and shared
helpers in :mod:`~genrec.cli._app`. Imports sit inside the commands: ``genrec --help`` and a command start
without loading the others' modules."""

from __future__ import annotations

from genrec.cli._app import app

# registers every command; this order is the order `genrec --help` lists them in
from genrec.cli import data, sid, train, serve, bench, evaluate  # noqa: E402, F401, I001

__all__ = ["app"]
