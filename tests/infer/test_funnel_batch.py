"""The batched funnel: its array steps against item-by-item twins on fresh random inputs, and a batch of
requests through the real engine against the same requests one at a time (CPU; GPU with the ``gpu`` mark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from genrec.decode.rows import first_seen
from genrec.infer.funnel import Candidates, Retrieved, _sid_lp_matrix, merged_order, top_k, union
from genrec.infer.profile import profiling, stage
from genrec.serve.engine import Engine
from tests.tiny_run import build_run

# ---------------------------------------------------------------- item-by-item twins (the code the arrays replaced)


def _union_ref(got: Retrieved, b: int, n: int, exclude_rows: Any) -> list[dict[int, list[Any]]]:
    """Per request: row -> [src bits, sid lp, ann score, ANN column, merged position], in union order."""
    out = []
    for i in range(b):
        excl = set() if exclude_rows is None else {int(x) for x in exclude_rows[i]}
        d: dict[int, list[Any]] = {}
        lists = []
        for rows_i, sc_i, bit in ((got.sid_rows[i], got.sid_lp[i], 1), (got.ann_rows[i], got.ann_score[i], 2)):
            kept, seen = [], set()
            for j, (r, s) in enumerate(zip(rows_i, sc_i)):
                if r >= 0 and int(r) not in excl and int(r) not in seen:
                    seen.add(int(r))
                    kept.append((int(r), float(s), j))
            lists.append((kept[:n], bit))
        order: list[int] = []
        for j in range(max(len(k) for k, _ in lists)):
            for kept, _ in lists:
                if j < len(kept) and kept[j][0] not in order:
                    order.append(kept[j][0])
        for kept, bit in lists:
            for r, s, j in kept:
                e = d.setdefault(r, [0, np.nan, np.nan, -1, 0])
                e[0] |= bit
                if bit == 1:
                    e[1] = s
                else:
                    e[2], e[3] = s, j
        for pos, r in enumerate(order):
            d[r][4] = pos
        if got.trans_rows is not None:  # the transition source: appended after, in successor order
            kept_t: list[int] = []
            for r in got.trans_rows[i]:
                if r >= 0 and int(r) not in excl and int(r) not in kept_t:
                    kept_t.append(int(r))
            for r in kept_t[:n]:
                if r in d:
                    d[r][0] |= 4
                else:
                    d[r] = [4, np.nan, np.nan, -1, len(d)]
        out.append(d)
    return out


def _random_retrieved(rng: np.random.Generator, b: int, n_items: int) -> tuple[Retrieved, list[np.ndarray] | None]:
    ws, wa = int(rng.integers(0, 12)), int(rng.integers(0, 12))
    sid_rows = np.full((b, ws), -1, np.int64)
    for i in range(b):  # beam rows are distinct per request, then -1 pad
        m = int(rng.integers(0, min(ws, n_items) + 1))
        sid_rows[i, :m] = rng.choice(n_items, m, replace=False)
    ann_rows = rng.integers(-1, n_items, (b, wa))  # -1: an id the catalogue lacks, anywhere in the list
    ann_rows[rng.random((b, wa)) < 0.2] = -1
    sid_lp = np.where(sid_rows >= 0, -rng.random((b, ws)) * 5, np.nan).astype(np.float32)
    ann_score = rng.normal(size=(b, wa)).astype(np.float32)
    excl = None
    if rng.random() < 0.6:
        excl = [rng.choice(n_items, int(rng.integers(0, min(6, n_items))), replace=False).astype(np.int64) for _ in range(b)]
    trans_rows = None
    if rng.random() < 0.5:  # the last item's successors: distinct rows, then -1 pad
        wt = int(rng.integers(0, 10))
        trans_rows = np.full((b, wt), -1, np.int64)
        for i in range(b):
            m = int(rng.integers(0, min(wt, n_items) + 1))
            trans_rows[i, :m] = rng.choice(n_items, m, replace=False)
    return Retrieved(None, sid_rows, sid_lp, ann_rows, ann_score, None, trans_rows=trans_rows), excl


@pytest.mark.parametrize("seed", range(40))
def test_union_merge_and_top_k_equal_their_item_by_item_twins(seed: int) -> None:
    rng = np.random.default_rng(seed)
    b, n_items = int(rng.integers(1, 6)), int(rng.integers(3, 25))
    got, excl = _random_retrieved(rng, b, n_items)
    n = int(rng.integers(1, 8))
    c = union(got, b, n, excl)
    ref = _union_ref(got, b, n, excl)
    assert c.rows.shape[1] == max(1, max(len(d) for d in ref))
    for i, d in enumerate(ref):
        m = len(d)
        assert c.valid[i].tolist() == [True] * m + [False] * (c.width - m)
        assert c.rows[i, :m].tolist() == list(d)
        ents = list(d.values())
        assert c.src[i, :m].tolist() == [e[0] for e in ents]
        np.testing.assert_array_equal(c.sid_lp[i, :m], np.asarray([e[1] for e in ents], np.float32))
        np.testing.assert_array_equal(c.ann_score[i, :m], np.asarray([e[2] for e in ents], np.float32))
        assert c.ann_at[i, :m].tolist() == [e[3] for e in ents]
        assert c.merged[i, :m].tolist() == [e[4] for e in ents]
        # the SID term's floor: the lowest retrieved log-probability of the request (0 if none)
        lps = [e[1] for e in ents if not np.isnan(e[1])]
        want = np.asarray([(min(lps) if lps else 0.0) if np.isnan(e[1]) else e[1] for e in ents], np.float32)
        np.testing.assert_array_equal(_sid_lp_matrix(c)[i, :m], want)
    srcs = [s for s, w in (("sid", got.sid_rows.shape[1]), ("ann", got.ann_rows.shape[1])) if w] or ["sid"]
    score = merged_order(c, tuple(srcs))
    for i, d in enumerate(ref):
        for j, e in enumerate(d.values()):
            want = e[1] if srcs == ["sid"] else e[2] if srcs == ["ann"] else 1.0 / (1.0 + e[4])
            np.testing.assert_array_equal(score[i, j], want)
    # top K by a score with ties, -inf and a nan among the valid candidates
    score = np.round(rng.normal(size=c.rows.shape), 1).astype(np.float32)
    score[rng.random(score.shape) < 0.1] = -np.inf
    score[rng.random(score.shape) < 0.05] = np.nan
    probs = rng.random((*c.rows.shape, 3))
    k = int(rng.integers(1, 10))
    out = top_k(c, score, probs, k, None)
    for i, d in enumerate(ref):
        ents = list(d.values())
        masked = np.where(c.valid[i], score[i], -np.inf)
        top = [j for j in np.argsort(-masked, kind="stable")[:min(k, c.width)] if c.valid[i, j]]
        t = len(top)
        assert out.rows[i, :t].tolist() == [list(d)[j] for j in top] and (out.rows[i, t:] == -1).all()
        np.testing.assert_array_equal(out.scores[i, :t], score[i, top])
        assert out.src[i, :t].tolist() == [ents[j][0] for j in top]
        np.testing.assert_array_equal(out.sid_lp[i, :t], [ents[j][1] for j in top])
        np.testing.assert_array_equal(out.ann_score[i, :t], [ents[j][2] for j in top])
        np.testing.assert_array_equal(out.probs[i, :t], probs[i, top])  # type: ignore[index]


@pytest.mark.parametrize("seed", range(20))
def test_first_seen_equals_a_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(-2, 6, (int(rng.integers(1, 5)), int(rng.integers(0, 15))))
    want = np.zeros(a.shape, bool)
    for i in range(a.shape[0]):
        seen: set[int] = set()
        for j in range(a.shape[1]):
            if a[i, j] >= 0 and a[i, j] not in seen:
                seen.add(int(a[i, j]))
                want[i, j] = True
    np.testing.assert_array_equal(first_seen(a), want)


def test_candidates_hold_no_per_request_python_objects() -> None:
    got, excl = _random_retrieved(np.random.default_rng(0), 4, 20)
    c = union(got, 4, 5, excl)
    assert isinstance(c, Candidates)
    assert all(isinstance(getattr(c, f), np.ndarray) and getattr(c, f).dtype != object
               for f in ("rows", "valid", "src", "sid_lp", "ann_score", "ann_at", "merged"))


# ---------------------------------------------------------------- the real engine: a batch == one at a time


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    return build_run(tmp_path_factory.mktemp("funnel-batch"), data_root, seed=2)


def _requests(eng: Engine, seed: int, b: int) -> list[list[dict[str, Any]]]:
    """``b`` fresh random histories of different lengths (some longer than the context, some with unknown ids,
    some with actions)."""
    rng = np.random.default_rng(seed)
    ids = eng.rec.catalog.item_ids
    acts = eng.rec.actions
    out = []
    for _ in range(b):
        n = int(rng.integers(1, 3 * eng.context_len))
        h: list[dict[str, Any]] = [{"item_id": int(x)} for x in rng.choice(ids, n)]
        if rng.random() < 0.5:
            for e in h:
                e["action"] = acts[int(rng.integers(len(acts)))]
        if rng.random() < 0.3:
            h.insert(int(rng.integers(len(h) + 1)), {"item_id": 10 ** 12})
        out.append(h)
    return out


def _assert_same(one: dict[str, Any], many: dict[str, Any], atol: float) -> None:
    a, b = one["items"], many["items"]
    assert len(a) == len(b)
    np.testing.assert_allclose([x["score"] for x in a], [x["score"] for x in b], rtol=0, atol=atol)
    sa, sb = [x["score"] for x in a], [x["score"] for x in b]
    for j, (x, y) in enumerate(zip(a, b)):
        near = [sa[j2] for j2 in range(len(sa)) if abs(sa[j2] - sa[j]) <= 2 * atol]
        if len(near) == 1:  # items are compared where the score has no near tie (exact on the CPU)
            assert x["item_id"] == y["item_id"]
            assert x["sources"] == y["sources"] and x["sid"] == y["sid"]
            if x["action_probs"] is not None:
                np.testing.assert_allclose(list(x["action_probs"].values()), list(y["action_probs"].values()),
                                           rtol=0, atol=atol)
    assert sorted(x["item_id"] for x in a) == sorted(x["item_id"] for x in b) or atol > 0
    assert one["dropped_items"] == many["dropped_items"] and one["truncated_items"] == many["truncated_items"]


def _check_engine(eng: Engine, atol: float, seed0: int) -> None:
    cases = [dict(sources=["sid", "ann"], rank=True), dict(sources=["sid", "ann"], rank=False),
             dict(sources=["sid"], rank=True), dict(sources=["ann"], rank=False),
             dict(sources=["sid", "ann"], rank=True, exclude_history=True),
             dict(sources=["sid", "ann"], rank=True, fusion={"retrieval_weight": 0.5, "sid_weight": 0.3})]
    for c, kw in enumerate(cases):
        for b in (3, 8):
            hs = _requests(eng, seed0 + 10 * c + b, b)
            hs.append([{"item_id": 10 ** 12}])  # a cold start inside the batch
            args: dict[str, Any] = dict(k=7, beam_width=12, diversity_lambda=0.0, **kw)
            many = eng.recommend_many(hs, **args)
            for h, m in zip(hs, many):
                _assert_same(eng.recommend(h, **args), m, atol)
            assert many[-1]["cold_start"]


def test_engine_batch_equals_one_at_a_time(run: Path) -> None:
    _check_engine(Engine.load(run), 1e-5, 0)


@pytest.mark.gpu
def test_engine_batch_equals_one_at_a_time_gpu(run: Path) -> None:
    # CUDA graphs (the default): a batch pads to its own bucket of history slots and beam shapes
    _check_engine(Engine.load(run, device="cuda"), 2e-3, 100)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_the_gpu_engine_searches_ann_on_the_device_with_faiss_answers(run: Path, precision: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the flat index's search runs on the GPU by default (infer.ann.device_search), answering as the
    faiss search it replaces ($GENREC_ANN_SEARCH=faiss), ANN alone and through the funnel, in either precision
    (bf16: the model under autocast, the search still float32)."""
    from genrec.infer.ann import AnnIndex, DeviceFlatSearch

    monkeypatch.setenv("GENREC_PRECISION", precision)
    monkeypatch.delenv("GENREC_ANN_SEARCH", raising=False)
    dev = Engine.load(run, device="cuda")
    monkeypatch.setenv("GENREC_ANN_SEARCH", "faiss")
    host = Engine.load(run, device="cuda")
    assert isinstance(dev.rec.ann, DeviceFlatSearch) and isinstance(host.rec.ann, AnnIndex)
    for kw in (dict(sources=["ann"], rank=False), dict(sources=["sid", "ann"], rank=True)):
        hs = _requests(dev, 7, 8)
        args: dict[str, Any] = dict(k=7, beam_width=12, diversity_lambda=0.0, **kw)
        for a, b in zip(dev.recommend_many(hs, **args), host.recommend_many(hs, **args)):
            _assert_same(a, b, 1e-4)


def test_profiling_collects_the_stages_and_changes_nothing(run: Path) -> None:
    eng = Engine.load(run)
    hs = _requests(eng, 7, 4)
    args: dict[str, Any] = dict(k=5, beam_width=8, diversity_lambda=0.0, sources=["sid", "ann"], rank=True)
    plain = eng.recommend_many(hs, **args)
    with profiling("cpu") as prof:
        with stage("outer"):
            profiled = eng.recommend_many(hs, **args)
    for a, b in zip(plain, profiled):
        assert [x["item_id"] for x in a["items"]] == [x["item_id"] for x in b["items"]]
        assert a["timings_ms"].keys() == b["timings_ms"].keys()
    sid = ["sid", "sid.beams", "sid.rows"] if eng.rec.served_sid_mode == "full" else ["sid"]  # dense: one step
    want = ["outer", "parse", "tensors", "encode", *sid, "ann", "union", "rank",
            "rank.gather", "rank.decode", "rank.fuse", "topk", "results", "format"]
    assert list(prof.host) == want
    assert prof.depth["outer"] == 0 and prof.depth["encode"] == 1 and prof.depth["rank.decode"] == 2
    assert all(v >= 0 for v in prof.host.values()) and prof.host["outer"] >= prof.host["encode"]
    assert prof.device() == {}  # no CUDA events on the CPU
    t: dict[str, float] = {}
    with stage("x", t):  # outside profiling(): only the timing dict
        pass
    assert list(t) == ["x"] and list(prof.host) == want


@pytest.mark.gpu
def test_profiling_records_device_time_on_cuda() -> None:
    x = torch.randn(512, 512, device="cuda")
    with profiling("cuda", sync=True) as prof:
        with stage("mm"):
            for _ in range(20):
                x = x @ x / 512
    assert prof.device()["mm"] > 0


@pytest.mark.parametrize("seed", range(12))
def test_in_history_equals_a_set_lookup(seed: int) -> None:
    """The L1 history term's indicator against a per-request set: 1 where a candidate row (>= 0) is in that
    request's history, whatever the histories' lengths (empty included) and repeats."""
    from genrec.infer.funnel import in_history

    rng = np.random.default_rng(seed)
    b, n = int(rng.integers(1, 6)), int(rng.integers(2, 30))
    rows = rng.integers(-1, n, (b, int(rng.integers(0, 9))))
    hist = [rng.integers(0, n, int(rng.integers(0, 12))) for _ in range(b)]
    got = in_history(rows, hist)
    assert got.dtype == np.float32 and got.shape == rows.shape
    want = [[float(r >= 0 and int(r) in set(h.tolist())) for r in row] for row, h in zip(rows, hist)]
    np.testing.assert_array_equal(got, np.asarray(want, np.float32).reshape(rows.shape))


def test_the_answers_lists_are_built_after_the_model_lock(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Engine.run_many`` holds the model lock for the model's part only: the answers' lists (host work) are built
    once it is let go, so the next batch can take the model meanwhile; what they hold is unchanged."""
    import genrec.infer.calls as calls

    eng = Engine.load(run)
    args: dict[str, Any] = dict(k=5, beam_width=8, diversity_lambda=0.0, sources=["sid", "ann"], rank=True)
    hists = _requests(eng, 31, 3)
    want = eng.recommend_many(hists, **args)
    held: list[bool] = []
    build = calls.recommendation_lists

    def spy(*a: Any, **kw: Any) -> Any:
        held.append(eng._model.locked())
        return build(*a, **kw)

    monkeypatch.setattr(calls, "recommendation_lists", spy)
    got = eng.recommend_many(hists, **args)
    assert held == [False]
    for w, g in zip(want, got, strict=True):
        assert [x["item_id"] for x in w["items"]] == [x["item_id"] for x in g["items"]]
        assert [x["score"] for x in w["items"]] == [x["score"] for x in g["items"]]
