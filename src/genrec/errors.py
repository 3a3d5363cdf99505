"""Errors that name what is at fault: the file, the line (1-based) and the field."""

from __future__ import annotations

from pathlib import Path


class GenrecError(Exception):
    """Base class for every error genrec raises on purpose."""


class DataError(GenrecError, ValueError):
    """Bad input data. The message names the file, line and field where known.

    >>> str(DataError("not an integer: 'x'", path="u.data", line=3, field="item_id"))
    "u.data:3: field 'item_id': not an integer: 'x'"
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        self.reason = message
        where = ""
        if self.path is not None:
            where = self.path
            if line is not None:
                where += f":{line}"
            where += ": "
        elif line is not None:
            where = f"line {line}: "
        fld = f"field {field!r}: " if field is not None else ""
        super().__init__(f"{where}{fld}{message}")


class MissingDataError(GenrecError, FileNotFoundError):
    """A dataset's files are not where genrec looked; the message says where to put them."""


class ConfigError(GenrecError, ValueError):
    """A configuration value is invalid; the message names the key."""


class MissingExtraError(GenrecError, ImportError):
    """A part of genrec whose optional dependencies (a pip extra) are not installed; the message names the
    ``pip install`` that adds them."""
