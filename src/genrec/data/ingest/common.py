"""Validated parsing helpers shared by every ingestor.

Non-standard part: a two-speed reader. The happy path parses an events file with
``pyarrow.csv`` (vectorised, multi-threaded; ~20M rows in seconds) and checks every column
with numpy predicates. Only when Arrow refuses the file or a predicate fails do we rescan
the file line by line in Python, with the *same* column specs, to find the first bad
record and raise a :class:`~genrec.errors.DataError` naming ``file:line`` and the field.
So messages are exact without paying Python speed on good data.

Line numbers are 1-based physical lines (a header is line 1). Blank lines are skipped by
both readers, so record ``r`` (0-based) is the ``r``-th non-blank data line.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from genrec.errors import ConfigError, DataError

Kind = Literal["int", "float", "str", "text"]
"""``str``: a dictionary-encoded string column (names: actions, surfaces); ``text``: plain strings, for
columns of mostly distinct values that a later step parses (timestamps, ids)."""

# A delimiter of more than one character (MovieLens ``::``) is rewritten to this byte for
# Arrow, which only splits on single characters; the file must not contain it already.
_UNIT_SEP = "\x1f"


@dataclass(frozen=True)
class RatingRule:
    """Explicit rating -> action: ``>= like_min`` is "like", ``<= dislike_max`` "dislike", else "view"."""

    like_min: float = 4.0
    dislike_max: float = 2.0

    ACTIONS: ClassVar[tuple[str, ...]] = ("view", "like", "dislike")
    """The action vocabulary this rule produces; index = value returned by :meth:`apply`."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.like_min) and math.isfinite(self.dislike_max)):
            raise ConfigError(f"--like-min and --dislike-max must be finite numbers, got {self.like_min} and "
                              f"{self.dislike_max}")
        if self.dislike_max >= self.like_min:
            raise ConfigError(
                f"--dislike-max ({self.dislike_max:g}) must be below --like-min ({self.like_min:g})"
            )

    def apply(self, rating: np.ndarray) -> np.ndarray:
        """Action index per rating (0=view, 1=like, 2=dislike). ``rating``: [N] float -> [N] int8."""
        out = np.zeros(rating.shape, dtype=np.int8)
        out[rating >= self.like_min] = 1
        out[rating <= self.dislike_max] = 2
        return out

    def describe(self) -> str:
        return (
            f"rating >= {self.like_min:g} -> 'like'; rating <= {self.dislike_max:g} -> 'dislike'; "
            f"otherwise -> 'view' (a rated movie was watched). 'view' and 'like' are positive "
            f"engagement, 'dislike' is a negative."
        )


@dataclass(frozen=True)
class Column:
    """One expected field: its name as the source spells it, how to parse it, what is valid."""

    name: str
    kind: Kind
    check: Callable[[np.ndarray], np.ndarray] | None = None
    """Vectorised validity predicate: array -> bool mask (True = valid)."""
    check_msg: str = ""
    """What a valid value looks like, for the error message."""


def nonneg(a: np.ndarray) -> np.ndarray:
    return a >= 0


def finite(a: np.ndarray) -> np.ndarray:
    return np.isfinite(a)


def int_col(name: str) -> Column:
    """A non-negative integer id / timestamp column."""
    return Column(name, "int", nonneg, "a non-negative integer")


def file_record(path: Path, *, checksum: bool = True) -> dict[str, Any]:
    """Path, byte size and sha256 of a file read, for ``Dataset.source``."""
    rec: dict[str, Any] = {"path": str(path), "bytes": path.stat().st_size}
    if checksum:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        rec["sha256"] = h.hexdigest()
    return rec


def decode_text(path: Path, encodings: Sequence[str] = ("utf-8", "latin-1")) -> tuple[str, str]:
    """Read a text file trying ``encodings`` in order; returns (text, encoding used).

    A UTF-8 BOM is dropped; CRLF is normalised to LF by the callers' line splitting.
    """
    data = path.read_bytes()
    last: UnicodeDecodeError | None = None
    for enc in encodings:
        try:
            text = data.decode(enc)
        except UnicodeDecodeError as e:
            last = e
            continue
        return text.removeprefix("\ufeff"), enc
    assert last is not None
    line = data[: last.start].count(b"\n") + 1
    raise DataError(f"cannot decode as any of {list(encodings)}: {last.reason}", path=path, line=line)


def iter_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without CR/LF) for every non-blank line."""
    for i, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if line.strip():
            yield i, line


# ---------------------------------------------------------------------------------------------
# The fast reader and its slow twin
# ---------------------------------------------------------------------------------------------


@dataclass
class Parsed:
    """Columns read from a delimited file, as numpy arrays (strings: a pyarrow array)."""

    path: Path
    columns: dict[str, Any]
    n: int
    header: bool
    delimiter: str

    def __getitem__(self, name: str) -> Any:
        return self.columns[name]


def _arrow_type(kind: Kind) -> pa.DataType:
    return {"int": pa.int64(), "float": pa.float64(), "str": pa.dictionary(pa.int32(), pa.string()),
            "text": pa.string()}[kind]


def _records_py(path: Path, text: str, delimiter: str, quoted: bool) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) per non-blank record; CSV quoting honoured when ``quoted``."""
    if quoted:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
        try:
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                yield reader.line_num, row
        except csv.Error as e:
            raise DataError(f"malformed CSV: {e}", path=path, line=reader.line_num) from None
    else:
        for i, line in iter_lines(text):
            yield i, line.split(delimiter)


def _convert_py(value: str, col: Column) -> Any:
    v = value.strip()
    if col.kind == "int":
        if not v or not (v.isdigit() or (v[0] in "+-" and v[1:].isdigit())):
            raise ValueError(f"not an integer: {value!r}")
        if not -(2 ** 63) <= (n := int(v)) < 2 ** 63:
            raise ValueError(f"integer out of the int64 range: {value!r}")
        return n
    if col.kind == "float":
        try:
            return float(v)
        except ValueError:
            raise ValueError(f"not a number: {value!r}") from None
    return value


def locate_error(
    path: Path,
    text: str,
    columns: Sequence[Column],
    *,
    delimiter: str,
    header: bool,
    quoted: bool,
    positions: Sequence[int] | None = None,
    n_fields: int | None = None,
) -> DataError | None:
    """Slow, obviously-correct scan: the first record that breaks ``columns``, as a DataError."""
    shown = "tab" if delimiter == "\t" else repr(delimiter)
    records = _records_py(path, text, delimiter, quoted)
    if positions is None:
        positions = list(range(len(columns)))
    if n_fields is None:
        n_fields = len(columns)
    if header:
        next(records, None)
    for line, fields in records:
        if len(fields) != n_fields:
            if len(fields) < n_fields:
                missing = [c.name for c, p in zip(columns, positions) if p >= len(fields)]
                fld = missing[0] if missing else None
                hint = ""
                if len(fields) == 1 and delimiter not in fields[0]:
                    others = [d for d in (",", "\t", ";", "|", "::", " ") if d != delimiter and d in fields[0]]
                    if others:
                        hint = f" (wrong delimiter? the line contains {others[0]!r}, expected {shown})"
                else:
                    hint = " (truncated record?)"
                return DataError(
                    f"expected {n_fields} {shown}-separated fields, found {len(fields)}{hint}",
                    path=path, line=line, field=fld,
                )
            return DataError(
                f"expected {n_fields} {shown}-separated fields, found {len(fields)}", path=path, line=line
            )
        for col, pos in zip(columns, positions):
            try:
                v = _convert_py(fields[pos], col)
            except ValueError as e:
                return DataError(str(e), path=path, line=line, field=col.name)
            if col.check is not None:
                dtype = {"int": np.int64, "float": np.float64, "str": object, "text": object}[col.kind]
                if not bool(col.check(np.asarray([v], dtype=dtype))[0]):
                    return DataError(f"invalid value {fields[pos]!r}: expected {col.check_msg}",
                                     path=path, line=line, field=col.name)
    return None


def line_of_record(path: Path, text: str, record: int, *, delimiter: str, header: bool, quoted: bool) -> int:
    """1-based physical line of the ``record``-th (0-based) data record."""
    records = _records_py(path, text, delimiter, quoted)
    if header:
        next(records, None)
    for r, (line, _fields) in enumerate(records):
        if r == record:
            return line
    raise IndexError(record)


def _first_bad_utf8(path: Path, delimiter: str) -> tuple[int, int, int] | None:
    """(1-based line, 0-based field index, the byte) of the first byte that is not UTF-8; None if all is."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
        return None
    except UnicodeDecodeError as e:
        start = raw.rfind(b"\n", 0, e.start) + 1
        field = raw[start:e.start].count(delimiter.encode())
        return raw.count(b"\n", 0, e.start) + 1, field, raw[e.start]


def read_delimited(
    path: Path,
    columns: Sequence[Column],
    *,
    delimiter: str,
    header: bool,
    quoted: bool = False,
    encodings: Sequence[str] = ("utf-8", "latin-1"),
) -> Parsed:
    """Read ``columns`` from a delimited file: Arrow first, the Python rescan on any failure.

    ``header=False``: the file has exactly ``len(columns)`` fields per line, in order.
    ``header=True``: line 1 names the columns; each ``Column.name`` must appear in it
    (other columns are ignored). ``delimiter`` may be multi-character (``"::"``).
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(1 << 16)
    if size == 0 or (size <= len(prefix) and prefix.isspace()):
        raise DataError("file is empty: expected at least one record", path=path, line=1,
                        field=columns[0].name)
    n_fields = len(columns)
    positions = list(range(len(columns)))
    names_for_arrow = [c.name for c in columns]
    skip = 0
    if header:
        first = prefix.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", errors="replace").removeprefix("\ufeff")
        if quoted:
            head = next(csv.reader([first], delimiter=delimiter))
        else:
            head = first.split(delimiter)
        head = [h.strip() for h in head]
        for c in columns:
            if c.name not in head:
                other = next((d for d in ("\t", ",", ";", "|") if d != delimiter and d in first), None)
                hint = "" if other is None else f" (is the delimiter {other!r}? this file is read with {delimiter!r})"
                raise DataError(f"header lacks column {c.name!r}; header has {head}{hint}", path=path, line=1,
                                field=c.name)
        if (dup := next((c.name for c in columns if head.count(c.name) > 1), None)) is not None:  # which one?
            raise DataError(f"column {dup!r} appears {head.count(dup)} times in the header", path=path, line=1,
                            field=dup)
        n_fields = len(head)
        positions = [head.index(c.name) for c in columns]
        names_for_arrow = [f"_c{i}" for i in range(n_fields)]
        for c, p in zip(columns, positions):
            names_for_arrow[p] = c.name
        skip = 1

    arrow_delim = delimiter
    data: Any = path  # single-character delimiter: Arrow reads (memory-maps) the file itself
    if len(delimiter) > 1:
        raw = path.read_bytes()
        if _UNIT_SEP.encode() in raw:
            data = None  # cannot use the fast path: go straight to the rescan
        else:
            data = pa.BufferReader(raw.replace(delimiter.encode(), _UNIT_SEP.encode()))
            arrow_delim = _UNIT_SEP
        del raw

    def slow_fail(reason: str) -> DataError:
        if "utf8" in reason.lower().replace("-", "") and (bad := _first_bad_utf8(path, delimiter)) is not None:
            line, index, byte = bad  # the fallback decoding below would read the byte as Latin-1 and find no fault
            fld = next((c.name for c, p in zip(columns, positions) if p == index), None)
            return DataError(f"not valid UTF-8 text (byte 0x{byte:02x}); save the file as UTF-8", path=path,
                             line=line, field=fld)
        text, _ = decode_text(path, encodings)
        err = locate_error(path, text, columns, delimiter=delimiter, header=header, quoted=quoted,
                           positions=positions, n_fields=n_fields)
        return err if err is not None else DataError(reason, path=path)

    table: pa.Table | None = None
    if data is not None:
        types = {c.name: _arrow_type(c.kind) for c in columns}
        try:
            table = pacsv.read_csv(
                pa.memory_map(str(data)) if isinstance(data, Path) else data,
                read_options=pacsv.ReadOptions(column_names=names_for_arrow, skip_rows=skip,
                                               encoding="utf8" if "utf-8" == encodings[0] else encodings[0]),
                parse_options=pacsv.ParseOptions(delimiter=arrow_delim, quote_char='"' if quoted else False,
                                                  newlines_in_values=False, ignore_empty_lines=True),
                convert_options=pacsv.ConvertOptions(column_types=types, include_columns=[c.name for c in columns],
                                                     null_values=[], strings_can_be_null=False,
                                                     quoted_strings_can_be_null=False),
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError) as e:
            raise slow_fail(f"could not parse: {e}") from None
    if table is None:
        raise slow_fail("could not parse")
    if table.num_rows == 0:
        if header:
            raise DataError("file has a header but no records", path=path, line=2, field=columns[0].name)
        raise DataError("file is empty: expected at least one record", path=path, line=1, field=columns[0].name)

    out: dict[str, Any] = {}
    for c in columns:
        col = table.column(c.name)
        if col.null_count:
            raise slow_fail(f"empty values in column {c.name!r}")
        if c.kind == "text":
            arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            if c.check is not None and not c.check(arr.to_numpy(zero_copy_only=False)).all():
                raise slow_fail(f"invalid value in column {c.name!r}")
            out[c.name] = arr
        elif c.kind == "str":
            arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            if c.check is not None:
                dic = arr.dictionary.to_numpy(zero_copy_only=False)
                if not c.check(dic).all():
                    raise slow_fail(f"invalid value in column {c.name!r}")
            out[c.name] = arr
        else:
            a = col.to_numpy()
            if c.check is not None and not c.check(a).all():
                raise slow_fail(f"invalid value in column {c.name!r}: expected {c.check_msg}")
            out[c.name] = a
    # A truncated last line that still parses (e.g. "196\t242\t3\t88") cannot be told from a
    # good one; one that lost fields is caught above. Nothing more to check here.
    return Parsed(path=path, columns=out, n=table.num_rows, header=header, delimiter=delimiter)


def record_line(parsed: Parsed, record: int, *, quoted: bool = False,
                encodings: Sequence[str] = ("utf-8", "latin-1")) -> int:
    """Physical line of record ``record`` of a file read by :func:`read_delimited`."""
    text, _ = decode_text(parsed.path, encodings)
    return line_of_record(parsed.path, text, record, delimiter=parsed.delimiter, header=parsed.header,
                          quoted=quoted)
