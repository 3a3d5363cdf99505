"""Timestamps as logs have them -> int64 epoch seconds (UTC), the unit of ``events.timestamp``.

Accepted (``--time-format``, ``IngestOptions.time_format``):

* ``auto`` (default): text that is a number is epoch time, seconds or milliseconds by magnitude
  (``|v| >= 1e11`` is milliseconds: 1e11 s is the year 5138, 1e11 ms is March 1973); any other text
  is ISO 8601. The column's first value decides between the two; a later value of the other kind
  (or of the other magnitude) is an error naming its line, rather than a silent misreading.
* ``iso``: ISO 8601 / RFC 3339 text, ``YYYY-MM-DD``, ``YYYY-MM-DDTHH:MM[:SS[.fff]]`` (``T`` or a
  space), with a zone (``Z``, ``+HH:MM``, ``+HHMM``, ``+HH``, `` UTC``) or without one: **a value
  without a zone is read as UTC**.
* ``epoch-s`` / ``epoch-ms``: integers (or decimals) of seconds / milliseconds since 1970-01-01 UTC.
* anything else is a ``strptime`` pattern (``%d/%m/%Y %H:%M``; Arrow's ``strptime``: ``%z`` reads
  an offset, no ``%f``); a value must match it whole. Without ``%z`` it is UTC.

Parquet/Arrow ``timestamp`` columns (any unit; with a zone they are UTC instants, without one
read as UTC) and ``date32``/``date64`` columns are read by type, whatever the format says;
Parquet integer and float columns are epoch time as above.

Every form is floored to whole seconds (fractions dropped, toward the past), so the same
instant written any of these ways lands on the same value. Parsing is vectorised with
``pyarrow.compute`` (regex checks, Arrow's ISO 8601 cast, ``strptime``); only when that fails is
the failing row searched for (a binary search over prefixes, still vectorised), to name its line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from genrec.errors import ConfigError, DataError

TIME_FORMATS = ("auto", "iso", "epoch-s", "epoch-ms")
MS_THRESHOLD = 10 ** 11
"""An epoch value at least this large (in magnitude) is milliseconds under ``auto``."""
_MIN_S, _MAX_S = -62135596800, 253402300799  # 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z
_NUM_RE = r"^[+-]?[0-9]+(\.[0-9]*)?$"
_INT_RE = r"^[+-]?[0-9]+$"
_ZONED_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}(:[0-9]{2}){0,2}(Z|[+-][0-9]{2}(:?[0-9]{2})?)$"
_FMT_HINT = "--time-format auto|iso|epoch-s|epoch-ms|'<strptime pattern>' says which"


@dataclass(frozen=True)
class Where:
    """What an error names: the file, the field, and the 1-based line of a 0-based row."""

    path: object
    field: str
    line: Callable[[int], int]

    def error(self, row: int, reason: str) -> DataError:
        return DataError(reason, path=str(self.path), line=self.line(row), field=self.field)


def check_time_format(fmt: str) -> str:
    if not isinstance(fmt, str) or not fmt.strip():
        raise ConfigError(f"--time-format: expected one of {', '.join(TIME_FORMATS)} or a strptime pattern "
                          f"such as '%d/%m/%Y %H:%M', got {fmt!r}")
    if fmt not in TIME_FORMATS and "%" not in fmt:
        raise ConfigError(f"--time-format: {fmt!r} is neither one of {', '.join(TIME_FORMATS)} nor a strptime "
                          f"pattern (a pattern has %-codes, e.g. '%d/%m/%Y %H:%M')")
    return fmt


@dataclass
class Parsed:
    """Epoch seconds [N] int64, the rule applied (for the manifest) and notes for the person."""

    seconds: np.ndarray
    rule: str
    notes: list[str] = field(default_factory=list)


def _first_failing(values: pa.Array, parse: Callable[[pa.Array], np.ndarray]) -> int:
    """Index of the first value ``parse`` refuses: the shortest failing prefix, by binary search
    (log2(N) vectorised calls, not one Python call per row)."""
    lo, hi = 0, len(values)  # parse(values[:lo]) succeeds, parse(values[:hi]) fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            parse(values.slice(0, mid))
            lo = mid
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OverflowError):
            hi = mid
    return lo


def _normalise_iso(t: pa.Array) -> pa.Array:
    """Upper-case, a trailing ' UTC' as 'Z', no space before an offset, fractions of a second dropped
    (flooring: a fraction always points to the future)."""
    t = pc.utf8_upper(t)
    t = pc.replace_substring_regex(t, r"\s*UTC$", "Z")
    t = pc.replace_substring_regex(t, r"([0-9])\s+([+-][0-9]{2}(:?[0-9]{2})?)$", r"\1\2")
    return pc.replace_substring_regex(t, r"([0-9]{2}:[0-9]{2}:[0-9]{2})[.,][0-9]+", r"\1")


def _iso_seconds(t: pa.Array) -> np.ndarray:
    """Normalised ISO text -> epoch seconds; raises ArrowInvalid on a value Arrow's ISO 8601 parser refuses."""
    zoned = pc.match_substring_regex(t, _ZONED_RE).to_numpy(zero_copy_only=False)
    out = np.empty(len(t), dtype=np.int64)
    if zoned.any():
        z = pc.cast(t.filter(pa.array(zoned)), pa.timestamp("s", tz="UTC"))
        out[zoned] = pc.cast(z, pa.int64()).to_numpy(zero_copy_only=False)
    if not zoned.all():
        n = pc.cast(t.filter(pa.array(~zoned)), pa.timestamp("s"))
        out[~zoned] = pc.cast(n, pa.int64()).to_numpy(zero_copy_only=False)
    return out


def _epoch_values(t: pa.Array) -> np.ndarray:
    """Numeric text -> int64 values when every one is an integer, else float64."""
    if pc.all(pc.match_substring_regex(t, _INT_RE)).as_py() is not False:
        return pc.cast(t, pa.int64()).to_numpy(zero_copy_only=False)
    return pc.cast(t, pa.float64()).to_numpy(zero_copy_only=False)


def _epoch_to_seconds(v: np.ndarray, fmt: str, shown: Callable[[int], object], at: Callable[[int, str], DataError],
                      ) -> tuple[np.ndarray, str]:
    """Epoch values [K] (int64 or float64) -> seconds [K] int64 and the unit read; ``at(k, why)`` locates value k."""
    if v.dtype.kind == "f" and not np.isfinite(v).all():
        k = int(np.flatnonzero(~np.isfinite(v))[0])
        raise at(k, f"not a timestamp: {shown(k)!r}")
    if fmt == "auto":
        big = np.abs(v) >= MS_THRESHOLD  # [K]
        unit = "ms" if len(v) and big[0] else "s"
        if big.any() and not big.all():
            k = int(np.flatnonzero(big != big[0])[0])
            was, now = ("milliseconds", "seconds") if big[0] else ("seconds", "milliseconds")
            raise at(k, f"epoch timestamp {shown(k)!r} looks like {now}, but the column's first value "
                        f"{shown(0)!r} (line {at(0, '').line}) like {was}; {_FMT_HINT}")
    else:
        unit = "ms" if fmt == "epoch-ms" else "s"
    s = np.floor(v / 1000 if unit == "ms" else v) if v.dtype.kind == "f" else np.floor_divide(v, 1000 if unit == "ms"
                                                                                                 else 1)
    bad = (s < _MIN_S) | (s > _MAX_S)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise at(k, f"epoch timestamp {shown(k)!r} read as {'milliseconds' if unit == 'ms' else 'seconds'} is "
                    f"outside the years 1..9999 (microseconds or nanoseconds? convert them to seconds or "
                    f"milliseconds; {_FMT_HINT})")
    return s.astype(np.int64), unit


def _epoch_rule(w: Where, what: str, unit: str, fmt: str) -> str:
    how = {"s": "epoch seconds", "ms": "epoch milliseconds"}[unit]
    detected = (f"--time-format auto: magnitude >= {MS_THRESHOLD:.0e} is milliseconds, below it seconds"
                if fmt == "auto" else f"--time-format {fmt}")
    return f"column {w.field!r}: {what} as {how} ({detected})"


def _text(arr: pa.Array, fmt: str, w: Where) -> Parsed:
    raw = arr if pa.types.is_string(arr.type) else pc.cast(arr, pa.string())  # [N]; a dictionary decoded

    def shown(r: int) -> object:
        return raw[r].as_py()

    t = pc.utf8_trim_whitespace(raw)
    if (empty := pc.equal(t, "").to_numpy(zero_copy_only=False)).any():
        raise w.error(int(np.flatnonzero(empty)[0]), "empty value: expected a timestamp")
    numeric = pc.match_substring_regex(t, _NUM_RE).to_numpy(zero_copy_only=False)  # [N]
    kind = ("epoch" if numeric[0] else "iso") if fmt == "auto" else fmt
    if kind in ("epoch", "epoch-s", "epoch-ms"):
        if not numeric.all():
            r = int(np.flatnonzero(~numeric)[0])
            expected = {"epoch": f"epoch time, as the column's first value {shown(0)!r} (line {w.line(0)})",
                        "epoch-s": "epoch seconds (--time-format epoch-s)",
                        "epoch-ms": "epoch milliseconds (--time-format epoch-ms)"}[kind]
            raise w.error(r, f"not a timestamp: {shown(r)!r}; expected {expected}; {_FMT_HINT}")
        try:
            v = _epoch_values(t)
        except (pa.ArrowInvalid, OverflowError):
            r = _first_failing(t, _epoch_values)
            raise w.error(r, f"epoch timestamp {shown(r)!r} is out of the int64 range") from None
        secs, unit = _epoch_to_seconds(v, fmt, shown, w.error)
        return Parsed(secs, _epoch_rule(w, "text", unit, fmt))
    if kind == "iso":
        if numeric.any():
            r = int(np.flatnonzero(numeric)[0])
            why = ("epoch time? --time-format epoch-s or epoch-ms" if fmt == "iso" else
                   f"the column's first value {shown(0)!r}, line {w.line(0)}, is ISO 8601 text; {_FMT_HINT}")
            raise w.error(r, f"not an ISO 8601 timestamp: {shown(r)!r} ({why})")
        rule = (f"column {w.field!r}: ISO 8601 text" + (" (--time-format auto)" if fmt == "auto" else "")
                + "; values without a zone are UTC; fractions of a second dropped")
        for typ in (pa.timestamp("s", tz="UTC"), pa.timestamp("s")):  # fast path: a column of one canonical form
            try:
                secs = pc.cast(pc.cast(t, typ), pa.int64()).to_numpy(zero_copy_only=False)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
            notes = [] if typ.tz else [f"the {len(t)} timestamps in column {w.field!r} have no zone (the first: "
                                       f"{shown(0)!r}, line {w.line(0)}): read as UTC"]
            return Parsed(secs, rule, notes)
        norm = _normalise_iso(t)
        try:
            secs = _iso_seconds(norm)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            r = _first_failing(norm, _iso_seconds)
            raise w.error(r, f"not an ISO 8601 timestamp: {shown(r)!r} (expected e.g. '1997-12-04T15:55:49Z', "
                             f"'1997-12-04T15:55:49+01:00' or '1997-12-04 15:55:49'; {_FMT_HINT})") from None
        zoned = pc.match_substring_regex(norm, _ZONED_RE).to_numpy(zero_copy_only=False)  # [N]
        notes = []
        if not zoned.all():
            r = int(np.flatnonzero(~zoned)[0])
            notes.append(f"{int(np.count_nonzero(~zoned))} of {len(zoned)} timestamps in column {w.field!r} have "
                         f"no zone (the first: {shown(r)!r}, line {w.line(r)}): read as UTC")
        return Parsed(secs, rule, notes)
    try:  # a strptime pattern
        ts = pc.strptime(t, format=fmt, unit="s", error_is_null=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ConfigError(f"--time-format: Arrow's strptime refuses the pattern {fmt!r}: {e}") from None
    if ts.null_count:
        r = int(np.flatnonzero(ts.is_null().to_numpy(zero_copy_only=False))[0])
        raise w.error(r, f"timestamp {shown(r)!r} does not match --time-format {fmt!r}")
    secs = pc.cast(ts, pa.int64()).to_numpy(zero_copy_only=False)
    zone = "" if "%z" in fmt else "; no %z in the pattern: read as UTC"
    return Parsed(secs, f"column {w.field!r}: text in the strptime pattern {fmt!r}{zone}")


def to_epoch_seconds(arr: pa.Array | pa.ChunkedArray, fmt: str, where: Where) -> Parsed:
    """One events column (text, integers, floats, Arrow timestamps or dates; no nulls) -> epoch seconds [N] int64,
    the rule applied, and notes (values read as UTC for want of a zone)."""
    check_time_format(fmt)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    typ = arr.type
    if pa.types.is_timestamp(typ):
        v = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False)
        per_s = {"s": 1, "ms": 1000, "us": 10 ** 6, "ns": 10 ** 9}[typ.unit]
        zone = f"zone {typ.tz}: UTC instants" if typ.tz else "no zone in the type: read as UTC"
        notes = [] if typ.tz else [f"column {where.field!r} ({typ}) has no zone: read as UTC"]
        return Parsed(np.floor_divide(v, per_s).astype(np.int64),
                      f"column {where.field!r}: Arrow {typ} ({zone}); fractions of a second dropped", notes)
    if pa.types.is_date32(typ):
        days = pc.cast(arr, pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64)
        return Parsed(days * 86400, f"column {where.field!r}: Arrow date32 (each day at 00:00 UTC)")
    if pa.types.is_date64(typ):
        v = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False)
        return Parsed(np.floor_divide(v, 1000).astype(np.int64), f"column {where.field!r}: Arrow date64 (UTC)")
    if pa.types.is_integer(typ) or pa.types.is_floating(typ):
        if fmt not in ("auto", "epoch-s", "epoch-ms"):
            raise where.error(0, f"a column of numbers ({typ}) cannot be read with --time-format {fmt!r}: numbers "
                                 f"are epoch time (--time-format auto, epoch-s or epoch-ms)")
        v = arr.to_numpy(zero_copy_only=False)
        if v.dtype == np.uint64 and (over := v > np.uint64(2 ** 63 - 1)).any():
            r = int(np.flatnonzero(over)[0])
            raise where.error(r, f"epoch timestamp {int(v[r])} is out of the int64 range")
        v = v.astype(np.float64 if v.dtype.kind == "f" else np.int64)
        secs, unit = _epoch_to_seconds(v, fmt, lambda r: v[r].item(), where.error)
        return Parsed(secs, _epoch_rule(where, str(typ), unit, fmt))
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_dictionary(typ):
        return _text(arr, fmt, where)
    raise where.error(0, f"expected timestamps (text, numbers, or an Arrow timestamp or date column), found type {typ}")
