"""The funnel on the device (:mod:`genrec.infer.device_funnel`) against the host path it replaces
(:mod:`genrec.infer.funnel`), the rule: each step on fresh random lists, and whole batches through the real engine
(CPU here; the GPU with the ``gpu`` mark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import genrec.infer.funnel as funnel
from genrec.decode.rows import first_seen
from genrec.errors import ConfigError
from genrec.infer.ann import DeviceFlatSearch
from genrec.infer.device_funnel import (
    AUTO_MIN_ROWS, DeviceTransitions, TCandidates, first_seen_t, merged_order_t, padded_rows, sid_lp_t, top_k_t, union_t, unpack,
    wanted)
from genrec.infer.transitions import TransitionTable
from genrec.infer.funnel import Retrieved, _sid_lp_matrix, merged_order, top_k, union
from genrec.serve.engine import Engine
from tests.infer.test_funnel_batch import _random_retrieved
from tests.tiny_run import build_run


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def _union_pair(seed: int) -> tuple[Any, TCandidates, np.random.Generator, Retrieved]:
    """The host union and the device one of the same random lists (with excluded rows, a transition source or
    neither)."""
    rng = np.random.default_rng(seed)
    b, n_items = int(rng.integers(1, 6)), int(rng.integers(3, 25))
    got, excl = _random_retrieved(rng, b, n_items)  # the host union's own random lists
    if rng.random() < 0.3:  # beams of one item (full-code beams, undeduplicated on the device path)
        got.sid_rows = np.where(got.sid_rows >= 0, got.sid_rows % max(1, n_items // 2), -1)
        got.sid_lp = np.where(got.sid_rows >= 0, got.sid_lp, np.nan).astype(np.float32)
    n = int(rng.integers(1, 8))
    dev = union_t(_t(got.sid_rows), _t(got.sid_lp), _t(got.ann_rows), _t(got.ann_score), n,
                  None if excl is None else padded_rows(excl, torch.device("cpu")),
                  None if got.trans_rows is None else _t(got.trans_rows))
    return union(got, b, n, excl), dev, rng, got


@pytest.mark.parametrize("seed", range(60))
def test_union_on_the_device_equals_the_host_union(seed: int) -> None:
    host, dev, _, got = _union_pair(seed)
    m = host.width
    assert dev.rows.shape[1] >= m  # static: the most the lists give
    assert not dev.valid[:, m:].any()
    np.testing.assert_array_equal(dev.valid[:, :m].numpy(), host.valid)
    for f in ("rows", "src", "ann_at", "merged", "sid_lp", "ann_score"):  # the valid entries
        np.testing.assert_array_equal(np.where(host.valid, getattr(dev, f)[:, :m].numpy(), 0),
                                      np.where(host.valid, getattr(host, f), 0), err_msg=f)
    np.testing.assert_array_equal(sid_lp_t(dev)[:, :m].numpy(), _sid_lp_matrix(host))
    srcs = [s for s, w in (("sid", got.sid_rows.shape[1]), ("ann", got.ann_rows.shape[1])) if w] or ["sid"]
    np.testing.assert_array_equal(merged_order_t(dev, srcs)[:, :m].numpy(), merged_order(host, srcs))


@pytest.mark.parametrize("seed", range(30))
def test_the_sid_term_over_a_reach_equals_the_host_rule(seed: int) -> None:
    host, dev, rng, _ = _union_pair(seed)
    b, r = host.rows.shape[0], int(rng.integers(0, 15))
    reach_rows = np.full((b, r), -1, np.int64)
    for i in range(b):
        k = int(rng.integers(0, min(r, 25) + 1))
        reach_rows[i, :k] = rng.choice(25, k, replace=False)
    reach_lp = np.where(reach_rows >= 0, -rng.random((b, r)) * 4, np.nan).astype(np.float32)
    want = _sid_lp_matrix(host, (reach_rows, reach_lp))
    np.testing.assert_array_equal(sid_lp_t(dev, (_t(reach_rows), _t(reach_lp)))[:, :host.width].numpy(), want)


@pytest.mark.parametrize("seed", range(40))
def test_top_k_on_the_device_equals_the_host_top_k(seed: int) -> None:
    host, dev, rng, _ = _union_pair(seed)
    m, big = host.width, dev.rows.shape[1]
    score = np.round(rng.normal(size=(host.rows.shape[0], big)), 1).astype(np.float32)  # ties
    score[rng.random(score.shape) < 0.1] = -np.inf
    probs = rng.random((*score.shape, 3)).astype(np.float32)
    k = int(rng.integers(1, 10))
    want = top_k(host, score[:, :m], probs[:, :m], k, None)
    got = unpack(top_k_t(dev, _t(score), _t(probs), k).numpy(), 3, None)
    kk = want.rows.shape[1]
    assert (got.rows[:, kk:] == -1).all()  # a wider union pads further
    np.testing.assert_array_equal(got.rows[:, :kk], want.rows)
    for f in ("scores", "src", "sid_lp", "ann_score", "probs"):
        np.testing.assert_array_equal(getattr(got, f)[:, :kk], getattr(want, f), err_msg=f)
    assert got.rows.dtype == np.int64 and got.src.dtype == np.int8


@pytest.mark.parametrize("seed", range(20))
def test_first_seen_on_the_device_equals_the_host_rule(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(-2, 6, (int(rng.integers(1, 5)), int(rng.integers(0, 15))))
    np.testing.assert_array_equal(first_seen_t(_t(a)).numpy(), first_seen(a))


@pytest.mark.parametrize("seed", range(20))
def test_the_transition_table_on_the_device_answers_as_on_the_host(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_items = int(rng.integers(1, 30))
    seqs = [rng.integers(-1, n_items, int(rng.integers(0, 12))) for _ in range(int(rng.integers(0, 20)))]
    table = TransitionTable.from_sequences(seqs, n_items)
    dt = DeviceTransitions.of(table, torch.device("cpu"))
    last = rng.integers(-1, n_items + 1, int(rng.integers(1, 6)))
    rows = rng.integers(-1, n_items + 1, (len(last), int(rng.integers(0, 9))))
    np.testing.assert_allclose(dt.log_prob(_t(last), _t(rows)).numpy(), table.log_prob(last, rows), rtol=1e-6)
    n = int(rng.integers(0, 8))
    np.testing.assert_array_equal(dt.successors(_t(last), n).numpy(), table.successors(last, n))


# ---------------------------------------------------------------- the real engine: device path == host path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    return build_run(tmp_path_factory.mktemp("device-funnel"), data_root, seed=3)


def _requests(eng: Engine, seed: int, b: int) -> list[list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    ids = eng.rec.catalog.item_ids
    return [[{"item_id": int(x)} for x in rng.choice(ids, int(rng.integers(1, 2 * eng.context_len)))]
            for _ in range(b)]


CASES: list[dict[str, Any]] = [
    dict(sources=["sid", "ann"], rank=True), dict(sources=["sid", "ann"], rank=False),
    dict(sources=["sid"], rank=True), dict(sources=["ann"], rank=True), dict(sources=["sid"], rank=False),
    dict(sources=["sid", "ann"], rank=True, fusion={"retrieval_weight": 0.5, "sid_weight": 0.3}),
    dict(sources=["sid", "ann"], rank=True, exclude_history=True),
    dict(sources=["sid"], rank=False, exclude_history=True),
    dict(sources=["sid", "ann"], rank=True, exclude_history=True,
         fusion={"transition_weight": 0.7, "history_weight": -1.0, "sid_weight": 0.2}),
    dict(sources=["sid", "ann"], rank=True, fusion={"transition_weight": 0.7, "history_weight": 0.5})]


def _compare(on: Engine, off: Engine, calls: list[int], atol: float, seed0: int) -> None:
    for c, kw in enumerate(CASES):
        hs = _requests(on, seed0 + c, 6)
        args: dict[str, Any] = dict(k=7, beam_width=12, diversity_lambda=0.0, **kw)
        before = len(calls)
        got, want = on.recommend_many(hs, **args), off.recommend_many(hs, **args)
        assert len(calls) == before + 1, kw  # the device path ran, once for the batch
        for g, w in zip(got, want, strict=True):
            assert [x["item_id"] for x in g["items"]] == [x["item_id"] for x in w["items"]], kw
            np.testing.assert_allclose([x["score"] for x in g["items"]], [x["score"] for x in w["items"]],
                                       rtol=0, atol=atol)
            assert [x["sources"] for x in g["items"]] == [x["sources"] for x in w["items"]]
            assert [x["sid"] for x in g["items"]] == [x["sid"] for x in w["items"]]
            if kw["rank"]:
                np.testing.assert_allclose([list(x["action_probs"].values()) for x in g["items"]],
                                           [list(x["action_probs"].values()) for x in w["items"]], rtol=0, atol=atol)


def _engines(run: Path, device: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Engine, Engine, list[int]]:
    monkeypatch.setenv("GENREC_SID_MODE", mode)
    on, off = Engine.load(run, device=device), Engine.load(run, device=device)
    rng = np.random.default_rng(0)  # a transition table (the tiny run has none): for the L1 transition term
    n = len(on.rec.catalog)
    table = TransitionTable.from_sequences([rng.integers(0, n, 30) % max(1, n // 3) for _ in range(200)], n)
    for e in (on, off):  # the flat index searched by torch on both sides (on a CPU too), its vectors not the
        if not isinstance(e.rec.ann, DeviceFlatSearch):  # item table's: the ANN candidates are ranked with the
            e.rec.ann = DeviceFlatSearch(e.rec.ann, device)  # index's
        e.rec.ann.vecs = e.rec.ann.vecs * torch.linspace(0.5, 1.5, e.rec.ann.vecs.shape[1], device=device)
    on.rec.device_funnel, off.rec.device_funnel = "on", "off"
    on.rec.transitions = off.rec.transitions = table
    calls: list[int] = []
    real = funnel.run_on_device

    def spy(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(funnel, "run_on_device", spy)
    return on, off, calls


@pytest.mark.parametrize("mode", ["full", "dense", "prefix"])
def test_the_engine_answers_the_same_on_the_device_path(run: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kind of request the device path serves, in each SID retrieval mode (full-code beams, undeduplicated
    there; the coarse-prefix ones, with the SID term over their reach), excluded history, the transition source
    and term and the history term included: the host path's answers."""
    on, off, calls = _engines(run, "cpu", mode, monkeypatch)
    assert on.rec.served_sid_mode == mode
    _compare(on, off, calls, 1e-5, 0)
    # what it does not serve goes to the host path: the score parts of the offline fusion tuning
    rec, hs = on.rec, _requests(on, 99, 3)
    mb, _ = rec.history_batch([rec.parse_history(h) for h in hs])
    n = len(calls)
    got = rec.run_batch(mb, k=5, beam_width=8, keep_parts=True)
    assert len(calls) == n and got.l1_parts is not None


def test_the_device_path_ranks_through_the_ranking_process_hook(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two-process mode's ranking hook (``Engine.run_many(remote_rank=...)``: the candidates' vectors and SID codes
    as arrays in, logits out, as the ranking process gets and answers them), called once a batch on either path: the
    device path's answers are the host path's with the same hook, and the hook is what ranked (its logits shifted
    by a constant per action change the order that ``score_candidates`` would give)."""
    from genrec.validation import trusted_inputs

    on, off, calls = _engines(run, "cpu", "dense", monkeypatch)
    model = on.rec.model
    shift = torch.linspace(-2.0, 2.0, len(on.rec.actions))
    hooked: list[tuple[int, ...]] = []

    def remote(cache: Any, vecs: np.ndarray, sid: np.ndarray | None, surfaces: list[int],
               request_ts: list[int] | None) -> torch.Tensor:
        hooked.append(vecs.shape[:2])
        assert isinstance(vecs, np.ndarray) and len(surfaces) == vecs.shape[0] == cache.batch_size
        with torch.no_grad(), trusted_inputs():
            logits = model.rank(cache, torch.from_numpy(vecs), None if sid is None else torch.from_numpy(sid),
                                torch.tensor(surfaces), None if request_ts is None else torch.tensor(request_ts))
        return logits + shift

    for c, kw in enumerate(k for k in CASES if k["rank"]):
        parsed = [on.read(h)[0] for h in _requests(on, 40 + c, 5)]
        args: dict[str, Any] = dict(k=7, beam_width=12, diversity_lambda=0.0, **kw)
        n, h = len(calls), len(hooked)
        got = on.run_many(parsed, remote_rank=remote, **args)
        assert len(calls) == n + 1 and len(hooked) == h + 1, kw  # the device path ran, ranked by the hook once
        want = off.run_many(parsed, remote_rank=remote, **args)
        assert len(hooked) == h + 2, kw  # the host path: once too (its candidates' width may differ: padding)
        local = off.run_many(parsed, **args)
        for g, w in zip(got, want, strict=True):
            assert [r.item_id for r in g] == [r.item_id for r in w], kw
            np.testing.assert_allclose([r.score for r in g], [r.score for r in w], rtol=0, atol=1e-5)
        assert any([r.score for r in g] != [r.score for r in x] for g, x in zip(got, local)), kw


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("holds", [True, False])
def test_speculated_plans_answer_as_decided_ones(run: Path, holds: bool, device: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The device path takes the encoder graph's plans as holding and reads their verdict with its answers (on the
    CPU the graphs' static-shape path, run eagerly): where they hold, the host path's answers and nothing redone;
    where they do not (forced, before the graphs are captured), the batch is redone with the plans decided -- the
    same answers -- and the recommender speculates no more."""
    from genrec.model.backbone import Backbone

    if not holds:  # every plan's verdict False: beams and candidates then copy the cache (the same function)
        real_plan = Backbone.shared_prefix_plan_lazy

        def never(self: Backbone, *a: Any, **kw: Any) -> Any:
            plan = real_plan(self, *a, **kw)
            return None if plan is None else (plan[0], plan[1] & False)

        monkeypatch.setattr(Backbone, "shared_prefix_plan_lazy", never)
    on, off, calls = _engines(run, device, "dense", monkeypatch)
    if device == "cpu":
        for e in (on, off):
            e.rec.use_graphs(use_graph=False)
    assumed: list[bool] = []
    spied = funnel.run_on_device

    def spy(rec: Any, cache: Any, *a: Any, **kw: Any) -> Any:
        assumed.append("assumed" in cache.plans)
        return spied(rec, cache, *a, **kw)

    monkeypatch.setattr(funnel, "run_on_device", spy)
    hs = _requests(on, 11, 5)
    args: dict[str, Any] = dict(k=7, beam_width=12, diversity_lambda=0.0, sources=["sid", "ann"], rank=True)
    got, want = on.recommend_many(hs, **args), off.recommend_many(hs, **args)
    assert [[x["item_id"] for x in g["items"]] for g in got] == [[x["item_id"] for x in w["items"]] for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose([x["score"] for x in g["items"]], [x["score"] for x in w["items"]],
                                   atol=1e-5 if device == "cpu" else 1e-3)
    assert assumed == ([True] if holds else [True, False])  # a miss: redone once, the plans decided
    assert on.rec.speculate_plans is holds
    on.recommend_many(hs, **args)
    assert assumed[-1] is holds  # after a miss: no more speculation


@pytest.mark.parametrize("mode", ["full", "dense"])
def test_nan_sid_log_probs_fail_the_device_path_as_the_host_one(run: Path, mode: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The device path reads the SID searches' NaN flags back with its answers (no sync of their own): a NaN
    level fails the batch with the host path's error, which names the level."""
    on, off, calls = _engines(run, "cpu", mode, monkeypatch)
    hs = _requests(on, 7, 3)
    for e in (on, off):
        with torch.no_grad():
            e.rec.model.sid_heads.heads[1].bias.fill_(float("nan"))
    errors = []
    for e in (on, off):
        with pytest.raises(Exception, match="level 2: step_fn returned NaN") as got:
            e.recommend_many(hs, k=5, beam_width=8, diversity_lambda=0.0, sources=["sid", "ann"], rank=True)
        errors.append((type(got.value), str(got.value)))
    assert errors[0] == errors[1] and calls


def test_the_device_funnel_setting(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = Engine.load(run)
    monkeypatch.delenv("GENREC_DEVICE_FUNNEL", raising=False)
    assert not wanted(eng.rec)  # auto by default: a CUDA device only
    eng.rec.device = torch.device("cuda")  # (only read, here)
    assert wanted(eng.rec) and wanted(eng.rec, AUTO_MIN_ROWS) and not wanted(eng.rec, AUTO_MIN_ROWS - 1)
    monkeypatch.setenv("GENREC_DEVICE_FUNNEL", "off")
    assert not wanted(eng.rec, 64)
    eng.rec.device = torch.device("cpu")
    monkeypatch.setenv("GENREC_DEVICE_FUNNEL", "auto")
    assert not wanted(eng.rec, 64)
    monkeypatch.setenv("GENREC_DEVICE_FUNNEL", "on")
    assert wanted(eng.rec)
    asked: list[int | None] = []  # the funnel asks for the batch's rows (its bucket's, padding included)
    real = funnel.serves
    monkeypatch.setattr(funnel, "serves", lambda *a, **kw: asked.append(kw.get("rows")) or real(*a, **kw))
    eng.recommend_many(_requests(eng, 3, 3), k=5, beam_width=8, diversity_lambda=0.0, sources=["sid", "ann"],
                       rank=True)
    assert asked == [eng.rec.buckets.batch(3) if eng.rec.buckets is not None else 3]
    eng.rec.device_funnel = "off"  # the recommender's own setting first
    assert not wanted(eng.rec)
    eng.rec.device_funnel = "sometimes"
    with pytest.raises(ConfigError, match="GENREC_DEVICE_FUNNEL"):
        wanted(eng.rec)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_the_engine_answers_the_same_on_the_device_path_on_the_gpu(run: Path, precision: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENREC_PRECISION", precision)
    on, off, calls = _engines(run, "cuda", "dense", monkeypatch)
    _compare(on, off, calls, 2e-3 if precision == "bf16" else 1e-4, 50)


def test_the_device_path_reads_nothing_back_but_its_answers(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the encode, the device funnel's own steps (union, ranking's inputs, fusion, top k) never read a tensor
    back to the host -- no ``item``, ``tolist``, truth value or copy -- but the one copy of the answers: on a GPU each
    would be a sync. The model's stages (the SID search, the ranking decode) are checked by the GPU test below."""
    import inspect

    on, _, calls = _engines(run, "cpu", "dense", monkeypatch)
    reads: list[str] = []
    inside = [False]
    skip = {"retrieve_sids_t", "score_candidates", "search_t", "position_rows"}  # the stages' own code

    def spying(name: str) -> Any:
        real = getattr(torch.Tensor, name)

        def f(self: torch.Tensor, *a: Any, **kw: Any) -> Any:
            if inside[0] and not {fr.function for fr in inspect.stack()[1:12]} & skip:
                reads.append(f"{name} at {inspect.stack()[1].function}")
            return real(self, *a, **kw)
        return f

    for name in ("item", "tolist", "__bool__", "cpu", "numpy", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, spying(name))
    real_run = funnel.run_on_device

    def watched(*a: Any, **kw: Any) -> Any:
        inside[0] = True
        try:
            return real_run(*a, **kw)
        finally:
            inside[0] = False

    monkeypatch.setattr(funnel, "run_on_device", watched)
    hs = _requests(on, 5, 4)
    for kw in CASES:
        reads.clear()
        on.recommend_many(hs, k=5, beam_width=8, diversity_lambda=0.0, **kw)
        assert reads == ["cpu at run_on_device", "numpy at run_on_device"], (kw, reads)


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["funnel", "encode"])
def test_the_device_path_syncs_once_on_the_gpu(run: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA, with graphs: from the end of the encode to the answers the device funnel synchronises with the
    GPU once (the answers' copy, which brings the encoder's plan verdict too); from the encode's start, once more
    (its bounds check of the lengths, before the graph). ``torch.cuda.set_sync_debug_mode`` warns on every
    synchronising call; a failure lists each with the frames that led to it."""
    import traceback
    import warnings

    import genrec.infer.recommender as recommender

    on, _, calls = _engines(run, "cuda", "dense", monkeypatch)
    hs = _requests(on, 6, 4)
    args: dict[str, Any] = dict(k=7, beam_width=12, diversity_lambda=0.0, sources=["sid", "ann"], rank=True)
    for _ in range(2):
        on.recommend_many(hs, **args)  # graphs captured (a capture begins with a device synchronize)
    captured = dict(on.rec.graph_captures)
    mod, name = (funnel, "run_on_device") if where == "funnel" else (recommender, "run_funnel")
    real_run = getattr(mod, name)
    seen: list[str] = []

    def show(message: Any, *_: Any, **__: Any) -> None:  # each sync with the innermost frames that led to it
        if "synchroniz" in str(message):
            frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.endswith("warnings.py")]
            seen.append(" <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[::-1][:6]))

    def watched(*a: Any, **kw: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")  # warns itself (seen with torch 2.11): recorded only after it
            warnings.showwarning = show
            try:
                return real_run(*a, **kw)
            finally:
                torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(mod, name, watched)
    on.recommend_many(hs, **args)
    assert captured == on.rec.graph_captures  # no capture in the watched call
    assert on.rec.speculate_plans  # the plans held
    want = 1 if where == "funnel" else 2
    if len(seen) != want:
        pytest.fail(f"{len(seen)} syncs ({want} expected), innermost frame first:\n" + "\n".join(seen))
