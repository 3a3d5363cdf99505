"""`genrec fusion tune`: the L1 fusion weights chosen on validation, stored per checkpoint + SID
version, and used by recommend / eval / serve unless a call names its own."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from genrec.errors import ConfigError, DataError
from genrec.catalog import open_store
from genrec.eval.evaluate import EvalConfig, evaluate, l0l1_pass, load_eval_data
from genrec.eval.fusion_tune import choose_fusion, fusion_metrics, tune_fusion
from genrec.infer.fusion import FUSION_GRID, HISTORY_GRID, FusionWeights, fusion_file, load_fusion, save_fusion, transition_file
from genrec.infer.recommender import Recommender
from genrec.infer.transitions import TransitionTable
from genrec.serve.engine import Engine
from genrec.serve.schemas import FusionWeightsRequest

from tests.tiny_run import build_run


# ----------------------------------------------------------------------------- the weights and their file
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "1"])
def test_weights_must_be_finite_and_non_negative(bad: object) -> None:
    for field in ("action_weight", "retrieval_weight", "sid_weight"):
        with pytest.raises(ConfigError, match=field):
            FusionWeights(**{field: bad})  # type: ignore[arg-type]


def test_the_history_weight_takes_either_sign_and_files_keep_it(tmp_path: Path) -> None:
    """h demotes (< 0) or promotes (> 0) what the history holds: any finite number; a file keeps it, an older
    file without it reads h = 0."""
    assert FusionWeights(history_weight=-4.0).history_weight == -4.0 and FusionWeights(history_weight=2.0)
    for bad in (float("nan"), float("inf"), True):
        with pytest.raises(ConfigError, match="history_weight"):
            FusionWeights(history_weight=bad)  # type: ignore[arg-type]
    p = tmp_path / "f.json"
    save_fusion(p, FusionWeights(1.0, 0.5, 0.0, 1.0, -4.0), {"metric": "recall@10"})
    assert load_fusion(p) == FusionWeights(1.0, 0.5, 0.0, 1.0, -4.0)
    p.write_text(json.dumps({"format": "genrec.fusion/1", "weights": {
        "action_weight": 1, "retrieval_weight": 0.5, "sid_weight": 0, "transition_weight": 1}}))
    assert load_fusion(p) == FusionWeights(1.0, 0.5, 0.0, 1.0, 0.0)
    assert FusionWeights().resolve(None, None, None, None, -2.0).history_weight == -2.0


def test_resolve_replaces_only_the_named_weights() -> None:
    f = FusionWeights(0.0, 1.0, 0.05)
    assert f.resolve(None, None, None) == f
    assert f.resolve(2.0, None, None) == FusionWeights(2.0, 1.0, 0.05)
    assert f.resolve(None, 0.0, 3.0) == FusionWeights(0.0, 0.0, 3.0)
    with pytest.raises(ConfigError, match="sid_weight"):
        f.resolve(None, None, -0.1)


def test_file_round_trip_and_damaged_files_name_themselves(tmp_path: Path) -> None:
    p = tmp_path / "fusion" / "x.json"
    assert load_fusion(p) is None
    save_fusion(p, FusionWeights(0.0, 1.0, 0.05), {"metric": "recall@10"})
    assert load_fusion(p) == FusionWeights(0.0, 1.0, 0.05)
    for text, what in (("{not json", "not valid JSON"), (json.dumps({"format": "other"}), "format"),
                       (json.dumps([1, 2]), "format"),
                       (json.dumps({"format": "genrec.fusion/1", "weights": {"action_weight": 1}}), "weights"),
                       (json.dumps({"format": "genrec.fusion/1", "weights": {
                           "action_weight": -1, "retrieval_weight": 0, "sid_weight": 0}}), "action_weight")):
        p.write_text(text)
        with pytest.raises(DataError, match=what) as e:
            load_fusion(p)
        assert str(p) in str(e.value)


def test_grid_holds_the_heads_alone_and_the_round_5_choice() -> None:
    assert (1.0, 0.0, 0.0) in FUSION_GRID and (0.0, 1.0, 0.05) in FUSION_GRID
    assert len(set(FUSION_GRID)) == len(FUSION_GRID)


def test_choose_fusion_picks_the_weighting_that_ranks_targets_first() -> None:
    """Hand-made parts: the dense logit puts every target first, the heads put it last, the SID
    log-probability is flat. Any weighting with w > 0 and a = 0 wins; ties go to the earlier."""
    rng = np.random.default_rng(0)
    parts = []
    for _ in range(3):
        b, m = 8, 12
        rows = np.stack([rng.permutation(100)[:m] for _ in range(b)])
        tgt = rows[np.arange(b), rng.integers(0, m, b)]
        is_t = rows == tgt[:, None]
        parts.append({"rows": rows, "utility": np.where(is_t, 0.0, 1.0).astype(np.float32),
                      "dot": np.where(is_t, 5.0, rng.normal(size=(b, m))).astype(np.float32),
                      "sid_lp": np.full((b, m), -3.0, np.float32), "target_rows": tgt})
    grid = [(1.0, 0.0, 0.0), (0.0, 0.0, 1.0), (0.0, 1.0, 0.0), (0.0, 1.0, 0.5), (1.0, 0.5, 0.0)]
    best, rows = choose_fusion(parts, (1, 5), grid, "recall@1")
    assert (best["a"], best["w"], best["v"]) == (0.0, 1.0, 0.0)  # first of the two perfect ones
    assert best["recall@1"] == 1.0 and rows[0]["recall@1"] == 0.0
    assert [r["recall@1"] for r in rows] == [fusion_metrics(parts, (1, 5), *g)["recall@1"] for g in grid]
    with pytest.raises(ConfigError, match="empty"):
        choose_fusion(parts, (1, 5), [], "recall@1")
    # the weights in use without tuning win a tie for the best (nothing measured says to change them) ...
    kept, _ = choose_fusion(parts, (1, 5), grid, "recall@1", prefer=(0.0, 1.0, 0.5))
    assert (kept["a"], kept["w"], kept["v"]) == (0.0, 1.0, 0.5)
    # ... and lose to a better weighting; a tie everywhere (every weighting scores 0) keeps them too
    lost, _ = choose_fusion(parts, (1, 5), grid, "recall@1", prefer=(1.0, 0.0, 0.0))
    assert (lost["a"], lost["w"], lost["v"]) == (0.0, 1.0, 0.0)
    flat = [{**p, "target_rows": np.full_like(p["target_rows"], -1)} for p in parts]
    tie, _ = choose_fusion(flat, (1, 5), grid, "recall@1", prefer=(1.0, 0.0, 0.0))
    assert (tie["a"], tie["w"], tie["v"]) == (1.0, 0.0, 0.0) and tie["recall@1"] == 0.0


# ----------------------------------------------------------------------------- end to end on a trained run
@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    return build_run(tmp_path_factory.mktemp("fusion"), data_root)


GRID = [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 1.0, 0.5), (1.0, 2.0, 1.0)]


@contextlib.contextmanager
def restored(path: Path) -> Iterator[Path]:
    """The file at ``path`` as it was (or absent) after the block, whatever the block wrote there."""
    keep = path.read_bytes() if path.exists() else None
    try:
        yield path
    finally:
        if keep is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(keep)


def test_tune_stores_the_choice_and_every_entry_point_uses_it(root: Path) -> None:
    rec0 = Recommender.from_checkpoint(root)
    assert rec0.fusion == FusionWeights() and rec0.fusion_path is None  # nothing stored yet: UniPinRec's L1
    out = tune_fusion(root, max_users=40, beam_width=12, overretrieve=2, grid=GRID, metric="ndcg@20")
    path = Path(out["path"])
    assert path == fusion_file(root, rec0.checkpoint, "v0001") and path.exists()
    best = max(out["grid"], key=lambda r: r["ndcg@20"])  # the history weight's rows (coordinate ascent) included
    assert out["chosen"] == {"action_weight": best["a"], "retrieval_weight": best["w"], "sid_weight": best["v"],
                             "transition_weight": best["t"], "history_weight": best["h"]}
    assert {r["h"] for r in out["grid"]} == set(HISTORY_GRID)
    assert transition_file(path).exists() == (best["t"] > 0)  # the table served with a transition term
    assert out["chosen_on"]["split"] == "valid" and out["chosen_on"]["cases"] == 40
    stored = load_fusion(path)
    assert json.loads(path.read_text())["chosen_on"]["utility"] == {a: 1.0 for a in rec0.actions}
    assert rec0.default_utility() != {a: 1.0 for a in rec0.actions}  # the +1 / -1 default before tuning
    assert Recommender.from_checkpoint(root).default_utility() == {a: 1.0 for a in rec0.actions}  # chosen with it
    # store a non-default choice, as a real tune on real data would pick, to see it used everywhere
    util = {a: float(i) - 1.0 for i, a in enumerate(rec0.actions)}
    assert out["chosen_on"]["sid_mode"] == rec0.served_sid_mode == "dense"  # auto: this model has a dense stage
    save_fusion(path, FusionWeights(0.0, 1.0, 0.5), {"metric": "ndcg@20",
                                                     "chosen_on": {"utility": util, "sid_mode": "dense"}})
    rec = Recommender.from_checkpoint(root)
    assert stored is not None and rec.fusion == FusionWeights(0.0, 1.0, 0.5) and rec.fusion_path == path
    assert rec.default_utility() == util
    hist = [{"item_id": int(i)} for i in rec.catalog.item_ids[[3, 40, 7, 90, 11]]]
    got = rec.recommend(hist, k=10, beam_width=12, overretrieve=2)
    want = rec.recommend(hist, k=10, beam_width=12, overretrieve=2, action_weight=0.0, retrieval_weight=1.0,
                         sid_weight=0.5, utility=util)
    heads = rec.recommend(hist, k=10, beam_width=12, overretrieve=2, action_weight=1.0, retrieval_weight=0.0,
                          sid_weight=0.0)
    assert [(r.item_id, r.score) for r in got] == [(r.item_id, r.score) for r in want]
    assert [r.score for r in got] != [r.score for r in heads]
    rep = evaluate(root, EvalConfig(split="valid", max_users=16, beam_width=12, ranking=False), rec=rec)
    assert rep["protocol"]["l1_fusion"] == {"action_weight": 0.0, "retrieval_weight": 1.0, "sid_weight": 0.5,
                                            "transition_weight": 0.0, "history_weight": 0.0, "stored": str(path)}
    from genrec.eval.report import markdown

    assert ("L1 score = 0 · utility + 1 · dense logit + 0.5 · log P(SID) (chosen on validation by `genrec fusion "
            "tune`)") in markdown(rep)
    rep = evaluate(root, EvalConfig(split="valid", max_users=16, beam_width=12, ranking=False, sid_weight=2.0),
                   rec=rec)
    assert rep["protocol"]["l1_fusion"]["sid_weight"] == 2.0  # an explicit weight wins


def test_weights_of_other_sids_or_a_damaged_file(root: Path) -> None:
    rec = Recommender.from_checkpoint(root)
    other = fusion_file(root, rec.checkpoint, "v0099")  # chosen for SIDs this checkpoint does not serve
    save_fusion(other, FusionWeights(0.0, 3.0, 3.0), {})
    assert Recommender.from_checkpoint(root).fusion != FusionWeights(0.0, 3.0, 3.0)
    with restored(fusion_file(root, rec.checkpoint, "v0001")) as mine:
        mine.write_text("{broken")
        with pytest.raises(DataError, match="not valid JSON") as e:
            Recommender.from_checkpoint(root)
        assert str(mine) in str(e.value)


def test_weights_chosen_under_another_sid_stage_are_not_applied(root: Path) -> None:
    """The SID term's log-probabilities differ in scale between the SID stages: weights chosen under one are
    served under that one only; a file without the stage (from before the dense leaf) serves "full" / "merged"."""
    rec = Recommender.from_checkpoint(root)
    with restored(fusion_file(root, rec.checkpoint, "v0001")) as mine:
        for chosen, served, applied in (("dense", None, True), ("full", None, False), (None, None, False),
                                        ("full", "full", True), (None, "full", True), (None, "merged", True),
                                        ("dense", "full", False), ("merged", "full", False)):
            save_fusion(mine, FusionWeights(0.0, 3.0, 3.0), {"chosen_on": {} if chosen is None else {"sid_mode": chosen}})
            got = Recommender.from_checkpoint(root, sid_mode=served)
            assert (got.fusion == FusionWeights(0.0, 3.0, 3.0)) is applied, (chosen, served)
            assert (got.fusion_path is not None) is applied, (chosen, served)


def test_a_stored_utility_must_name_the_models_actions(root: Path) -> None:
    rec = Recommender.from_checkpoint(root)
    with restored(fusion_file(root, rec.checkpoint, "v0001")) as mine:
        for bad in ({"teleport": 1.0}, {rec.actions[0]: "1"}, [1.0]):
            save_fusion(mine, FusionWeights(), {"chosen_on": {"utility": bad}})
            with pytest.raises(DataError, match="utility") as e:
                Recommender.from_checkpoint(root)
            assert str(mine) in str(e.value)


def test_cli_tune_and_show(root: Path) -> None:
    from genrec.cli import app

    r = CliRunner().invoke(app, ["fusion", "tune", str(root), "--max-users", "24", "--beam-width", "8",
                                 "--metric", "recall@20"])
    assert r.exit_code == 0, r.output
    assert "chosen: a=" in r.output and "stored: " in r.output
    r = CliRunner().invoke(app, ["fusion", "show", str(root)])
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output[r.output.index("{"):])
    assert shown["stored"] and set(shown["weights"]) == {"action_weight", "retrieval_weight", "sid_weight",
                                                         "transition_weight", "history_weight"}
    r = CliRunner().invoke(app, ["fusion", "tune", str(root), "--metric", "mrr"])
    assert r.exit_code != 0 and "metric" in r.output


def test_file_digest_is_the_sha256_and_follows_changes(tmp_path: Path) -> None:
    import hashlib
    import os

    from genrec.workdir import file_digest

    p = tmp_path / "w.bin"
    p.write_bytes(b"a" * 3_000_000)
    assert file_digest(p) == hashlib.sha256(b"a" * 3_000_000).hexdigest()
    st = p.stat()
    p.write_bytes(b"b" * 3_000_000)  # same size: the mtime tells the change
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert file_digest(p) == hashlib.sha256(b"b" * 3_000_000).hexdigest()


def test_parse_utility_reads_action_number_pairs_and_names_a_bad_one() -> None:
    from genrec.infer.fusion import parse_utility

    assert parse_utility("like=1, view=0.5,dislike=-1") == {"like": 1.0, "view": 0.5, "dislike": -1.0}
    for bad, part in (("like", "like"), ("like=", "like="), ("=1", "=1"), ("like=x", "like=x"),
                      ("like=nan", "like=nan"), ("like=1,,view=1", "''"), ("like=inf", "like=inf")):
        with pytest.raises(ConfigError, match="ACTION=NUMBER") as e:
            parse_utility(bad)
        assert part in str(e.value)
    with pytest.raises(ConfigError, match="twice"):
        parse_utility("like=1,like=2")


def test_tune_under_a_chosen_utility_stores_and_serves_it(root: Path) -> None:
    """The operator's utility (predicted dislikes demoted) is what the heads' term ranks by while the weights are
    chosen, is stored with them and is what every entry point then serves; an unknown action is refused first."""
    rec0 = Recommender.from_checkpoint(root)
    neg = next(a for a in rec0.actions if a.lower() == "dislike")
    util = {a: (-1.0 if a == neg else 1.0) for a in rec0.actions if a != rec0.actions[0]}  # the first: left out
    path = fusion_file(root, rec0.checkpoint, "v0001")
    with restored(path):
        plain = tune_fusion(root, max_users=40, beam_width=12, overretrieve=2, grid=GRID, metric="ndcg@20",
                            save=False)
        out = tune_fusion(root, max_users=40, beam_width=12, overretrieve=2, grid=GRID, metric="ndcg@20",
                          utility=util)
        want = {a: util.get(a, 0.0) for a in rec0.actions}
        assert out["chosen_on"]["utility"] == want
        assert json.loads(Path(out["path"]).read_text())["chosen_on"]["utility"] == want
        assert Recommender.from_checkpoint(root).default_utility() == want
        # the heads' term ranked by the given utility: the heads-only row scores differently from every-action-1's
        heads = [next(r for r in o["grid"] if (r["a"], r["w"], r["v"]) == (1.0, 0.0, 0.0)) for o in (plain, out)]
        assert heads[0]["ndcg@20"] != heads[1]["ndcg@20"]
        # weightings without the heads do not depend on the utility
        dense = [next(r for r in o["grid"] if (r["a"], r["w"], r["v"]) == (0.0, 1.0, 0.0)) for o in (plain, out)]
        assert dense[0]["ndcg@20"] == dense[1]["ndcg@20"]
        before = path.read_bytes()
        with pytest.raises(ConfigError, match="teleport"):
            tune_fusion(root, max_users=40, beam_width=12, grid=GRID, utility={"teleport": 1.0})
        assert path.read_bytes() == before


def test_cli_tune_with_a_utility(root: Path) -> None:
    from genrec.cli import app

    path = fusion_file(root, Recommender.from_checkpoint(root).checkpoint, "v0001")
    with restored(path):
        actions = Recommender.from_checkpoint(root).actions
        spec = ",".join(f"{a}={-1 if a.lower() == 'dislike' else 1}" for a in actions)
        r = CliRunner().invoke(app, ["fusion", "tune", str(root), "--max-users", "24", "--beam-width", "8",
                                     "--utility", spec])
        assert r.exit_code == 0, r.output
        assert "dislike=-1" in r.output and "served with these weights" in r.output
        r = CliRunner().invoke(app, ["fusion", "tune", str(root), "--utility", "like=high"])
        assert r.exit_code != 0 and "like=high" in r.output


# ----------------------------------------------------------------------------- the transition term
def test_transition_term_is_served_as_defined_and_only_with_its_table(root: Path) -> None:
    """Stored weights with t > 0 and their table: every recommended and every ranked item scores what the same
    weights with t = 0 give plus t * log P(item | the history's last item) from that table; the score parts
    recompute the served ranking; weights with t > 0 whose table is missing are not applied."""
    rec0 = Recommender.from_checkpoint(root)
    path = fusion_file(root, rec0.checkpoint, "v0001")
    rng = np.random.default_rng(3)
    n = len(rec0.catalog)
    table = TransitionTable.from_sequences([rng.integers(0, n, 30) for _ in range(200)], n)
    hist = [{"item_id": int(i)} for i in rec0.catalog.item_ids[[3, 40, 7, 90, 11]]]
    last = rec0.catalog.rows(np.array([hist[-1]["item_id"]]))
    meta = {"metric": "recall@10", "chosen_on": {"sid_mode": rec0.served_sid_mode}}
    with restored(path), restored(transition_file(path)):
        save_fusion(path, FusionWeights(0.0, 1.0, 0.5, 0.0), meta)
        base = Recommender.from_checkpoint(root)
        save_fusion(path, FusionWeights(0.0, 1.0, 0.5, 2.0), meta)
        transition_file(path).unlink(missing_ok=True)
        assert Recommender.from_checkpoint(root).fusion == FusionWeights()  # no table: not applied
        table.save(transition_file(path))
        rec = Recommender.from_checkpoint(root)
        assert rec.fusion.transition_weight == 2.0 and rec.transitions is not None
        ids = [int(i) for i in rec.catalog.item_ids[:25]]
        got = {r.item_id: r.score for r in rec.rank_items(hist, ids, beam_width=12)}
        want0 = {r.item_id: r.score for r in base.rank_items(hist, ids, beam_width=12)}
        lp = table.log_prob(last, rec.catalog.rows(np.array(ids))[None])[0]
        np.testing.assert_allclose([got[i] for i in ids], [want0[i] + 2.0 * x for i, x in zip(ids, lp)], atol=1e-4)
        served = rec.recommend(hist, k=10, beam_width=12, overretrieve=2)
        plain = {r.item_id: r.score for r in base.recommend(hist, k=60, beam_width=12, overretrieve=6)}
        for r in served:  # the same candidates scored by the t = 0 weights, plus the term
            if r.item_id in plain:
                x = table.log_prob(last, rec.catalog.rows(np.array([r.item_id]))[None])[0, 0]
                assert abs(r.score - (plain[r.item_id] + 2.0 * x)) < 1e-4
        assert [r.score for r in served] == sorted((r.score for r in served), reverse=True)
        # the term brings its own candidates: an item neither SID nor ANN retrieves, the last item's one successor
        far = next(int(i) for i in rec.catalog.item_ids[::-1] if int(i) not in plain)
        far_row = int(rec.catalog.rows(np.array([far]))[0])
        TransitionTable.from_sequences([np.array([int(last[0]), far_row])] * 50, n).save(transition_file(path))
        top = Recommender.from_checkpoint(root).recommend(hist, k=10, beam_width=12, overretrieve=2,
                                                          transition_weight=50.0)
        assert top[0].item_id == far and top[0].sources == ("transition",)
        assert far not in {r.item_id for r in rec.recommend(hist, k=10, beam_width=12, overretrieve=2,
                                                            transition_weight=0.0)}
        table.save(transition_file(path))
        # a call (or an HTTP request's "fusion") may leave the term out: then it ranks as the t = 0 weights do
        off = rec.recommend(hist, k=10, beam_width=12, overretrieve=2, transition_weight=0.0)
        want_off = base.recommend(hist, k=10, beam_width=12, overretrieve=2)
        assert [(r.item_id, r.score) for r in off] == [(r.item_id, r.score) for r in want_off]
        off_rank = {r.item_id: r.score for r in rec.rank_items(hist, ids, beam_width=12, transition_weight=0.0)}
        assert off_rank == want0
        eng = Engine.load(root)
        assert eng.rec.fusion.transition_weight == 2.0
        got_http = eng.recommend(hist, k=10, beam_width=12, diversity_lambda=0.0, sources=["sid", "ann"], rank=True,
                                 fusion=FusionWeightsRequest(transition_weight=0.0).model_dump())
        assert [x["item_id"] for x in got_http["items"]] == [r.item_id for r in want_off]
    with pytest.raises(ValueError, match="transition_weight"):
        FusionWeightsRequest(transition_weight=-1.0)


def test_history_term_is_served_as_defined(root: Path) -> None:
    """Stored weights with h != 0: every ranked item scores what the same weights with h = 0 give plus h where the
    history holds it; recommended lists likewise (a demoted history item leaves the top when h is low enough);
    `genrec eval`'s report names the term."""
    rec0 = Recommender.from_checkpoint(root)
    path = fusion_file(root, rec0.checkpoint, "v0001")
    ids = [int(i) for i in rec0.catalog.item_ids[:25]]
    hist = [{"item_id": i} for i in (ids[3], ids[7], ids[11], ids[3])]
    meta = {"metric": "recall@10", "chosen_on": {"sid_mode": rec0.served_sid_mode}}
    with restored(path), restored(transition_file(path)):
        save_fusion(path, FusionWeights(0.0, 1.0, 0.5), meta)
        base = Recommender.from_checkpoint(root)
        save_fusion(path, FusionWeights(0.0, 1.0, 0.5, 0.0, -3.0), meta)
        rec = Recommender.from_checkpoint(root)
        got = {r.item_id: r.score for r in rec.rank_items(hist, ids, beam_width=12)}
        want = {r.item_id: r.score for r in base.rank_items(hist, ids, beam_width=12)}
        held = {ids[3], ids[7], ids[11]}
        for i in ids:
            assert got[i] == pytest.approx(want[i] - (3.0 if i in held else 0.0), abs=1e-5), i
        plain = base.recommend(hist, k=10, beam_width=12, overretrieve=2)
        served = rec.recommend(hist, k=10, beam_width=12, overretrieve=2)
        scores = {r.item_id: r.score for r in base.recommend(hist, k=60, beam_width=12, overretrieve=6)}
        for r in served:
            if r.item_id in scores:
                assert r.score == pytest.approx(scores[r.item_id] - (3.0 if r.item_id in held else 0.0), abs=1e-5)
        hist2 = hist + [{"item_id": r.item_id} for r in plain[:3]]  # items this model recommends, now history
        held2 = {int(h["item_id"]) for h in hist2}
        assert held2 & {r.item_id for r in base.recommend(hist2, k=10, beam_width=12, overretrieve=2)}
        rec.fusion = FusionWeights(0.0, 1.0, 0.5, 0.0, -1e4)  # a demotion strong enough takes them all out
        assert not held2 & {r.item_id for r in rec.recommend(hist2, k=10, beam_width=12, overretrieve=2)}
        rep = evaluate(root, EvalConfig(split="valid", max_users=16, beam_width=12, ranking=False))
        assert rep["protocol"]["l1_fusion"]["history_weight"] == -3.0
        from genrec.eval.report import markdown

        assert "− 3 · [item in the history]" in markdown(rep)
        rep = evaluate(root, EvalConfig(split="valid", max_users=16, beam_width=12, ranking=False, history_weight=2.0))
        assert rep["protocol"]["l1_fusion"]["history_weight"] == 2.0  # eval's explicit weight wins
        with pytest.raises(ConfigError, match="--history-weight"):
            EvalConfig(history_weight=float("nan")).validate()
        # a call, or an HTTP request's "fusion", may set h: 0 ranks as the h = 0 weights do
        rec.fusion = FusionWeights(0.0, 1.0, 0.5, 0.0, -3.0)
        want_off = [(r.item_id, r.score) for r in base.recommend(hist2, k=10, beam_width=12, overretrieve=2)]
        off = rec.recommend(hist2, k=10, beam_width=12, overretrieve=2, history_weight=0.0)
        assert [(r.item_id, r.score) for r in off] == want_off
        assert {r.item_id: r.score for r in rec.rank_items(hist, ids, beam_width=12, history_weight=0.0)} == want
        eng = Engine.load(root)
        assert eng.rec.fusion.history_weight == -3.0
        got_http = eng.recommend(hist2, k=10, beam_width=12, diversity_lambda=0.0, sources=["sid", "ann"], rank=True,
                                 fusion=FusionWeightsRequest(history_weight=0.0).model_dump())
        assert [x["item_id"] for x in got_http["items"]] == [i for i, _ in want_off]
        assert eng.version.endswith("-h-3")  # the served version names the history term
    with pytest.raises(ValueError, match="history_weight"):
        FusionWeightsRequest(history_weight=float("inf"))


def test_eval_transitions_hold_the_pairs_before_the_targets_only(root: Path) -> None:
    """The table evaluation and tuning score with counts exactly the consecutive pairs of each user's events
    before their target of the split (leave-one-out, written out by hand: a user of >= 3 events drops the last two
    for validation, the last one for test; a shorter one keeps all, they are training events): no target."""
    rec = Recommender.from_checkpoint(root)
    assert rec.split_kind == "loo"
    events = open_store(root).read_events(columns=["user_id", "item_id", "seq"])
    per_user: dict[int, list[tuple[int, int]]] = {}
    for u, i, q in zip(events.column("user_id").to_pylist(), events.column("item_id").to_pylist(),
                       events.column("seq").to_pylist()):
        per_user.setdefault(u, []).append((q, i))
    n = len(rec.catalog)
    for split, drop in (("valid", 2), ("test", 1)):
        data = load_eval_data(rec, root, EvalConfig(split=split, max_users=0))
        pairs: dict[tuple[int, int], int] = {}
        for seq in per_user.values():
            items = [i for _, i in sorted(seq)]
            items = items[:-drop] if len(items) >= 3 else items
            for a, b in zip(items, items[1:]):
                ra, rb = (int(x) for x in rec.catalog.rows(np.array([a, b]), strict=False))
                if ra >= 0 and rb >= 0:
                    pairs[(ra, rb)] = pairs.get((ra, rb), 0) + 1
        t = data.transitions
        assert t is not None
        assert {(int(k) // n, int(k) % n): int(c) for k, c in zip(t.keys, t.counts)} == pairs, split


def test_transition_parts_recompute_the_l0l1_ranking(root: Path) -> None:
    """fusion_metrics over the recorded parts (with their transition column and the transition source's rows) gives
    the metrics l0l1_pass gives with the same weights served, t = 0 (no transition source) included: what fusion
    tune chooses on is what runs."""
    rec = Recommender.from_checkpoint(root)
    data = load_eval_data(rec, root, EvalConfig(split="valid", max_users=30))
    parts: list = []
    kw = dict(ks=(5, 10), beam_width=12, diversity_lambda=0.0, overretrieve=2, utility={a: 1.0 for a in rec.actions},
              transitions=data.transitions)
    l0l1_pass(rec, data.es, parts=parts, **kw)  # type: ignore[arg-type]
    for a, w, v, t, h in [(0.0, 1.0, 0.0, 3.0, 0.0), (1.0, 0.5, 0.2, 1.0, 0.0), (1.0, 0.5, 0.2, 0.0, 0.0),
                          (1.0, 0.5, 0.2, 1.0, -2.0), (0.0, 1.0, 0.0, 0.0, 0.5)]:  # t = 0: no source; h either sign
        direct = l0l1_pass(rec, data.es, action_weight=a, retrieval_weight=w, sid_weight=v, transition_weight=t,
                           history_weight=h, **kw)  # type: ignore[arg-type]
        again = fusion_metrics(parts, (5, 10), a, w, v, t, h)
        for m in ("recall@5", "recall@10", "ndcg@10"):
            assert abs(direct[m] - again[m]) < 1e-9
    # a table whose successors are the targets (no leak in use: a probe of the source's place in the parts): with
    # t = 0 its rows are no candidates -- as served, whatever the weights -- and kept, they would change the metrics
    tgt = np.asarray(data.es.target_rows)
    cheat = TransitionTable.from_sequences([np.array([ex.rows[-1], t]) for ex, t in zip(data.es.examples, tgt)] * 3,
                                           len(rec.catalog))
    parts = []
    l0l1_pass(rec, data.es, parts=parts, **{**kw, "transitions": cheat})  # type: ignore[arg-type]
    direct = l0l1_pass(rec, data.es, action_weight=1.0, retrieval_weight=0.0, sid_weight=0.0, transition_weight=0.0,
                       **{**kw, "transitions": cheat})  # type: ignore[arg-type]
    assert fusion_metrics(parts, (5, 10), 1.0, 0.0, 0.0, 0.0)["recall@10"] == pytest.approx(direct["recall@10"])
    kept = [{k: v for k, v in pt.items() if k != "src"} for pt in parts]
    assert fusion_metrics(kept, (5, 10), 1.0, 0.0, 0.0, 0.0)["recall@10"] != pytest.approx(direct["recall@10"])
    with pytest.raises(ConfigError, match="transition"):  # a transition weight needs the split's own table
        l0l1_pass(rec, data.es, **{**kw, "transitions": None}, transition_weight=1.0)  # type: ignore[arg-type]


def test_eval_takes_an_explicit_transition_weight(root: Path) -> None:
    """`genrec eval --transition-weight`: the report's fusion says the weight used; a bad one is refused."""
    rep = evaluate(root, EvalConfig(split="valid", max_users=16, beam_width=12, ranking=False, transition_weight=1.5))
    assert rep["protocol"]["l1_fusion"]["transition_weight"] == 1.5
    with pytest.raises(ConfigError, match="--transition-weight"):
        EvalConfig(transition_weight=-1.0).validate()
