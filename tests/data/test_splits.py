"""Splits: leave-one-out and temporal cutoffs vs a plain per-user Python construction."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.data.splits import SplitSpec, compute_cutoffs, eval_cases, split_counts, train_events
from genrec.errors import ConfigError, DataError


def _events(rows: list[tuple[int, int, int, int]]) -> pa.Table:
    """rows: (user, item, timestamp, seq)."""
    u, i, t, s = zip(*rows) if rows else ((), (), (), ())
    return pa.table({
        "user_id": pa.array(u, pa.int64()), "item_id": pa.array(i, pa.int64()),
        "surface": pa.array(["home"] * len(rows), pa.string()),
        "action": pa.array(["click"] * len(rows), pa.string()),
        "timestamp": pa.array(t, pa.int64()), "seq": pa.array(s, pa.int32()),
    })


def naive_cutoffs(rows: list[tuple[int, int, int, int]], spec: SplitSpec) -> dict[int, tuple[int, int, int]]:
    """user -> (train_end, valid_seq, test_seq), written plainly."""
    by_user: dict[int, list[tuple[int, int]]] = {}
    for u, _i, t, s in rows:
        by_user.setdefault(u, []).append((s, t))
    cut = spec.cut_ts
    if spec.kind == "temporal" and cut is None:
        ts = sorted(t for _u, _i, t, _s in rows)
        cut = ts[math.floor(spec.cut_quantile * (len(ts) - 1))]
    out = {}
    for u, evs in by_user.items():
        evs.sort()
        seqs = [s for s, _t in evs]
        if spec.kind == "loo":
            if len(seqs) >= 3:
                out[u] = (seqs[-2], seqs[-2], seqs[-1])
            else:
                out[u] = (seqs[-1] + 1, -1, -1)
        else:
            first_post = next((j for j, (_s, t) in enumerate(evs) if t >= cut), len(evs))
            pre = seqs[:first_post]
            test = seqs[first_post] if first_post < len(evs) and len(pre) >= 1 else -1
            valid = pre[-1] if len(pre) >= 2 else -1
            train_end = pre[-1] if len(pre) >= 2 else (pre[-1] + 1 if pre else seqs[0])
            out[u] = (train_end, valid, test)
    return out


@st.composite
def event_rows(draw: st.DrawFn) -> list[tuple[int, int, int, int]]:
    n_users = draw(st.integers(0, 6))
    uids = draw(st.lists(st.integers(-50, 10**12), min_size=n_users, max_size=n_users, unique=True))
    rows = []
    for u in uids:
        n = draw(st.integers(1, 7))
        gaps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        dts = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
        s, t = -1, draw(st.integers(0, 20))
        for g, dt in zip(gaps, dts):
            s, t = s + g, t + dt
            rows.append((u, draw(st.integers(0, 9)), t, s))
    perm = draw(st.permutations(range(len(rows))))
    return [rows[j] for j in perm]


specs = st.one_of(
    st.just(SplitSpec("loo")),
    st.builds(SplitSpec, kind=st.just("temporal"), cut_ts=st.integers(0, 40)),
    st.builds(SplitSpec, kind=st.just("temporal"), cut_quantile=st.floats(0.05, 0.95)),
)


@settings(max_examples=150, deadline=None)
@given(rows=event_rows(), spec=specs)
def test_cutoffs_match_naive(rows: list[tuple[int, int, int, int]], spec: SplitSpec) -> None:
    ev = _events(rows)
    if not rows and spec.kind == "temporal" and spec.cut_ts is None:
        with pytest.raises(DataError):
            compute_cutoffs(ev, spec)
        return
    cut = compute_cutoffs(ev, spec)
    want = naive_cutoffs(rows, spec)
    got = {int(u): (int(a), int(b), int(c))
           for u, a, b, c in zip(cut.user_id, cut.train_end, cut.valid_seq, cut.test_seq)}
    assert got == want
    # train_events == rows with seq < train_end; eval cases == the target rows
    tr = train_events(ev, cut)
    got_train = sorted(zip(*(tr.column(c).to_pylist() for c in ("user_id", "item_id", "timestamp", "seq"))))
    assert got_train == sorted(r for r in rows if r[3] < want[r[0]][0])
    for split, j in (("valid", 1), ("test", 2)):
        cases = eval_cases(ev, cut, split)
        got_cases = sorted(zip(cases.user_id.tolist(), cases.target_item.tolist(), cases.target_ts.tolist(),
                               cases.target_seq.tolist(), cases.n_history.tolist()))
        want_cases = sorted(
            (u, i, t, s, sum(1 for r in rows if r[0] == u and r[3] < s))
            for u, i, t, s in rows if want[u][j] == s
        )
        assert got_cases == want_cases
        assert list(cases.user_id) == sorted(cases.user_id)


def test_loo_hand_example() -> None:
    # user 1: 5 events (shuffled input), user 2: 2 events, user 3: 3 events
    rows = [(1, 14, 5, 4), (1, 10, 1, 0), (1, 12, 3, 2), (1, 11, 2, 1), (1, 13, 4, 3),
            (2, 20, 1, 0), (2, 21, 1, 1), (3, 30, 7, 0), (3, 31, 8, 1), (3, 32, 9, 2)]
    ev = _events(rows)
    cut = compute_cutoffs(ev, SplitSpec("loo"))
    assert cut.user_id.tolist() == [1, 2, 3]
    assert cut.train_end.tolist() == [3, 2, 1]
    assert cut.valid_seq.tolist() == [3, -1, 1]
    assert cut.test_seq.tolist() == [4, -1, 2]
    assert split_counts(cut) == {"users": 3, "valid_cases": 2, "test_cases": 2}
    test = eval_cases(ev, SplitSpec("loo"), "test")
    assert test.user_id.tolist() == [1, 3] and test.target_item.tolist() == [14, 32]
    assert test.n_history.tolist() == [4, 2]
    assert list(test.target_action) == ["click", "click"]
    valid = eval_cases(ev, SplitSpec("loo"), "valid")
    assert valid.target_item.tolist() == [13, 31] and valid.n_history.tolist() == [3, 1]
    assert sorted(train_events(ev, SplitSpec("loo")).column("item_id").to_pylist()) == [10, 11, 12, 20, 21, 30]


def test_temporal_hand_example() -> None:
    rows = [(1, 10, 1, 0), (1, 11, 2, 1), (1, 12, 3, 2), (1, 13, 8, 3), (1, 14, 9, 4),  # 3 pre, 2 post
            (2, 20, 7, 0), (2, 21, 8, 1),  # only post-cut: cold start, no test case
            (3, 30, 4, 0)]  # only pre-cut, 1 event: no cases, all train
    ev = _events(rows)
    spec = SplitSpec("temporal", cut_ts=7)
    cut = compute_cutoffs(ev, spec)
    assert cut.train_end.tolist() == [2, 0, 1]
    assert cut.valid_seq.tolist() == [2, -1, -1]
    assert cut.test_seq.tolist() == [3, -1, -1]
    assert sorted(train_events(ev, spec).column("item_id").to_pylist()) == [10, 11, 30]


def test_quantile_resolution() -> None:
    ts = np.arange(101, dtype=np.int64)[::-1]
    assert SplitSpec("temporal", cut_quantile=0.9).resolve(ts).cut_ts == 90
    assert SplitSpec("temporal", cut_ts=5).resolve(ts).cut_ts == 5
    assert SplitSpec("loo").resolve(ts) == SplitSpec("loo")


def test_bad_input() -> None:
    with pytest.raises(ConfigError, match="kind"):
        SplitSpec("random")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cut_quantile"):
        SplitSpec("temporal", cut_quantile=1.5)
    with pytest.raises(ConfigError, match="cut_ts"):
        SplitSpec("loo", cut_ts=3)
    with pytest.raises(DataError, match="seq"):
        compute_cutoffs(_events([(1, 1, 1, 0), (1, 2, 2, 0)]), SplitSpec("loo"))
    with pytest.raises(ValueError, match="split"):
        eval_cases(_events([(1, 1, 1, 0)]), SplitSpec("loo"), "train")  # type: ignore[arg-type]
