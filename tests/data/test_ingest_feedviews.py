"""The feedview rule: a hand-made example, and the vectorised builder against its slow twin."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.data.ingest.build import order_events, seq_within_user
from genrec.data.ingest.feedviews import build_feedviews, feedview_rule_text, feedviews_reference

ACTIONS = ["view", "like", "dislike"]


def _build(user, item, ts, act, surf, surfaces, slate):  # type: ignore[no-untyped-def]
    user, ts = np.asarray(user, dtype=np.int64), np.asarray(ts, dtype=np.int64)
    o = order_events(user, ts)
    u, it, t = user[o], np.asarray(item, dtype=np.int64)[o], ts[o]
    a, s = np.asarray(act, dtype=np.int8)[o], np.asarray(surf, dtype=np.int8)[o]
    seq = seq_within_user(u)
    fv = build_feedviews(user=u, seq=seq, timestamp=t, item=it, action_idx=a, surface_idx=s, surfaces=surfaces,
                         slate_size=slate)
    events = [{"user_id": int(u[i]), "seq": int(seq[i]), "timestamp": int(t[i]), "item_id": int(it[i]),
               "action": ACTIONS[a[i]], "surface": surfaces[s[i]]} for i in range(len(u))]
    return fv, events


def test_hand_made_example() -> None:
    # user 1: 5 events (ts 1..5), user 2: 2 events; slate 2
    user = [1, 1, 1, 1, 1, 2, 2]
    item = [10, 11, 12, 13, 14, 20, 21]
    ts = [1, 2, 3, 4, 5, 7, 9]
    act = [0, 1, 2, 1, 0, 2, 2]
    fv, _ = _build(user, item, ts, act, [0] * 7, ["s"], 2)
    assert fv.to_pylist() == [
        {"user_id": 1, "request_ts": 1, "request_seq": 0, "surface": "s", "item_ids": [10, 11], "labels": [1, 2]},
        {"user_id": 1, "request_ts": 3, "request_seq": 2, "surface": "s", "item_ids": [12, 13], "labels": [4, 2]},
        {"user_id": 1, "request_ts": 5, "request_seq": 4, "surface": "s", "item_ids": [14], "labels": [1]},
        {"user_id": 2, "request_ts": 7, "request_seq": 0, "surface": "s", "item_ids": [20, 21], "labels": [4, 4]},
    ]


def test_surface_change_starts_a_request() -> None:
    fv, _ = _build([1, 1, 1, 1], [1, 2, 3, 4], [0, 1, 2, 3], [0, 0, 0, 0], [0, 0, 1, 1], ["a", "b"], 8)
    assert [r["item_ids"] for r in fv.to_pylist()] == [[1, 2], [3, 4]]
    assert fv.column("surface").to_pylist() == ["a", "b"]


def test_rule_text_is_precise() -> None:
    t = feedview_rule_text(8, ACTIONS)
    assert "chunks of 8" in t and "seq 0" in t and "dislike=bit 2" in t and "request_ts" in t


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1000), st.integers(0, 6), st.integers(0, 2),
                       st.integers(0, 1)), max_size=80),
    st.integers(1, 5),
)
@settings(max_examples=120, deadline=None)
def test_matches_slow_twin(rows: list[tuple[int, int, int, int, int]], slate: int) -> None:
    user = [r[0] for r in rows]
    item = [r[1] for r in rows]
    ts = [r[2] for r in rows]
    act = [r[3] for r in rows]
    surf = [r[4] for r in rows]
    fv, events = _build(user, item, ts, act, surf, ["a", "b"], slate)
    assert fv.to_pylist() == feedviews_reference(events, ACTIONS, slate)
