"""Timestamps as logs have them (issue 42): ISO 8601 with or without a zone, epoch seconds or milliseconds,
strptime patterns, Arrow timestamps and dates -- every form of one instant lands on the same epoch second;
a malformed one is a DataError naming the file, the line and the field."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from genrec.data.ingest import ColumnMapping, IngestOptions, prepare_dataset
from genrec.data.ingest.timestamps import Where, to_epoch_seconds
from genrec.errors import ConfigError, DataError

EPOCH = datetime(1970, 1, 1)
MIN_S, MAX_S = -62135596800 + 15 * 3600, 253402300799 - 15 * 3600  # years 1..9999, room for any zone offset
MS_FROM = 10 ** 8  # 1973-03-03: from here on, epoch milliseconds are >= 1e11 and `auto` reads them as such
W = Where("events.csv", "timestamp", lambda r: r + 2)
NO_ACTION = ColumnMapping(action=None)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

instants = st.tuples(st.integers(MIN_S, MAX_S), st.integers(0, 999))  # (floor seconds, milliseconds)
offsets = st.integers(-14 * 60, 14 * 60)  # zone offset in minutes


def _stamp(s: int, ms: int, off: int) -> str:
    """The local wall-clock time of instant s + ms/1000 at zone offset ``off`` minutes, 'YYYY-MM-DDTHH:MM:SS'."""
    t = EPOCH + timedelta(seconds=s, milliseconds=ms, minutes=off)
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"


def iso_forms(s: int, ms: int, off: int) -> list[str]:
    """Every textual ISO 8601 form of one instant genrec reads, at zone offset ``off`` and in UTC."""
    local, utc = _stamp(s, ms, off), _stamp(s, ms, 0)
    sign, (hh, mm) = "+" if off >= 0 else "-", divmod(abs(off), 60)
    fracs = ["", f".{ms:03d}", f".{ms:03d}417", f",{ms:03d}", f".{ms // 100}"]
    zones = [f"{sign}{hh:02d}:{mm:02d}", f"{sign}{hh:02d}{mm:02d}", f" {sign}{hh:02d}:{mm:02d}"]
    if mm == 0:
        zones.append(f"{sign}{hh:02d}")
    out = [local + f + z for f in fracs for z in zones]
    out += [utc + f + z for f in fracs for z in ("Z", " UTC", "+00:00")]  # UTC spelled out
    out += [utc.replace("T", " ") + f for f in fracs] + [utc + f for f in fracs]  # no zone: UTC
    out += [utc.lower() + "z", " " + utc.replace("T", " ") + "Z "]  # lower case, padded
    return out


def epoch_forms(s: int, ms: int) -> dict[str, list[str]]:
    """Epoch forms of one instant, by the --time-format that reads them (auto reads the first three)."""
    secs = str(Decimal(s) + Decimal(ms) / 1000)
    return {"auto-s": [str(s)], "auto-s-decimal": [secs], "auto-ms": [str(s * 1000 + ms)],
            "epoch-s": [str(s), secs], "epoch-ms": [str(s * 1000 + ms)]}


@SETTINGS
@given(instant=instants, off=offsets)
def test_every_iso_form_of_an_instant_is_the_same_second(instant: tuple[int, int], off: int) -> None:
    s, ms = instant
    forms = iso_forms(s, ms, off)
    for fmt in ("auto", "iso"):
        got = to_epoch_seconds(pa.array(forms), fmt, W).seconds
        assert got.tolist() == [s] * len(forms), [f for f, g in zip(forms, got) if g != s]


@SETTINGS
@given(instant=st.tuples(st.integers(-(10 ** 10), 10 ** 10), st.integers(0, 999)))
def test_epoch_seconds_and_milliseconds_are_the_same_second(instant: tuple[int, int]) -> None:
    s, ms = instant
    forms = epoch_forms(s, ms)
    for fmt in ("epoch-s", "epoch-ms"):
        assert to_epoch_seconds(pa.array(forms[fmt]), fmt, W).seconds.tolist() == [s] * len(forms[fmt])
    if MS_FROM <= s:  # auto: seconds below 1e11, milliseconds from 1e11 on
        for key in ("auto-s", "auto-s-decimal", "auto-ms"):
            assert to_epoch_seconds(pa.array(forms[key]), "auto", W).seconds.tolist() == [s], key
        for typ, v in ((pa.int64(), s), (pa.int64(), s * 1000 + ms), (pa.float64(), s + ms / 1000)):
            assert to_epoch_seconds(pa.array([v], typ), "auto", W).seconds.tolist() == [s]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(st.tuples(st.integers(MS_FROM, 4 * 10 ** 9), st.integers(0, 999), offsets), min_size=1,
                      max_size=4))
def test_every_form_through_the_ingest_lands_as_one_canonical_value(tmp_path_factory: pytest.TempPathFactory,
                                                                    cases: list[tuple[int, int, int]]) -> None:
    """End to end: CSV files (text) and Parquet files (Arrow types) of the same instants give the same
    events.timestamp, the epoch second; the manifest's rule says how they were read."""
    d = tmp_path_factory.mktemp("forms")
    files: dict[str, list[tuple[int, int, object]]] = {"iso": [], "s": [], "ms": []}
    for u, (s, ms, off) in enumerate(cases):  # user u: instant u; item k: form k
        files["iso"] += [(u, k, f) for k, f in enumerate(iso_forms(s, ms, off))]
        files["s"].append((u, 0, s))
        files["ms"].append((u, 0, s * 1000 + ms))
    want = {u: s for u, (s, _ms, _off) in enumerate(cases)}
    for name, rows in files.items():
        with open(d / f"{name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["user_id", "item_id", "timestamp"])
            w.writerows(rows)
        ds = prepare_dataset("generic", d / f"{name}.csv", options=IngestOptions(columns=NO_ACTION))
        got = list(zip(ds.events.column("user_id").to_pylist(), ds.events.column("timestamp").to_pylist()))
        assert all(t == want[u] for u, t in got) and len(got) == len(rows), name
        assert ds.info.time_rule and "epoch seconds" in ds.info.time_rule
    ms_col = pa.array([s * 1000 + ms for s, ms, _ in cases], pa.int64())
    n = len(cases)
    for typ in (pa.timestamp("s"), pa.timestamp("ms", tz="UTC"), pa.timestamp("us", tz="+05:30"), pa.timestamp("ns"),
                "int-ms", "float-s", "text-s"):
        if typ == "int-ms":
            col = ms_col
        elif typ == "float-s":
            col = pa.array([s + ms / 1000 for s, ms, _ in cases])
        elif typ == "text-s":
            col = pa.array([str(s) for s, _, _ in cases])
        else:
            col = _as_timestamp(ms_col, typ)
        pq.write_table(pa.table({"user_id": list(range(n)), "item_id": [0] * n, "timestamp": col}), d / "t.parquet")
        ds = prepare_dataset("generic", d / "t.parquet", options=IngestOptions(columns=NO_ACTION))
        got = dict(zip(ds.events.column("user_id").to_pylist(), ds.events.column("timestamp").to_pylist()))
        assert got == want, typ


def _as_timestamp(ms: pa.Array, typ: pa.DataType) -> pa.Array:
    """Epoch milliseconds (positive here) as an Arrow timestamp of another unit and zone: the same instants."""
    scale = {"s": (1, 1000), "ms": (1, 1), "us": (1000, 1), "ns": (10 ** 6, 1)}[typ.unit]
    return pa.array([x * scale[0] // scale[1] for x in ms.to_pylist()], pa.int64()).cast(typ)


def test_dates_strptime_patterns_and_the_rule_in_the_manifest(tmp_path: Path) -> None:
    from genrec.recipes.pipeline import prepare

    day = 10195  # 1997-12-01
    pq.write_table(pa.table({"user_id": [1, 1], "item_id": [1, 2], "timestamp": pa.array([day, day + 3], pa.date32())}),
                   tmp_path / "d.parquet")
    ds = prepare_dataset("generic", tmp_path / "d.parquet", options=IngestOptions(columns=NO_ACTION))
    assert ds.events.column("timestamp").to_pylist() == [day * 86400, (day + 3) * 86400]
    (tmp_path / "p.csv").write_text("user_id,item_id,timestamp\n1,1,04/12/1997 15:55\n1,2,04/12/1997 16:55 +0100\n")
    with pytest.raises(DataError) as e:  # the second value has an offset the pattern lacks
        prepare_dataset("generic", tmp_path / "p.csv",
                        options=IngestOptions(columns=NO_ACTION, time_format="%d/%m/%Y %H:%M"))
    assert (e.value.line, e.value.field) == (3, "timestamp") and "--time-format '%d/%m/%Y %H:%M'" in str(e.value)
    (tmp_path / "p.csv").write_text("user_id,item_id,timestamp\n1,1,04/12/1997 15:55 +0000\n1,2,04/12/1997 16:55 +0100\n")
    wd = tmp_path / "wd"
    prepare(wd, "generic", source=tmp_path / "p.csv",
            options=IngestOptions(columns=NO_ACTION, time_format="%d/%m/%Y %H:%M %z"))
    m = json.loads((wd / "tables" / "manifest.json").read_text())
    assert "strptime pattern '%d/%m/%Y %H:%M %z'" in m["info"]["time_rule"]
    assert "epoch seconds" in m["info"]["time_rule"]
    from genrec.catalog import open_store

    assert open_store(wd).read_events().column("timestamp").to_pylist() == [881250900, 881250900]
    with pytest.raises(ConfigError, match="--time-format"):
        IngestOptions(time_format="dd/mm/yyyy")


BAD = ["1997-13-04T00:00:00Z", "1997-02-30 10:00:00", "1997-12-04T25:00:00Z", "yesterday", "12/04/1997",
       "1997-12-04T15:55:49+25:00", "1997-12-04T15:55:49Zjunk", "", "881250949"]


@SETTINGS
@given(n_good=st.integers(1, 30), at=st.integers(0, 30), bad=st.sampled_from(BAD), blank=st.booleans(),
       zone=st.sampled_from(["Z", "+02:00", ""]))
def test_a_malformed_timestamp_names_file_line_and_field(tmp_path_factory: pytest.TempPathFactory, n_good: int,
                                                         at: int, bad: str, blank: bool, zone: str) -> None:
    at = min(at, n_good)
    assume(not (bad == "881250949" and at == 0))  # a first value of epoch time makes the column epoch time
    d = tmp_path_factory.mktemp("bad")
    rows = [f"{i},{i},1997-12-04T15:{i:02d}:49{zone},click" for i in range(n_good)]
    rows.insert(at, f"7,7,{bad},click")
    if blank and at > 0:
        rows.insert(1, "")  # a blank line counts as a physical line
    (d / "events.csv").write_text("user_id,item_id,timestamp,action\n" + "\n".join(rows) + "\n")
    with pytest.raises(DataError) as e:
        prepare_dataset("generic", d / "events.csv")
    line = at + 2 + (1 if blank and at > 0 else 0)
    assert (e.value.path, e.value.line, e.value.field) == (str(d / "events.csv"), line, "timestamp"), str(e.value)
    assert "=" not in e.value.reason.replace("==", "")  # CLI words (--time-format), no keyword arguments
    if bad:
        assert repr(bad) in e.value.reason
    pq.write_table(pa.table({"user_id": [0] * (n_good + 1), "item_id": [0] * (n_good + 1),
                             "timestamp": [r.split(",")[2] for r in rows if r]}), d / "events.parquet")
    with pytest.raises(DataError) as e:
        prepare_dataset("generic", d / "events.parquet", options=IngestOptions(columns=NO_ACTION))
    assert (e.value.line, e.value.field) == (at + 1, "timestamp"), str(e.value)  # Parquet: the 1-based row


@pytest.mark.parametrize("rows, fmt, line, want", [
    ("881250949\n1,1,881250949000", "auto", 3, "looks like milliseconds, but the column's first value '881250949' "
                                              "(line 2) like seconds"),
    ("881250949000000\n1,1,881250949000001", "auto", 2, "microseconds or nanoseconds?"),
    ("1997-12-04T15:55:49Z\n1,1,881250949", "auto", 3, "is ISO 8601 text"),
    ("881250949\n1,1,1997-12-04", "auto", 3, "expected epoch time, as the column's first value '881250949' (line 2)"),
    ("881250949", "iso", 2, "--time-format epoch-s or epoch-ms"),
    ("1997-12-04", "epoch-ms", 2, "expected epoch milliseconds (--time-format epoch-ms)"),
    ("99999999999999999999", "epoch-s", 2, "out of the int64 range"),
])
def test_format_mismatches_say_which_flag(tmp_path: Path, rows: str, fmt: str, line: int, want: str) -> None:
    (tmp_path / "e.csv").write_text("user_id,item_id,timestamp\n1,1," + rows + "\n")
    with pytest.raises(DataError) as e:
        prepare_dataset("generic", tmp_path / "e.csv", options=IngestOptions(columns=NO_ACTION, time_format=fmt))
    assert (e.value.line, e.value.field) == (line, "timestamp") and want in str(e.value), str(e.value)
