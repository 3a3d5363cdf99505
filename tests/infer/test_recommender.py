"""Recommender: L0 (SID beams + ANN) -> L1 ranking on one history encode, checked against slow twins."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from genrec.errors import ConfigError, DataError
from genrec.infer.cases import user_history
from genrec.infer.history import HistoryColumns
from genrec.infer.recommender import Recommender
from genrec.model.genrec_model import ModelBatch
from tests.tiny_run import build_run


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Recommender:
    root = build_run(tmp_path_factory.mktemp("rec"), data_root, seed=0)
    return Recommender.from_checkpoint(root)


HIST = [{"item_id": 1, "action": "like"}, {"item_id": 50, "action": "view"}, {"item_id": 181},
        {"item_id": 100, "action": "dislike"}, {"item_id": 258}]


def _forward_probs(rec: Recommender, history: list, cand_ids: list[int]) -> np.ndarray:
    """Slow twin of L1: full prefill of history + candidates (M-FALCON) through model.forward."""
    parsed = rec.parse_history(history)
    mb = rec.model_batch([parsed])
    rows = torch.from_numpy(rec.catalog.rows(np.asarray(cand_ids)))[None]  # [1, M]
    full = ModelBatch(actions=mb.actions, surfaces=mb.surfaces, lengths=mb.lengths, sid_codes=mb.sid_codes,
                      item_feats=rec.catalog_model.feats[torch.from_numpy(parsed["rows"])][None],
                      cand_feats=rec.catalog_model.feats[rows], cand_sid_codes=rec.codes[rows],
                      cand_surface=torch.tensor([int(parsed["surfaces"][-1])]), timestamps=mb.timestamps)
    with torch.no_grad():
        out = rec.model(full, serving_layout=True)
    return torch.sigmoid(out.cand_action_logits[0].float()).numpy()  # [M, C]


def test_l1_equals_full_prefill_forward(rec: Recommender) -> None:
    recs = rec.recommend(HIST, k=40, beam_width=16, overretrieve=3)
    assert len(recs) > 10
    ids = [r.item_id for r in recs]
    got = np.array([[r.action_probs[a] for a in rec.actions] for r in recs])
    want = _forward_probs(rec, HIST, ids)
    np.testing.assert_allclose(got, want, atol=1e-5)
    u = np.array([rec.default_utility()[a] for a in rec.actions])
    np.testing.assert_allclose([r.score for r in recs], want @ u, atol=1e-5)
    assert [r.score for r in recs] == sorted((r.score for r in recs), reverse=True)


def test_scores_independent_of_other_candidates(rec: Recommender) -> None:
    both = {r.item_id: r for r in rec.recommend(HIST, k=60, beam_width=20)}
    ann = {r.item_id: r for r in rec.recommend(HIST, k=60, sources=("ann",))}
    sid = {r.item_id: r for r in rec.recommend(HIST, k=60, beam_width=20, sources=("sid",))}
    shared = set(both) & (set(ann) | set(sid))
    assert len(shared) >= 20
    for i in shared:
        other = ann.get(i) or sid[i]
        assert abs(both[i].score - other.score) < 1e-5
    # and directly: a random candidate set scored alone vs embedded in a bigger random set
    parsed = rec.parse_history(HIST)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        cache, _ = rec.encode(rec.model_batch([parsed]))
        small = torch.randint(0, len(rec.catalog), (1, 7), generator=g)
        big = torch.cat([torch.randint(0, len(rec.catalog), (1, 30), generator=g), small], 1)[:, torch.randperm(37, generator=g)]
        a = rec.score_candidates(cache, small)
        b = rec.score_candidates(cache, big)
    for j, r in enumerate(small[0].tolist()):
        pos = (big[0] == r).nonzero()[0, 0]
        torch.testing.assert_close(a[0, j], b[0, pos], atol=1e-5, rtol=0)


def test_ann_only_equals_brute_force(rec: Recommender) -> None:
    for hist in (HIST, [7, 8, 9], [int(i) for i in rec.catalog.item_ids[200:230]]):
        recs = rec.recommend(hist, k=15, sources=("ann",), rank=False)
        with torch.no_grad():
            _, user = rec.encode(rec.model_batch([rec.parse_history(hist)]))
        s = (rec.item_vecs @ user[0]).numpy()  # [N]
        want = rec.catalog.item_ids[np.argsort(-s, kind="stable")[:15]]
        assert [r.item_id for r in recs] == want.tolist()
        np.testing.assert_allclose([r.score for r in recs], np.sort(s)[::-1][:15], atol=1e-5)
        assert all(r.sources == ("ann",) for r in recs)


def test_sid_only_results_are_valid_items_in_beam_order(rec: Recommender) -> None:
    recs = rec.recommend(HIST, k=12, beam_width=12, sources=("sid",), rank=False)
    assert len(recs) == 12
    codes = rec.sid_index.codes_of([r.item_id for r in recs])
    assert [tuple(c) for c in codes.tolist()] == [r.sid for r in recs]
    lp = [r.sid_logprob for r in recs]
    assert lp == sorted(lp, reverse=True)  # lambda = 0: beam order = descending log-prob
    # with diversity the results are still real items
    div = rec.recommend(HIST, k=12, beam_width=12, diversity_lambda=2.0, sources=("sid",), rank=False)
    assert rec.sid_index.contains([r.item_id for r in div]).all()
    firsts_plain = {r.sid[0] for r in recs}
    firsts_div = {r.sid[0] for r in div}
    assert len(firsts_div) >= len(firsts_plain)


def test_batch_equals_single_and_padding(rec: Recommender) -> None:
    h2 = [3, 4]
    single = [rec.recommend(h, k=8) for h in (HIST, h2)]
    batch = rec.recommend([HIST, h2], k=8)
    for s, b in zip(single, batch):
        assert [r.item_id for r in s] == [r.item_id for r in b]
        np.testing.assert_allclose([r.score for r in s], [r.score for r in b], atol=1e-5)


def test_unknown_dropped_empty_rejected_long_truncated(rec: Recommender) -> None:
    recs = rec.recommend([*HIST, {"item_id": 10 ** 12}, 999999], k=5)
    assert recs.dropped_items == [10 ** 12, 999999]
    assert recs.history_used == len(HIST)
    assert set(recs.timings_ms) >= {"encode", "sid", "ann", "rank", "total"}
    with pytest.raises(DataError, match="empty history"):
        rec.recommend([], k=5)
    with pytest.raises(DataError, match="none of the 1 history"):
        rec.recommend([10 ** 12], k=5)
    with pytest.raises(DataError, match=r"history\[1\].action"):
        rec.recommend([1, {"item_id": 2, "action": "teleport"}], k=5)
    with pytest.raises(ConfigError, match="sources"):
        rec.recommend(HIST, sources=("bm25",))
    long = [int(i) for i in rec.catalog.item_ids[:40]]
    a = rec.recommend(long, k=6)
    assert a.history_used == rec.context_len and a.history_truncated == 40 - rec.context_len
    b = rec.recommend(long[-rec.context_len:], k=6)
    c = rec.recommend(long[:rec.context_len], k=6)
    assert [r.item_id for r in a] == [r.item_id for r in b]
    np.testing.assert_allclose([r.score for r in a], [r.score for r in b], atol=1e-6)
    assert not np.allclose([r.score for r in a], [r.score for r in c], atol=1e-6)  # the oldest items differ
    np.testing.assert_array_equal(rec.parse_history(long)["rows"], rec.catalog.rows(np.array(long[-rec.context_len:])))


def test_exclude_history_and_utility(rec: Recommender) -> None:
    hist_ids = {h["item_id"] for h in HIST}
    recs = rec.recommend(HIST, k=20, exclude_history=True)
    assert len(recs) == 20 and not ({r.item_id for r in recs} & hist_ids)
    dis = rec.recommend(HIST, k=10, utility={"dislike": 1.0})
    for r in dis:
        assert abs(r.score - r.action_probs["dislike"]) < 1e-6
    with pytest.raises(ConfigError, match="unknown action"):
        rec.recommend(HIST, utility={"purchase": 1.0})


def test_utility_vectors_are_kept_per_utility(rec: Recommender) -> None:
    """One tensor per distinct utility (a request does not copy it to the device again), each with its weights
    in the actions' order, whatever order the utility names them in."""
    a, b = rec.actions[0], rec.actions[-1]
    first = rec.utility_vector({a: 2.0, b: 0.5})
    assert rec.utility_vector({b: 0.5, a: 2.0}) is first
    want = [2.0 if x == a else 0.5 if x == b else 0.0 for x in rec.actions]
    assert first.tolist() == want
    other = rec.utility_vector({a: 3.0})
    assert other is not first and other.tolist() == [3.0 if x == a else 0.0 for x in rec.actions]
    assert rec.utility_vector(None).tolist() == [rec.default_utility().get(x, 0.0) for x in rec.actions]
    for i in range(70):  # at most 64 kept: the memo starts again, answers unchanged
        assert rec.utility_vector({a: float(i)})[rec.actions.index(a)] == float(i)
    assert len(rec._utility_vectors) <= 64


def test_exclude_history_drops_the_whole_history_not_only_the_context(rec: Recommender) -> None:
    """Issue 38: MovieLens user 1 rated 272 movies, the model reads the newest 12: "unseen only" (library
    and `genrec recommend --user 1 --exclude-history`) returns k items none of which the user rated, on
    every stage mix (SID alone: the beams widen past the excluded items)."""
    import json

    from typer.testing import CliRunner

    from genrec.cli import app

    root = rec.checkpoint.parents[1]
    h = user_history(root, 1)
    seen = {e["item_id"] for e in h}
    assert len(seen) > 10 * rec.context_len
    for kw in ({}, {"sources": ("ann",), "rank": False}, {"sources": ("sid",), "rank": False, "beam_width": 8},
               {"sources": ("sid",), "rank": True, "beam_width": 8}):
        recs = rec.recommend(h, k=10, exclude_history=True, **kw)
        got = {r.item_id for r in recs}
        assert len(recs) == 10 and not got & seen, (kw, sorted(got & seen))
    both = rec.recommend([h, h[:30]], k=10, exclude_history=True)  # a batch: each row its own history
    assert not {r.item_id for r in both[0]} & seen
    assert not {r.item_id for r in both[1]} & {e["item_id"] for e in h[:30]}
    r = CliRunner().invoke(app, ["recommend", str(root), "--user", "1", "--exclude-history", "--json"])
    assert r.exit_code == 0, r.output
    items = [x["item_id"] for x in json.loads(r.stdout)["items"]]
    assert len(items) == 10 and not set(items) & seen


def test_ann_cache_reused_and_user_history(rec: Recommender) -> None:
    root = rec.checkpoint.parents[1]  # WORKDIR/checkpoints/step-N
    folders = list((root / "ann").iterdir())
    assert len(folders) == 1 and folders[0].name.startswith(f"step-{rec.step:06d}")
    mtime = (folders[0] / "index.faiss").stat().st_mtime_ns
    again = Recommender.from_checkpoint(root)
    assert (folders[0] / "index.faiss").stat().st_mtime_ns == mtime
    assert [r.item_id for r in again.recommend(HIST, k=5)] == [r.item_id for r in rec.recommend(HIST, k=5)]
    h = user_history(root, 1)
    assert len(h) > 20 and all(set(e) == {"item_id", "action", "surface", "ts"} for e in h)
    assert [e["ts"] for e in h] == sorted(e["ts"] for e in h)
    with pytest.raises(DataError, match="no events"):
        user_history(root, 10 ** 9)


def _item_strategy():  # type: ignore[no-untyped-def]
    from hypothesis import strategies as st

    ids = st.one_of(st.integers(-3, 1700), st.integers(1, 30).map(str), st.floats(1, 30), st.just(None), st.booleans())
    vocab = st.one_of(st.none(), st.sampled_from(["like", "view", "dislike", "click", "", "LIKE"]),
                      st.integers(-1, 4), st.booleans(), st.floats(0, 2))
    ts = st.one_of(st.none(), st.integers(0, 10 ** 9), st.floats(0, 1e3), st.just("12"))
    as_dict = st.fixed_dictionaries({"item_id": ids}, optional={"action": vocab, "surface": vocab, "ts": ts})
    return st.one_of(as_dict, st.integers(1, 1700), st.fixed_dictionaries({}, optional={"action": vocab}))


def outcome(fn, h):  # noqa: ANN001, ANN201
    """A parse's answer as plain lists, or its DataError as ("error", message, field)."""
    try:
        r = fn(h)
    except DataError as e:
        return ("error", str(e), e.field)
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()}


def test_fast_history_parse_equals_the_reference(rec: Recommender) -> None:
    """Columnar fast path == item-by-item reference on generated histories (well-formed ones,
    mostly-well-formed ones and junk): same arrays, or the same DataError (field and message)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    clean = st.lists(st.one_of(st.integers(1, 1682), st.fixed_dictionaries(
        {"item_id": st.integers(1, 1682)}, optional={"action": st.sampled_from(rec.actions),
                                                      "surface": st.integers(0, len(rec.surfaces) - 1),
                                                      "ts": st.integers(0, 10 ** 9)})), min_size=1, max_size=40)

    vocab = st.one_of(st.none(), st.sampled_from([*rec.actions, *rec.surfaces, "click", ""]),
                      st.integers(-1, max(len(rec.actions), len(rec.surfaces)) + 1), st.booleans())
    near = st.lists(st.fixed_dictionaries({"item_id": st.integers(-2, 1700)},
                                          optional={"action": vocab, "surface": vocab,
                                                    "ts": st.one_of(st.none(), st.integers(0, 99), st.floats(0, 9))}),
                    min_size=1, max_size=6)

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.one_of(clean, near, st.lists(_item_strategy(), min_size=1, max_size=12)))
    def check(h):  # noqa: ANN001, ANN202
        want = outcome(rec.parse_history_reference, h)
        assert outcome(rec.parse_history, h) == want
        # the service's one parse: the same, except that no known item is a cold start (None + the ids)
        got = outcome(lambda x: dict(zip(("parsed", "dropped"), rec.history.read(x))), h)
        if isinstance(want, tuple) and "none of the" in want[1]:
            assert got == {"parsed": None, "dropped": [int(x["item_id"] if isinstance(x, dict) else x) for x in h]}
        elif isinstance(want, tuple):
            assert got == want
        else:
            assert got["dropped"] == want["dropped"]
            assert {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in got["parsed"].items()} == want

    check()
    long = [{"item_id": i % 1682 + 1, "action": rec.actions[i % len(rec.actions)]} for i in range(1000)]
    assert rec.history.columns(long) is not None  # the fast path is really taken for clean input
    assert outcome(rec.parse_history, long) == outcome(rec.parse_history_reference, long)


def _as_columns(h: list) -> "HistoryColumns":
    """Events (dicts or bare ids) -> the same history as columns (a column only where some event has the field)."""
    ev = [x if isinstance(x, dict) else {"item_id": x} for x in h]
    cols = {k: [e.get(k) for e in ev] for k in ("action", "surface", "ts") if any(k in e for e in ev)}
    return HistoryColumns([e["item_id"] for e in ev], **cols)


def test_columns_parse_equals_the_events(rec: Recommender) -> None:
    """A history sent as columns (``history_columns``) parses to exactly what the same events give through the
    item-by-item reference -- rows, actions, surfaces, timestamps, dropped and truncated ids -- or to the same
    DataError, naming the column and index (``history_columns.action[3]``) where the events name the event; the
    columns are also read by the reference (through their events) with the same outcome, and recommend the same."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    def as_column_field(want):  # noqa: ANN001, ANN202 -- history[3].action -> history_columns.action[3]
        if not isinstance(want, tuple):
            return want
        f = want[2]
        if f.startswith("history[") and "]." in f:
            i, name = f[len("history["):].split("].", 1)
            f = f"history_columns.{name}[{i}]"
        else:
            f = f.replace("history", "history_columns", 1)
        return (want[0], want[1].replace(f"field '{want[2]}'", f"field '{f}'"), f)

    vocab = st.one_of(st.none(), st.sampled_from([*rec.actions, *rec.surfaces, "click"]),
                      st.integers(-1, max(len(rec.actions), len(rec.surfaces)) + 1))
    events = st.lists(st.one_of(st.integers(-2, 1700), st.fixed_dictionaries(
        {"item_id": st.integers(-2, 1700)}, optional={"action": vocab, "surface": vocab,
                                                       "ts": st.one_of(st.none(), st.integers(0, 10 ** 9))})),
        min_size=1, max_size=rec.context_len + 6)

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(events)
    def check(h):  # noqa: ANN001, ANN202
        want = as_column_field(outcome(rec.parse_history_reference, h))
        cols = _as_columns(h)
        assert outcome(rec.parse_history, cols) == want
        assert outcome(lambda c: rec.history.parse_reference(c, "history_columns"), cols) == want
        if not isinstance(want, tuple):
            parsed, dropped = rec.history.read(cols)
            assert dropped == want["dropped"] and parsed is not None

    check()
    long = [{"item_id": i % 1682 + 1, "action": rec.actions[i % len(rec.actions)], "ts": i} for i in range(1000)]
    assert rec.history.columns(_as_columns(long)) is not None  # the columnar path is really taken
    assert rec.history.columns(HistoryColumns([1.0, 2.0])) is None  # floats: the reference decides
    got, want = rec.recommend(_as_columns(HIST), k=10), rec.recommend(HIST, k=10)
    assert [r.item_id for r in got] == [r.item_id for r in want]
    assert [[r.item_id for r in x] for x in rec.recommend([_as_columns(HIST), _as_columns(HIST[:2])], k=5)] == \
        [[r.item_id for r in x] for x in rec.recommend([HIST, HIST[:2]], k=5)]
    with pytest.raises(DataError, match="one value per item_id") as e:
        HistoryColumns([1, 2], action=["like"])
    assert e.value.field == "history_columns.action"
    assert _as_columns(HIST)[1:3] == [{"item_id": 50, "action": "view"}, {"item_id": 181}]


def test_retrieval_weight_fuses_the_dense_score(rec: Recommender) -> None:
    """L1 score fusion: score == utility + w * cos(user, candidate vector), checked against the
    full-prefill twin and a brute-force cosine; w = 0 is the action heads alone; bad w refused."""
    with torch.no_grad():
        _, user = rec.encode(rec.model_batch([rec.parse_history(HIST)]))
    u = np.array([rec.default_utility()[a] for a in rec.actions])
    for w in (0.0, 0.7, 50.0):
        recs = rec.recommend(HIST, k=30, beam_width=16, overretrieve=3, retrieval_weight=w)
        ids = [r.item_id for r in recs]
        cos = (rec.item_vecs[torch.from_numpy(rec.catalog.rows(np.array(ids)))] @ user[0]).numpy()
        want = _forward_probs(rec, HIST, ids) @ u + w * cos
        np.testing.assert_allclose([r.score for r in recs], want, atol=1e-4)
        assert [r.score for r in recs] == sorted((r.score for r in recs), reverse=True)
    big = rec.recommend(HIST, k=30, beam_width=16, overretrieve=3, retrieval_weight=1e4)
    cos_big = (rec.item_vecs[torch.from_numpy(rec.catalog.rows(np.array([r.item_id for r in big])))] @ user[0]).numpy()
    assert list(cos_big) == sorted(cos_big, reverse=True)  # a huge weight orders by the dense score
    with pytest.raises(ConfigError, match="retrieval_weight"):
        rec.recommend(HIST, retrieval_weight=-1.0)


def test_sid_weight_fuses_the_beam_log_probability(rec: Recommender) -> None:
    """score == a * utility + w * cos + v * log P(SID) (for candidates the SID stage did not
    retrieve: the request's lowest retrieved beam log-probability), against the full-prefill twin;
    the beam log-probabilities come from an independent beam search; a = 0 drops the heads. Full-code beams
    (``sid_mode="full"``); the dense leaf's twin is the next test."""
    rec.sid_mode = "full"
    try:
        _check_sid_weight_full(rec)
    finally:
        rec.sid_mode = "auto"


def _check_sid_weight_full(rec: Recommender) -> None:
    with torch.no_grad():
        cache, user = rec.encode(rec.model_batch([rec.parse_history(HIST)]))
        beams = rec.decode_sids(cache, 16)
    lp_sid = {tuple(c): float(s) for c, s, ok in zip(beams.codes[0].tolist(), beams.scores[0].tolist(),
                                                     beams.valid[0].tolist()) if ok}
    u = np.array([rec.default_utility()[a] for a in rec.actions])
    for a, w, v in ((1.0, 0.0, 3.0), (1.0, 0.7, 0.4), (0.0, 1.0, 2.0)):
        # k above the L0 union (SID beams + ANN x 3): every candidate comes back, so the floor below is
        # taken over every SID-retrieved candidate, as the recommender takes it
        recs = rec.recommend(HIST, k=1000, beam_width=16, overretrieve=3, retrieval_weight=w, sid_weight=v,
                             action_weight=a)
        ids = [r.item_id for r in recs]
        cos = (rec.item_vecs[torch.from_numpy(rec.catalog.rows(np.array(ids)))] @ user[0]).numpy()
        in_sid = ["sid" in r.sources for r in recs]
        assert any(in_sid) and not all(in_sid)  # both kinds of candidate are checked
        # the floor is over every valid beam the SID stage retrieved, returned or not (k may cut some: the
        # ANN stage over-retrieves 3 x k)
        floor = min(lp_sid.values())
        bonus = np.array([lp_sid[r.sid] if s else floor for r, s in zip(recs, in_sid)])
        want = a * (_forward_probs(rec, HIST, ids) @ u) + w * cos + v * bonus
        np.testing.assert_allclose([r.score for r in recs], want, atol=1e-4)
    with pytest.raises(ConfigError, match="sid_weight"):
        rec.recommend(HIST, sid_weight=float("nan"))
    with pytest.raises(ConfigError, match="action_weight"):
        rec.recommend(HIST, action_weight=-0.5)


def test_sid_weight_fuses_the_dense_leaf_score(rec: Recommender) -> None:
    """The SID stage served by default here ("auto" -> "dense"): a candidate's SID term is its score in that stage
    -- log P(prefix) + log softmax over the prefix's items of user . item / τ -- wherever the stage reaches it
    (under one of its kept prefixes, whether or not the stage's own list kept it), else the lowest score of that
    reach; against the per-item twin (``prefix_lists_reference``) over an independent beam search."""
    import torch.nn.functional as F

    from genrec.decode.beam import beam_search
    from genrec.decode.prefix import prefix_lists_reference
    from genrec.infer.load import trained_temperature

    assert rec.served_sid_mode == "dense"
    trie, ls = rec.trie, rec.trie.n_levels - 1
    with torch.no_grad():
        cache, user = rec.encode(rec.model_batch([rec.parse_history(HIST)]))

        def step(prefix: torch.Tensor) -> torch.Tensor:
            return F.log_softmax(rec.model.sid_logits_next(cache, prefix).float(), dim=-1)

        beams = beam_search(step, 1, ls, trie.codebook_sizes[:ls], 16, trie=trie.cut(ls))
        last = step(beams.codes.clamp_min(0)).numpy()
    leaf_rows = np.asarray(rec.leaf_rows)
    dense = (user.float() @ rec.item_vecs.float().T / trained_temperature(rec.run_config)).numpy()
    r_rows, r_sc = prefix_lists_reference(beams.codes.numpy(), beams.scores.numpy(), beams.valid.numpy(), last,
                                          rec.catalog.codes.numpy()[leaf_rows], leaf_rows,
                                          np.ones(len(leaf_rows), bool), len(rec.catalog), item_scores=dense)
    reach = {int(r): float(x) for r, x in zip(r_rows[0], r_sc[0]) if r >= 0}
    floor = min(reach.values())
    u = np.array([rec.default_utility()[a] for a in rec.actions])
    for a, w, v in ((1.0, 0.0, 3.0), (0.0, 1.0, 2.0)):
        recs = rec.recommend(HIST, k=1000, beam_width=16, overretrieve=3, retrieval_weight=w, sid_weight=v,
                             action_weight=a)
        rows = rec.catalog.rows(np.array([r.item_id for r in recs]))
        in_reach = [int(r) in reach for r in rows]
        assert any(in_reach) and not all(in_reach)  # both kinds of candidate are checked
        cos = (rec.item_vecs[torch.from_numpy(rows)] @ user[0]).numpy()
        bonus = np.array([reach.get(int(r), floor) for r in rows])
        want = a * (_forward_probs(rec, HIST, [r.item_id for r in recs]) @ u) + w * cos + v * bonus
        np.testing.assert_allclose([r.score for r in recs], want, atol=1e-4)
    # rank_items (/v1/rank) on the whole catalogue: the same rule, items the stage reached but would not keep
    # at a small k included
    ids = [int(i) for i in rec.catalog.item_ids]
    got = {r.item_id: r.score for r in rec.rank_items(HIST, ids, beam_width=16, retrieval_weight=1.0,
                                                      sid_weight=2.0, action_weight=0.0)}
    cos = (rec.item_vecs @ user[0]).numpy()
    want_all = cos + 2.0 * np.array([reach.get(r, floor) for r in range(len(ids))])
    np.testing.assert_allclose([got[i] for i in ids], want_all, atol=1e-4)


def test_graph_mode_stages_equal_the_plain_ones(rec: Recommender, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "all" graph mode's encode and ranking paths (bucketed histories and candidates), run
    eagerly on the CPU over the same static buffers, give the plain recommendations."""
    from genrec.infer.load import graph_mode
    from genrec.model.graphs import GraphedEncoder, GraphedRanker

    h2 = [3, 4]
    want = [rec.recommend(h, k=8, beam_width=8) for h in (HIST, h2)] + [rec.recommend([HIST, h2], k=8, beam_width=8)]
    enc = GraphedEncoder(rec.model, min_bucket=4, use_graph=False)
    rnk = GraphedRanker(rec.model, min_bucket=4, min_cand_bucket=4, use_graph=False)
    monkeypatch.setattr(rec, "_graphed_encode", enc)
    monkeypatch.setattr(rec, "_graphed_rank", rnk)
    got = [rec.recommend(h, k=8, beam_width=8) for h in (HIST, h2)] + [rec.recommend([HIST, h2], k=8, beam_width=8)]
    assert enc.captures >= 2 and rnk.captures >= 1  # the static-shape paths really ran
    for w, g in zip(want[:2] + want[2], got[:2] + got[2]):  # type: ignore[operator]
        assert [r.item_id for r in w] == [r.item_id for r in g]
        np.testing.assert_allclose([r.score for r in w], [r.score for r in g], atol=1e-5)
    assert graph_mode(torch.device("cpu")) == "off"
    monkeypatch.delenv("GENREC_CUDA_GRAPHS", raising=False)
    assert graph_mode(torch.device("cuda")) == "all"  # the default on a GPU
    for raw, mode in (("1", "all"), ("0", "off"), ("all", "all"), ("SID", "sid")):
        monkeypatch.setenv("GENREC_CUDA_GRAPHS", raw)
        assert graph_mode(torch.device("cuda")) == mode
    monkeypatch.setenv("GENREC_CUDA_GRAPHS", "sometimes")
    with pytest.raises(ConfigError, match="GENREC_CUDA_GRAPHS"):
        graph_mode(torch.device("cuda"))


def test_warmup_runs_one_request_per_history_bucket(rec: Recommender, monkeypatch: pytest.MonkeyPatch) -> None:
    assert rec.warmup() == []  # CPU: nothing is graphed, nothing to capture
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(rec, "cuda_graphs", "sid")
    monkeypatch.setattr(rec, "context_len", 300)
    monkeypatch.setattr(rec, "recommend", lambda h, **kw: seen.append((len(h), len(h[0]))))  # (batch, history)
    assert rec.warmup() == [64, 128, 256, 300] and seen == [(1, 64), (1, 128), (1, 256), (1, 300)]
    monkeypatch.undo()
    monkeypatch.setattr(rec, "cuda_graphs", "sid")  # the real requests (eager here), every stage
    assert rec.warmup(min_bucket=4) == [4, 8, rec.context_len]


def test_a_damaged_checkpoint_names_its_file_and_the_runs_other_checkpoints(rec: Recommender) -> None:
    """Serving never falls back to other weights by itself: a damaged file is an error that names it, and the
    run's other complete checkpoints one could pass instead (here: a copy of the served one, as step 1)."""
    import shutil

    from genrec.train.checkpoint import CheckpointError

    ckpt = rec.checkpoint
    root = ckpt.parent.parent
    weights = ckpt / "model.safetensors"
    keep = weights.read_bytes()
    other = ckpt.parent / "step-000001"
    shutil.copytree(ckpt, other)
    try:
        weights.write_bytes(keep[: len(keep) // 3])
        with pytest.raises(CheckpointError) as e:
            Recommender.from_checkpoint(root)
        msg = str(e.value)
        assert str(weights) in msg and "step-000001" in msg and f"--checkpoint {other}" in msg
        assert Recommender.from_checkpoint(root, str(other)).step == rec.step  # the named one serves
        shutil.rmtree(other)
        with pytest.raises(CheckpointError, match="no other checkpoint"):
            Recommender.from_checkpoint(root)
    finally:
        weights.write_bytes(keep)
        shutil.rmtree(other, ignore_errors=True)


def test_a_checkpoint_copied_without_its_training_state_serves(rec: Recommender, tmp_path: Path) -> None:
    """Serving reads the weights and extra.json only: a folder copied without the optimizer / RNG state loads and
    answers as the full one; resuming training from it names the missing file."""
    import shutil

    from genrec.model.checkpoint_io import CheckpointError
    from genrec.train.checkpoint import load_checkpoint

    served = tmp_path / Path(rec.checkpoint).name
    shutil.copytree(rec.checkpoint, served, ignore=shutil.ignore_patterns("state.*"))
    assert not list(served.glob("state.*")) and (served / "model.safetensors").exists()
    light = Recommender.from_checkpoint(rec.workdir, str(served))
    want = rec.recommend(HIST, k=20, beam_width=16)
    got = light.recommend(HIST, k=20, beam_width=16)
    assert [r.item_id for r in got] == [r.item_id for r in want]
    np.testing.assert_allclose([r.score for r in got], [r.score for r in want], atol=1e-6)
    with pytest.raises(CheckpointError, match=r"state\.safetensors is missing.*resuming training"):
        load_checkpoint(served, light.model)


def test_the_ann_stage_searched_on_the_device_gives_the_same_answers(rec: Recommender) -> None:
    """The funnel with the ANN index's search on the model's device (as a GPU server runs it) answers as with faiss:
    the same items, sources and scores, ANN-only and the whole funnel, one request and a batch."""
    from genrec.infer.ann import DeviceFlatSearch

    hists = [HIST, [3, 4], [int(i) for i in rec.catalog.item_ids[200:230]]]
    assert rec.ann is not None and not isinstance(rec.ann, DeviceFlatSearch)  # CPU: faiss by default
    calls = [dict(k=15, sources=("ann",), rank=False), dict(k=20, beam_width=12)]
    want = [rec.recommend(hists, **kw) for kw in calls]
    faiss_index = rec.ann
    rec.ann = DeviceFlatSearch(faiss_index, rec.device)
    try:
        got = [rec.recommend(hists, **kw) for kw in calls]
    finally:
        rec.ann = faiss_index
    for g_call, w_call in zip(got, want):
        for g, w in zip(g_call, w_call):
            assert [(r.item_id, r.sources) for r in g] == [(r.item_id, r.sources) for r in w]
            np.testing.assert_allclose([r.score for r in g], [r.score for r in w], atol=1e-5)
