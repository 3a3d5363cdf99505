"""An impressions file for `genrec data prepare generic` (--impressions): logged slates replace the synthesised
feedviews, label 0 = shown, not engaged; request_seq counts the user's events strictly before the request; errors
name file, line and field; the slates reach the join, the action loss and the ranking metrics."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from genrec.data.ingest import ColumnMapping, IngestOptions, prepare_dataset
from genrec.data.ingest.impressions import events_before, impressions_reference
from genrec.data.join import BucketJoinReader
from genrec.data.splits import SplitSpec
from genrec.errors import ConfigError, DataError

EVENTS = """user_id,item_id,timestamp,action
u1,a,100,click
u1,b,200,like
u1,c,300,click
u2,a,150,click
u2,d,250,like
"""
IMPRESSIONS = """request_id,user_id,item_id,timestamp,position,action
r1,u1,a,100,1,click
r1,u1,x,100,2,
r1,u1,b,100,0,like|click
r2,u2,d,250,1,like
r2,u2,a,250,2,
r3,u3,a,50,1,
r3,u3,a,50,1,click
"""


def _write(tmp_path: Path, events: str = EVENTS, impressions: str = IMPRESSIONS) -> tuple[Path, Path]:
    (tmp_path / "events.csv").write_text(events)
    (tmp_path / "impressions.csv").write_text(impressions)
    return tmp_path / "events.csv", tmp_path / "impressions.csv"


def _prepare(ev: Path, imp: Path, **kw: Any) -> Any:
    return prepare_dataset("generic", ev, options=IngestOptions(impressions_path=str(imp), **kw))


def test_impression_only_items_are_label_0_in_the_feedviews_table(tmp_path: Path) -> None:
    from genrec.recipes import pipeline
    from genrec.data.store import TableStore

    ev, imp = _write(tmp_path)
    m = pipeline.prepare(tmp_path / "run", "generic", source=ev, n_buckets=2,
                         options=IngestOptions(impressions_path=str(imp)))
    store = TableStore(tmp_path / "run" / "tables")
    info = store.info()
    assert info.impressions and info.feedview_rule.startswith(f"From the impressions file {imp}")
    assert "strictly before request_ts" in info.feedview_rule and "click=bit 0, like=bit 1" in info.feedview_rule
    assert info.actions == ["click", "like"] and info.extra["user_ids"] == ["u1", "u2", "u3"]  # u3: impressions only
    fv = sorted(store.read_feedviews().to_pylist(), key=lambda r: r["user_id"])
    # ids mapped with the events' tables: users u1=0 u2=1 (u3=2 next); items a=0 b=1 c=2 d=3, x=4 (shown only)
    assert [(r["user_id"], r["request_ts"], r["request_seq"], r["surface"], r["item_ids"], r["labels"])
            for r in fv] == [
        (0, 100, 0, "default", [1, 0, 4], [0b11, 0b01, 0]),  # ordered by position; 'like|click' = both bits
        (1, 250, 1, "default", [3, 0], [0b10, 0]),  # the event at 250 is not before the request at 250
        (2, 50, 0, "default", [0], [0b01]),  # two rows of one position: one shown item, actions OR-ed
    ]
    # bucketed like the events: every bucket's rows, and only its users'
    by_bucket = [store.read_feedviews(b).num_rows for b in range(2)]
    assert sum(by_bucket) == 3 and m["counts"]["feedviews"] == 3
    items = {r["item_id"]: r for r in store.read_items().to_pylist()}
    assert '"original_id": "x"' in items[4]["attributes"] and '"synthesised": true' in items[4]["attributes"]
    counts = info.extra["counts"]
    assert (counts["shown_items"], counts["impression_only_items"], counts["requests"]) == (6, 2, 3)
    assert "slate_size" not in info.extra
    assert any("u3" in n for n in info.extra["notes"])


def test_cli_flags_name_the_file_and_its_columns(tmp_path: Path) -> None:
    from genrec.cli import app

    ev, _ = _write(tmp_path)
    (tmp_path / "shown.csv").write_text(IMPRESSIONS.replace("request_id", "req").replace("position", "slot"))
    r = CliRunner().invoke(app, ["data", "prepare", "generic", str(tmp_path / "run"), "--source", str(ev),
                                 "--impressions", str(tmp_path / "shown.csv"), "--request-col", "req",
                                 "--position-col", "slot", "--buckets", "2"])
    assert r.exit_code == 0, r.output
    assert "From the impressions file" in r.stdout and "column 'slot'" in r.stdout
    r = CliRunner().invoke(app, ["data", "prepare", "generic", str(tmp_path / "run2"), "--source", str(ev),
                                 "--impressions", str(tmp_path / "shown.csv")])
    assert r.exit_code != 0 and "shown.csv:1: field 'request_id'" in r.output and "Traceback" not in r.output


def test_request_seq_counts_events_strictly_before_the_request(tmp_path: Path) -> None:
    events = "user_id,item_id,timestamp,action\n" + "".join(
        f"7,{i},{t},click\n" for i, t in [(1, 10), (2, 20), (3, 20), (4, 30)])
    imp = "request_id,user_id,item_id,timestamp,position,action\n" + "".join(
        f"q{t},7,9,{t},0,\n" for t in (5, 10, 11, 20, 21, 30, 31))
    ds = _prepare(*_write(tmp_path, events, imp))
    got = {r["request_ts"]: r["request_seq"] for r in ds.feedviews.to_pylist()}
    # an event at the request's own timestamp counts as after it: the slate never sees its own engagements
    assert got == {5: 0, 10: 0, 11: 1, 20: 1, 21: 3, 30: 3, 31: 4}
    rng = np.random.default_rng(0)
    ev_user = np.sort(rng.integers(0, 5, 200))
    ev_ts = rng.integers(0, 50, 200)
    user, ts = rng.integers(0, 6, 300), rng.integers(0, 52, 300)
    want = [int(np.count_nonzero((ev_user == u) & (ev_ts < t))) for u, t in zip(user, ts)]
    assert events_before(ev_user, ev_ts, user, ts).tolist() == want


ACTIONS = ("click", "like", "hide")
ACTION_VALUES = ["", "", "click", "like", "hide", "click|like", "hide | click"]


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[tuple[int, int, int, str]], list[dict[str, Any]]]:
    events = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(0, 20),
                                     st.sampled_from(ACTIONS)), max_size=25))
    rows: list[dict[str, Any]] = []
    for r in range(draw(st.integers(1, 6))):
        user, ts = draw(st.integers(0, 4)), draw(st.integers(0, 21))
        surface = draw(st.sampled_from(["home", "search"]))
        slate = draw(st.dictionaries(st.integers(0, 6), st.integers(0, 12), min_size=1, max_size=5))
        for pos, item in slate.items():
            for action in draw(st.lists(st.sampled_from(ACTION_VALUES), min_size=1, max_size=2)):
                rows.append({"request": f"r{r}", "user_id": user, "item_id": item, "timestamp": ts, "position": pos,
                             "action": action, "surface": surface})
    random.Random(draw(st.integers(0, 2 ** 16))).shuffle(rows)
    return events, rows


@settings(max_examples=60, deadline=None)
@given(data=logs())
def test_feedviews_match_the_slow_twin(data: tuple[list[tuple[int, int, int, str]], list[dict[str, Any]]]) -> None:
    events, rows = data
    with tempfile.TemporaryDirectory() as d:
        ev = Path(d) / "events.csv"
        ev.write_text("user_id,item_id,timestamp,action\n" + "".join(f"{u},{i},{t},{a}\n" for u, i, t, a in events)
                      if events else "user_id,item_id,timestamp,action\n9,0,0,click\n")
        imp = Path(d) / "imp.csv"
        imp.write_text("request_id,user_id,item_id,timestamp,position,action,surface\n" + "".join(
            f"{r['request']},{r['user_id']},{r['item_id']},{r['timestamp']},{r['position']},{r['action']},"
            f"{r['surface']}\n" for r in rows))
        ds = _prepare(ev, imp, actions=ACTIONS)
    ev_rows = [{"user_id": u, "timestamp": t} for u, _, t, _ in events] or [{"user_id": 9, "timestamp": 0}]
    want = impressions_reference(rows, ev_rows, list(ACTIONS))
    got = sorted(ds.feedviews.to_pylist(), key=lambda f: (f["user_id"], f["request_ts"], f["request_seq"],
                                                          f["item_ids"], f["labels"]))
    assert got == want
    assert ds.info.surfaces[:1] == ["default"] and set(ds.info.surfaces[1:]) <= {"home", "search"}


H = "request_id,user_id,item_id,timestamp,position,action\n"


@pytest.mark.parametrize("body, line, field, words", [
    (H + "r1,u1,a,1997-12-04,1,click\nr1,u1,b,1997-13-04,2,\n", 3, "timestamp", "not an ISO 8601 timestamp"),
    (H + "r1,u1,a,100,1,click\nr1,u1,b,100,second,\n", 3, "position", "not an integer: 'second'"),
    (H + "r1,u1,a,100,1,click\nr1,u1,b,100,2,share\n", 3, "action", "'share' is not in the action vocabulary"),
    (H + "r1,u1,a,100,1,click\nr1,u1,b,100,2,click||like\n", 3, "action", "empty action name"),
    (H + "r1,u1,a,100,1,click\nr2,u1,b,100,1,\nr1,u2,b,100,2,\n", 4, "user_id", "request 'r1' has user_id 'u2'"),
    (H + "r1,u1,a,100,1,click\nr1,u1,b,101,2,\n", 3, "timestamp", "'101' here but '100' on line 2"),
    (H + "r1,u1,a,100,1,click\nr1,u1,b,100,1,\n", 3, "position", "one item per position"),
    ("request_id,user_id,item_id,timestamp,action\nr1,u1,a,100,click\n", 1, "position", "header lacks column"),
    (H.replace("request_id", "req") + "r1,u1,a,100,1,click\n", 1, "request_id", "header lacks column"),
    (H + "r1,u1,a,100,1,click\nr1,,b,100,2,\n", 3, "user_id", "empty value"),
])
def test_malformed_rows_name_file_line_and_field(tmp_path: Path, body: str, line: int, field: str,
                                                 words: str) -> None:
    ev, imp = _write(tmp_path, impressions=body)
    with pytest.raises(DataError) as ei:
        _prepare(ev, imp)
    e = ei.value
    assert (e.path, e.line, e.field) == (str(imp), line, field), str(e)
    assert words in str(e) and str(e).startswith(f"{imp}:{line}: field {field!r}: ")


def test_ids_follow_the_events_mapping(tmp_path: Path) -> None:
    # integer ids kept as they are: the impressions' must be integers too (the flag that changes it is named)
    ev, imp = _write(tmp_path, "user_id,item_id,timestamp\n1,10,5\n2,11,6\n",
                     H + "q,1,10,4,0,interact\nq,1,u12,4,1,\n")
    with pytest.raises(DataError) as ei:
        _prepare(ev, imp, columns=ColumnMapping(action=None))  # no action column: every event is 'interact'
    assert (ei.value.line, ei.value.field) == (3, "item_id") and "--map-ids" in str(ei.value)
    # --map-ids: one numbering for both files (impression-only ids after the events')
    ds = _prepare(ev, imp, map_ids=True, columns=ColumnMapping(action=None))
    assert ds.feedviews.to_pylist()[0]["item_ids"] == [0, 2] and ds.info.extra["user_ids"] == ["1", "2"]
    # an items file: a shown item it lacks is an error naming the impressions line, as for events
    (tmp_path / "items.csv").write_text("item_id,title\n10,Ten\n11,Eleven\n")
    ev2, imp2 = _write(tmp_path, "user_id,item_id,timestamp\n1,10,5\n2,11,6\n", H + "q,1,10,4,0,\nq,1,12,4,1,\n")
    with pytest.raises(DataError) as ei:
        _prepare(ev2, imp2, columns=ColumnMapping(action=None))
    assert (ei.value.path, ei.value.line, ei.value.field) == (str(imp2), 3, "item_id")
    assert "item 12 is not in the items file" in str(ei.value)


def test_config_errors_in_cli_words(tmp_path: Path) -> None:
    ev, imp = _write(tmp_path)
    with pytest.raises(ConfigError, match="--impressions needs timestamps.*--time-col"):
        _prepare(ev, imp, columns=ColumnMapping(timestamp=None))
    with pytest.raises(ConfigError, match="--impressions: only the generic dataset"):
        prepare_dataset("movielens-100k", tmp_path, options=IngestOptions(impressions_path=str(imp)))


def test_parquet_impressions_with_null_and_list_actions(tmp_path: Path) -> None:
    ev, _ = _write(tmp_path)
    t = pa.table({"request_id": [1, 1, 2], "user_id": ["u1", "u1", "u2"], "item_id": ["a", "b", "d"],
                  "timestamp": pa.array([100, 100, 250], pa.timestamp("s")), "position": [0, 1, 0],
                  "action": pa.array([None, ["like", "click"], []], pa.list_(pa.string())),
                  "surface": ["home", "home", "search"]})
    pq.write_table(t, tmp_path / "imp.parquet")
    ds = _prepare(ev, tmp_path / "imp.parquet")
    assert [(r["surface"], r["labels"]) for r in ds.feedviews.to_pylist()] == [("home", [0, 3]), ("search", [0])]
    assert ds.info.surfaces == ["default", "home", "search"]
    pq.write_table(t.set_column(4, "position", pa.array([0.0, 1.5, 0.0])), tmp_path / "bad.parquet")
    with pytest.raises(DataError) as ei:
        _prepare(ev, tmp_path / "bad.parquet")
    assert (ei.value.line, ei.value.field) == (2, "position")  # Parquet: the 1-based row


# ----------------------------------------------------------------------------- the slates downstream


def test_the_join_matches_events_to_logged_slates_by_item_and_action(tmp_path: Path) -> None:
    """Logged slates are never cut by position: train keeps the slates before the cut that hold no held-out
    event, whole; eval takes the latest slate holding the target; a valid slate leaves out the test target."""
    from genrec.data.store import TableStore

    events = "user_id,item_id,timestamp,action\n" + "".join(
        f"1,{i},{t},{a}\n" for i, t, a in [(10, 10, "click"), (11, 20, "like"), (12, 30, "click"), (13, 40, "like"),
                                         (14, 50, "click"), (15, 52, "like")])  # loo: valid = 14, test = 15
    slates = {"q1": (5, [(10, "click"), (20, ""), (21, "")]), "q2": (15, [(11, "like"), (22, "")]),
              "q3": (25, [(12, "click"), (13, "like"), (23, "")]),
              "q4": (45, [(14, "click"), (15, "like"), (24, "")]),  # holds the valid and the test target
              "q5": (35, [(15, "like"), (25, "")]),  # before the cut, but holds the test target: not trained on
              "q6": (38, [(14, ""), (26, "")])}  # shows the valid item, not engaged with: holds nothing
    imp = H + "".join(f"{q},1,{i},{t},{p},{a}\n" for q, (t, shown) in slates.items() for p, (i, a) in enumerate(shown))
    store = TableStore(tmp_path / "tables")
    store.write(_prepare(*_write(tmp_path, events, imp)), n_buckets=2)

    def slates_of(role: str) -> list[tuple[int, int, list[int], list[int], int]]:
        (ex,) = BucketJoinReader(store, split=SplitSpec("loo"), role=role, context_len=10,  # type: ignore[arg-type]
                                 feedview_keep_no_interaction=1.0 if role == "train" else None)
        return sorted((f.request_ts, f.request_seq, f.item_ids.tolist(), f.labels.tolist(), f.history_len)
                      for f in ex.feedviews)

    assert slates_of("train") == [(5, 0, [10, 20, 21], [1, 0, 0], 0), (15, 1, [11, 22], [2, 0], 1),
                                  (25, 2, [12, 13, 23], [1, 2, 0], 2), (38, 3, [14, 26], [0, 0], 3)]
    assert slates_of("valid") == [(45, 4, [14, 24], [1, 0], 4)]
    assert slates_of("test") == [(45, 4, [14, 15, 24], [1, 2, 0], 4)]



def _session_logs(tmp_path: Path, *, impression_only: bool, n_users: int = 12, n_events: int = 6,
                  seed: int = 0) -> tuple[Path, Path]:
    """Every event is the engagement of a logged request served 5 s before it, whose slate shows the event's item
    and (``impression_only``) three other items not engaged with."""
    rng = np.random.default_rng(seed)
    ev, imp = ["user_id,item_id,timestamp,action"], [H.strip()]
    for u in range(n_users):
        for k in range(n_events):
            t = 1000 * u + 10 * k + 10
            item, action = int(rng.integers(0, 15)), ["click", "like"][int(rng.integers(0, 2))]
            ev.append(f"u{u},i{item},{t},{action}")
            shown = [item] + [int(x) for x in rng.choice([i for i in range(15) if i != item], 3, replace=False)]
            for pos in rng.permutation(4).tolist():
                if shown[pos] == item or impression_only:
                    imp.append(f"r{u}_{k},u{u},i{shown[pos]},{t - 5},{pos},{action if shown[pos] == item else ''}")
    d = tmp_path / ("with" if impression_only else "without")
    d.mkdir()
    return _write(d, "\n".join(ev) + "\n", "\n".join(imp) + "\n")


def _first_batch(tmp_path: Path, impression_only: bool) -> tuple[Any, Any, Any]:
    from genrec.data.store import TableStore
    from genrec.catalog import ItemCatalog
    from genrec.train.batches import collate, materialise

    ev, imp = _session_logs(tmp_path, impression_only=impression_only)
    ds = _prepare(ev, imp, map_ids=True)
    store = TableStore(tmp_path / ("t-with" if impression_only else "t-without"))
    store.write(ds, n_buckets=2)
    n = store.counts()["items"]
    g = torch.Generator().manual_seed(0)
    cat = ItemCatalog(item_ids=np.arange(n, dtype=np.int64), feats=torch.rand(n, 12, generator=g),
                      codes=torch.randint(0, 8, (n, 3), generator=g))
    recs = list(BucketJoinReader(store, split=SplitSpec("loo"), role="train", context_len=16,
                                 feedview_keep_no_interaction=1.0))
    exs = materialise(recs, cat)
    batch = collate(exs, epoch=0, seed=0, context_len=16, n_actions=2, p_rank=1.0, max_cands=8)
    return store.info(), cat, batch


def test_the_action_loss_sees_the_impression_only_items(tmp_path: Path) -> None:
    """Same events, same requests: with the impression-only rows the slates carry label-0 candidates and the
    ranking (action) loss changes; without them every candidate is an engaged item."""
    from genrec.model.config import ModelConfig
    from genrec.model.genrec_model import GenRecModel
    from genrec.train.objective import JointObjective, ObjectiveConfig

    losses, zero_rows = [], []
    for with_imp in (True, False):
        info, cat, b = _first_batch(tmp_path, with_imp)
        assert b.cand_valid is not None and b.cand_labels is not None and b.cand_valid.any()
        zero_rows.append(int((b.cand_valid & (b.cand_labels.sum(-1) == 0)).sum()))  # label-0 candidates
        torch.manual_seed(0)
        cfg = ModelConfig.from_name("tiny", n_actions=len(info.actions), n_surfaces=len(info.surfaces),
                                    dropout=0.0)
        obj = JointObjective(GenRecModel(cfg), cat, ObjectiveConfig(w_sid=0.0, w_item=0.0),
                             [info.actions.index(a) for a in info.positive_actions])
        torch.manual_seed(1)
        out = obj.training_step(b)
        out["loss"].backward()  # a training step's gradient flows from the slates
        losses.append(float(out["action"].detach()))
    assert zero_rows[0] > 0 and zero_rows[1] == 0
    assert np.isfinite(losses).all() and abs(losses[0] - losses[1]) > 1e-4, losses


def test_ranking_metrics_run_on_impression_slates(tmp_path: Path) -> None:
    """prepare (with impressions) -> features -> SIDs -> 3 training steps -> eval: the held-out slates are the
    logged requests holding the test targets, label-0 items included, so AUC is defined per action."""
    from genrec.recipes import pipeline

    ev, imp = _session_logs(tmp_path, impression_only=True)
    wd = tmp_path / "run"
    pipeline.prepare(wd, "generic", source=ev, n_buckets=2, options=IngestOptions(impressions_path=str(imp)))
    pipeline.build_item_features(wd, content_dim=8, engagement_dim=4)
    pipeline.build_semantic_ids(wd, levels=2)
    pipeline.train_model(wd, "cpu-tiny", ["train.total_steps=3"])
    r = pipeline.evaluate(wd, split="test", write=False, slate_negatives=0)["ranking"]
    assert r["n_slates"] == 12 and r["n_items"] == 48 and r["n_sampled_negatives"] == 0  # 12 users x 4 shown
    assert all(0.0 <= v <= 1.0 for v in r["auc"].values()), r["auc"]  # both classes present for each action
    assert 0 < sum(r["positive_rate"].values()) < 1
    prior = r["prior"]  # the counts floor on the same slates, and its row in the report
    assert set(prior["auc"]) == set(r["auc"]) and all(0.0 <= v <= 1.0 for v in prior["auc"].values())
    from genrec.eval.report import markdown
    assert "| counts: the user's and the item's action shares |" in markdown({"ranking": r})
