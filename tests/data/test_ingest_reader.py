"""The two-speed reader: Arrow fast path vs a plain Python parse, and exact error lines on corruption."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.data.ingest.common import Column, finite, int_col, read_delimited
from genrec.errors import DataError

COLS = [int_col("user"), int_col("item"), Column("rating", "float", finite, "a finite number"), int_col("ts")]

rows_st = st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(0, 10**9), st.sampled_from([0.5, 1.0, 3.5, 5.0]),
              st.integers(0, 2**40)),
    min_size=1, max_size=40,
)
corruption_st = st.sampled_from(["none", "non_int", "missing_field", "extra_field", "empty_value", "negative"])


def _slow_parse(lines: list[str], delim: str) -> list[tuple[int, int, float, int]]:
    out = []
    for s in lines:
        a, b, c, d = s.split(delim)
        out.append((int(a), int(b), float(c), int(d)))
    return out


@pytest.mark.parametrize("delim", ["\t", "::"])
@given(rows=rows_st, kind=corruption_st, where=st.integers(0, 10**6), blank=st.booleans(), header=st.booleans())
@settings(max_examples=40, deadline=None)
def test_fast_path_matches_slow_twin(delim: str, rows: list[tuple[int, int, float, int]], kind: str, where: int,
                                     blank: bool, header: bool) -> None:
    if delim == "::" and header:
        header = False  # .dat files have no header
    lines = [delim.join([str(u), str(i), str(r), str(t)]) for u, i, r, t in rows]
    bad = where % len(lines)
    field = None
    f = lines[bad].split(delim)
    if kind == "non_int":
        f[1], field = "7x", "item"
    elif kind == "missing_field":
        f, field = f[:2], "rating"
    elif kind == "extra_field":
        f, field = f + ["9"], None
    elif kind == "empty_value":
        f[3], field = "", "ts"
    elif kind == "negative":
        f[0], field = "-3", "user"
    lines[bad] = delim.join(f)
    body = [("user" + delim + "item" + delim + "rating" + delim + "ts")] if header else []
    physical: list[int] = []
    for s in lines:
        if blank:
            body.append("")
        body.append(s)
        physical.append(len(body))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "r.txt"
        p.write_text("\n".join(body) + "\n")
        if kind == "none":
            got = read_delimited(p, COLS, delimiter=delim, header=header)
            want = _slow_parse(lines, delim)
            assert got["user"].tolist() == [w[0] for w in want]
            assert got["item"].tolist() == [w[1] for w in want]
            assert np.allclose(got["rating"], [w[2] for w in want])
            assert got["ts"].tolist() == [w[3] for w in want]
        else:
            with pytest.raises(DataError) as ei:
                read_delimited(p, COLS, delimiter=delim, header=header)
            assert ei.value.line == physical[bad], str(ei.value)
            assert ei.value.field == field, str(ei.value)
            assert ei.value.path == str(p)


def test_bom_and_quoted_header(tmp_path: Path) -> None:
    p = tmp_path / "r.csv"
    p.write_bytes('\ufeff"user","item","rating","ts"\r\n1,2,3.5,4\r\n'.encode())
    got = read_delimited(p, COLS, delimiter=",", header=True, quoted=True)
    assert got["user"].tolist() == [1] and got["ts"].tolist() == [4]
