"""`genrec eval`: every path against a slow per-case twin, popularity by hand, the test-split record."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from genrec.eval.evaluate import EvalConfig, evaluate, l0l1_pass, load_eval_data, run_eval, sid_pass
from genrec.eval.fusion_tune import fusion_metrics
from genrec.eval.metrics import auc, hit_at_k_slates, rank_in_list, topk_metrics
from genrec.eval.ranking import collect_slates, score_slates
from genrec.eval.retrieval import evaluate_retrieval
from genrec.infer.recommender import Recommender
from tests.tiny_run import build_run

KS = (5, 10, 20)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> tuple[Path, Recommender]:
    root = build_run(tmp_path_factory.mktemp("ev"), data_root)
    return root, Recommender.from_checkpoint(root)


def _history(rec: Recommender, ex) -> list[dict]:  # type: ignore[no-untyped-def]
    return [{"item_id": int(rec.catalog.item_ids[r]), "action": int(a), "surface": int(s), "ts": int(t)}
            for r, a, s, t in zip(ex.rows, ex.actions, ex.surfaces, ex.timestamps)]


def test_l0l1_and_ann_paths_equal_per_case_twins(run: tuple[Path, Recommender]) -> None:
    root, rec = run
    data = load_eval_data(rec, root, EvalConfig(split="valid", max_users=40))
    es = data.es
    assert len(es) == 40
    l0l1_ranks: dict[str, np.ndarray] = {}
    got = l0l1_pass(rec, es, ks=KS, beam_width=12, diversity_lambda=0.5, overretrieve=2, utility=None,
                    batch_size=16, ranks_out=l0l1_ranks)
    ranks, ann_ranks = [], []
    for i, ex in enumerate(es.examples):  # one request at a time through the public API
        recs = rec.recommend(_history(rec, ex), k=20, beam_width=12, diversity_lambda=0.5, sources=None,
                             overretrieve=2)
        rows = rec.catalog.rows(np.array([r.item_id for r in recs]))
        ranks.append(int(rank_in_list(np.pad(rows, (0, 20 - len(rows)), constant_values=-1)[None],
                                      es.target_rows[i:i + 1])[0]))
        with torch.no_grad():
            _, user = rec.encode(rec.model_batch([rec.parse_history(_history(rec, ex))]))
        s = (rec.item_vecs @ user[0]).numpy()
        ann_ranks.append(int((s >= s[es.target_rows[i]]).sum() - 1))
    want = topk_metrics(np.array(ranks), KS)
    for key, v in want.items():
        assert got[key] == pytest.approx(v, abs=1e-9), key
    np.testing.assert_array_equal(l0l1_ranks["l0l1"], ranks)  # per case, for paired comparisons
    ro: dict[str, np.ndarray] = {}
    ann = evaluate_retrieval(rec.catalog_model, es, paths=("ann",), ks=KS, context_len=rec.context_len,
                             ranks_out=ro)["ann"]
    np.testing.assert_array_equal(ro["ann"], ann_ranks)  # the per-case ranks, for paired comparisons
    for key, v in topk_metrics(np.array(ann_ranks), KS).items():
        assert ann[key] == pytest.approx(v, abs=1e-9), key


def test_fusion_metrics_equal_the_l0l1_pass_for_every_weighting(run: tuple[Path, Recommender]) -> None:
    """One recorded pass re-weighted offline gives exactly what running the L0+L1 path with those
    fusion weights gives (the weights are then chosen on validation without a pass per weighting).
    The tiny model retrieves no real target, so each case's target is set to a random candidate of
    its L0 union: every weighting then has non-zero, weighting-dependent metrics."""
    import dataclasses

    root, rec = run
    es = load_eval_data(rec, root, EvalConfig(split="valid", max_users=40)).es
    kw = dict(ks=KS, beam_width=12, diversity_lambda=0.0, overretrieve=2, utility=None, batch_size=16)
    parts: list[dict[str, np.ndarray]] = []
    l0l1_pass(rec, es, parts=parts, **kw)
    width = max(p["rows"].shape[1] for p in parts)
    rows = np.concatenate([np.pad(p["rows"], ((0, 0), (0, width - p["rows"].shape[1])), constant_values=-1)
                           for p in parts])
    assert len(rows) == len(es)
    rng = np.random.default_rng(0)
    tgt = np.array([rng.choice(r[r >= 0]) for r in rows])
    es = dataclasses.replace(es, target_rows=tgt)
    parts = []
    l0l1_pass(rec, es, parts=parts, **kw)
    seen = set()
    for a, w, v in ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (1.0, 2.0, 0.5), (0.0, 1.0, 3.0)):
        want = l0l1_pass(rec, es, action_weight=a, retrieval_weight=w, sid_weight=v, **kw)
        got = fusion_metrics(parts, KS, a, w, v)
        assert set(got) <= set(want) and got["recall@20"] > 0
        for key in got:
            assert got[key] == pytest.approx(want[key], abs=1e-12), (a, w, v, key)
        seen.add(round(got["ndcg@10"], 9))
    assert len(seen) > 2  # the weightings really order the candidates differently


def test_sid_pass_matches_evaluate_retrieval_and_diagnostics(run: tuple[Path, Recommender]) -> None:
    root, rec = run
    es = load_eval_data(rec, root, EvalConfig(split="valid", max_users=48)).es
    for lam in (0.0, 1.5):
        mine = sid_pass(rec, es, beam_width=10, diversity_lambda=lam, ks=KS, batch_size=16)
        ref = evaluate_retrieval(rec.catalog_model, es, paths=("sid",), ks=KS, beam_width=10, diversity_lambda=lam,
                                 context_len=rec.context_len, trie=rec.trie, leaf_rows=rec.leaf_rows)["sid"]
        for key in ("recall@5", "recall@10", "recall@20", "ndcg@10", "mrr"):
            assert mine[key] == pytest.approx(ref[key], abs=1e-9), (lam, key)
        assert mine["valid_sid_rate"] == 1.0
        assert 1.0 <= mine["distinct_first_codes"] <= rec.config.sid_codebook_sizes[0]
    plain = sid_pass(rec, es, beam_width=10, diversity_lambda=0.0, ks=KS)
    diverse = sid_pass(rec, es, beam_width=10, diversity_lambda=5.0, ks=KS)
    assert diverse["distinct_first_codes"] > plain["distinct_first_codes"]
    # unconstrained decoding: the valid rate is measured against the trie, so it is a real fraction
    unc = sid_pass(rec, es, beam_width=10, diversity_lambda=0.0, ks=KS, constrain=False)
    assert 0.0 <= unc["valid_sid_rate"] <= 1.0


def test_ranking_metrics_batched_equal_one_at_a_time(run: tuple[Path, Recommender]) -> None:
    root, rec = run
    data = load_eval_data(rec, root, EvalConfig(split="test", max_users=30))
    slates, skipped = collect_slates(data.records, data.feedviews, rec.catalog, context_len=rec.context_len)
    assert len(slates) >= 20
    batched = score_slates(rec, slates, batch_size=8)
    single = [score_slates(rec, [s])[0] for s in slates[:10]]
    for a, b in zip(batched, single):
        np.testing.assert_allclose(a, b, atol=1e-5)
    from genrec.eval.ranking import ranking_metrics

    m = ranking_metrics(rec, slates)
    bits = np.concatenate([s.labels for s in slates])
    p = np.concatenate(batched)
    for c, a in enumerate(rec.actions):
        assert m["auc"][a] == pytest.approx(auc(p[:, c], (bits >> c) & 1), abs=1e-9)
    u = np.array([rec.default_utility()[a] for a in rec.actions])
    pos = sum(1 << rec.actions.index(a) for a in rec.positive_actions)
    assert m["hit@3"] == pytest.approx(hit_at_k_slates([q @ u for q in batched], [(s.labels & pos) > 0 for s in slates]))
    assert m["n_items"] == len(p)
    # leave-one-out test slates are the target alone (its slate's earlier items were training candidates)
    by_user = {r.user_id: r for r in data.records}
    assert all(len(s.cand_rows) == 1 for s in slates)
    assert all(len(f) <= 1 and (not f or f[0].item_ids[0] == r.target_item)
               for r, f in zip(data.records, data.feedviews)) and len(by_user) == len(data.records)
    # with sampled impression-only negatives: AUC still over the logged items, Hit@3 over the whole slate
    neg, _ = collect_slates(data.records, data.feedviews, rec.catalog, context_len=rec.context_len, negatives=8, seed=3)
    assert all(s.n_sampled == 8 and len(s.cand_rows) == 9 and not (s.labels[1:]).any() for s in neg)
    assert all(not set(s.cand_rows[1:].tolist()) & set(s.rows.tolist()) for s in neg)
    m2 = ranking_metrics(rec, neg)
    assert m2["auc"] == pytest.approx(m["auc"], nan_ok=True) and m2["n_items"] == m["n_items"]
    assert m2["n_sampled_negatives"] == 8 * len(neg) and m2["hit@3_chance"] == pytest.approx(3 / 9)
    again, _ = collect_slates(data.records, data.feedviews, rec.catalog, context_len=rec.context_len, negatives=8, seed=3)
    assert all(np.array_equal(a.cand_rows, b.cand_rows) for a, b in zip(neg, again))  # the same for every model


def test_slate_probs_of_the_model_equal_the_served_scores(run: tuple[Path, Recommender]) -> None:
    """Training's validation ranking (``valid/rank/*``) scores slates on the bare model; the served path (a
    Recommender's encode + rank step) is its twin: the same probabilities, slates of several items and sampled
    negatives included, in any batching."""
    from genrec.eval.ranking import slate_probs

    root, rec = run
    data = load_eval_data(rec, root, EvalConfig(split="valid", max_users=40))
    with_neg, _ = collect_slates(data.records, data.feedviews, rec.catalog, context_len=rec.context_len,
                                 negatives=5, seed=1)
    alone, _ = collect_slates(data.records, data.feedviews, rec.catalog, context_len=rec.context_len)
    slates = [s for pair in zip(with_neg, alone) for s in pair]  # candidates of several lengths
    cut = 1 + np.arange(len(slates)) % 7  # and histories: the newest 1..7 events of every third
    slates = [dataclasses.replace(s, rows=s.rows[-c:], actions=s.actions[-c:], surfaces=s.surfaces[-c:], ts=s.ts[-c:])
              if i % 3 == 0 else s for i, (s, c) in enumerate(zip(slates, cut))]
    assert len(slates) >= 40 and len({len(s.cand_rows) for s in slates}) > 1 and len({len(s.rows) for s in slates}) > 3
    served = score_slates(rec, slates, batch_size=16)
    for bs in (7, 128):
        mine = slate_probs(rec.catalog_model, slates, batch_size=bs)
        assert len(mine) == len(served)
        for a, b in zip(mine, served):
            np.testing.assert_allclose(a, b, atol=1e-5)
    assert not rec.model.training


def test_run_eval_writes_report_and_records_test_split(run: tuple[Path, Recommender]) -> None:
    root, rec = run
    cfg = EvalConfig(split="valid", max_users=32, beam_width=8, sweep_lambda=(0.0, 2.0), sweep_beam=(4, 8),
                     sweep_context=(3, 12))
    report, files = run_eval(root, cfg, rec=rec)
    assert files["json"].name == f"eval-valid-step{rec.step}.json"
    assert {"md", "beam", "lambda", "context", "tokens"} <= set(files)
    saved = json.loads(files["json"].read_text())
    assert saved["split"] == "valid" and saved["test_split"] is False
    assert set(saved["paths"]) == {"sid", "ann", "l0l1", "popularity"}
    for m in saved["paths"].values():
        assert {"recall@5", "recall@10", "recall@20", "ndcg@5", "ndcg@10", "ndcg@20", "mrr"} <= set(m)
    assert saved["protocol"]["history_excluded"] is False and saved["protocol"]["cases"] == 32
    assert saved["sid_diagnostics"]["history_tokens_per_item"] == 1
    assert [r["lambda"] for r in saved["sweeps"]["lambda"]] == [0.0, 2.0]
    assert [r["history_tokens"] for r in saved["sweeps"]["context"]] == [3, 12]
    # the beam sweep at the main setting reproduces the main SID path
    main_sid = saved["paths"]["sid"]["recall@10"]
    assert next(r for r in saved["sweeps"]["beam"] if r["beam_width"] == 8)["recall@10"] == pytest.approx(main_sid)
    assert "| Popularity |" in files["md"].read_text()
    # popularity by hand: train-split counts, ties against the target
    data = load_eval_data(rec, root, cfg)
    counts = np.bincount(rec.catalog.rows(data.train_item_ids), minlength=len(rec.catalog)).astype(float)
    counts += np.linspace(0, 1e-6, len(counts))[::-1]
    ranks = np.array([(counts >= counts[t]).sum() - 1 for t in data.es.target_rows])
    assert saved["paths"]["popularity"]["recall@20"] == pytest.approx(topk_metrics(ranks, KS)["recall@20"])
    # the test split: recorded as such, and a second measurement lists the first
    t1, f1 = run_eval(root, EvalConfig(split="test", max_users=16, ranking=False), rec=rec)
    assert t1["split"] == "test" and t1["test_split"] is True and t1["previous_test_reports"] == []
    assert "valid" in t1["model_selection"]
    t2 = evaluate(root, EvalConfig(split="test", max_users=16, ranking=False), rec=rec)
    assert t2["previous_test_reports"] == [f1["json"].name]
    # the checkpoint's provenance is stated as it is: this run has no BEST marker
    assert t1["model_selection"].startswith("LATEST") and "nothing was selected on valid" in t1["model_selection"]
    # a second report of the same split and step is written beside the first, never over it
    _, f2 = run_eval(root, EvalConfig(split="test", max_users=16, ranking=False), rec=rec)
    assert f2["json"].name == f"eval-test-step{rec.step}-2.json" and f1["json"].exists()
    assert json.loads(f1["json"].read_text())["previous_test_reports"] == []


def test_cli_recommend_and_eval(run: tuple[Path, Recommender]) -> None:
    from typer.testing import CliRunner

    from genrec.cli import app

    root, _ = run
    r = CliRunner().invoke(app, ["recommend", str(root), "--history", "1,50,181,999999", "--k", "4"])
    assert r.exit_code == 0, r.output
    assert "dropped 1 unknown" in r.output and "stage" in r.output
    r = CliRunner().invoke(app, ["recommend", str(root), "--user", "3", "--k", "3", "--json", "--no-rank",
                                 "--sources", "ann"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert len(out["items"]) == 3 and all(i["sources"] == ["ann"] for i in out["items"])
    # --as-of: the case genrec eval scores for this user (the events before the split's target), and the target
    root_, rec_ = run
    data = load_eval_data(rec_, root_, EvalConfig(split="test"))
    ci = next(i for i, e in enumerate(data.es.examples) if e.user_id == 3)
    case = data.es.examples[ci]
    r = CliRunner().invoke(app, ["recommend", str(root), "--user", "3", "--as-of", "test", "--k", "20", "--json",
                                 "--no-rank", "--sources", "ann"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["target"]["item_id"] == int(rec_.catalog.item_ids[data.es.target_rows[ci]])
    assert out["history_used"] == min(len(case.rows), rec_.context_len)
    from genrec.infer.cases import user_case

    hist, tgt = user_case(root, 3, "test")
    assert [h["item_id"] for h in hist][-rec_.context_len:] == rec_.catalog.item_ids[case.rows].tolist()
    assert tgt is not None and tgt["item_id"] == out["target"]["item_id"]
    rows = [x["item_id"] for x in out["items"]]
    assert out["target"]["rank"] == (rows.index(out["target"]["item_id"]) + 1 if out["target"]["item_id"] in rows
                                     else None)
    r = CliRunner().invoke(app, ["recommend", str(root), "--user", "3", "--as-of", "test", "--k", "3"])
    assert r.exit_code == 0 and "held-out test target: item" in r.output, r.output
    r = CliRunner().invoke(app, ["recommend", str(root), "--history", "1,50", "--as-of", "test"])
    assert r.exit_code == 2 and "--as-of goes with --user" in r.output
    r = CliRunner().invoke(app, ["recommend", str(root), "--k", "3"])
    assert r.exit_code == 2 and "exactly one of --user" in r.output
    r = CliRunner().invoke(app, ["recommend", str(root), "--user", "u3"])  # ids not remapped: integers
    assert r.exit_code == 2 and "expected an integer user id" in r.output
    r = CliRunner().invoke(app, ["eval", str(root), "--split", "valid", "--max-users", "8", "--beam-width", "4"])
    assert r.exit_code == 0, r.output
    assert "| SID beams (constrained) |" in r.output
    r = CliRunner().invoke(app, ["eval", str(root), "--split", "train"])
    assert r.exit_code == 2 and "--split must be" in r.output


def test_sid_dense_path_equals_the_per_case_twin(run: tuple[Path, Recommender]) -> None:
    """The "sid-dense" path (beams over the semantic levels, the item inside each prefix by the softmax of its
    dense score / the temperature) against the slow twin, one case at a time: the case's own beams, its dense
    scores from its own encoding, and `prefix_lists_reference`'s per-item loop."""
    import torch.nn.functional as F

    from genrec.decode.beam import beam_search
    from genrec.decode.prefix import prefix_lists_reference
    from genrec.eval.retrieval import _batches

    root, rec = run
    es = load_eval_data(rec, root, EvalConfig(split="valid", max_users=12)).es
    cm, model, trie, tau, w = rec.catalog_model, rec.model, rec.trie, 0.3, 4
    lists: dict[str, np.ndarray] = {}
    evaluate_retrieval(cm, es, paths=("sid-dense",), ks=KS, beam_width=w, context_len=rec.context_len, trie=trie,
                       leaf_rows=rec.leaf_rows, batch_size=5, lists_out=lists, dense_temperature=tau)
    leaf_rows = np.asarray(rec.leaf_rows)
    sids = rec.catalog.codes.numpy()[leaf_rows]  # the trie's leaves in order: each leaf's full code
    vecs = cm.catalogue_vectors().float()
    ls = trie.n_levels - 1
    with torch.no_grad():
        for i in range(len(es)):
            _, tb = next(_batches(es.subset(np.array([i])), 1, rec.context_len, rec.config.n_actions))
            mb, _ = cm.model_batch(tb, mask_actions=False)
            cache, user, _ = model.encode_history(mb)

            def step(prefix: torch.Tensor) -> torch.Tensor:
                return F.log_softmax(model.sid_logits_next(cache, prefix).float(), dim=-1)

            beams = beam_search(step, 1, ls, trie.codebook_sizes[:ls], w, trie=trie.cut(ls))
            last = step(beams.codes.clamp_min(0)).numpy()
            dense = (user.float() @ vecs.T / tau).numpy()
            want, _ = prefix_lists_reference(beams.codes.numpy(), beams.scores.numpy(), beams.valid.numpy(), last,
                                             sids, leaf_rows, np.ones(len(leaf_rows), bool), max(KS), "merged",
                                             item_scores=dense)
            np.testing.assert_array_equal(lists["sid-dense"][i], want[0], err_msg=f"case {i}")


def test_eval_sid_mode_dense_scores_the_dense_leaf(run: tuple[Path, Recommender]) -> None:
    """`genrec eval --sid-mode dense`: the report's SID path is the dense-leaf retrieval (the offline "sid-dense"
    path at the run's temperature), and its protocol says which SID stage was scored."""
    from genrec.infer.load import trained_temperature

    root, _ = run
    cfg = EvalConfig(split="valid", max_users=30, ranking=False, sid_mode="dense", beam_width=6)
    rep = evaluate(root, cfg)
    rec = Recommender.from_checkpoint(root, sid_mode="dense")
    assert rep["protocol"]["sid_mode"] == "dense"
    es = load_eval_data(rec, root, EvalConfig(split="valid", max_users=30)).es
    want = evaluate_retrieval(rec.catalog_model, es, paths=("sid-dense",), ks=KS, beam_width=6,
                              context_len=rec.context_len, trie=rec.trie, leaf_rows=rec.leaf_rows,
                              dense_temperature=trained_temperature(rec.run_config))["sid-dense"]
    for key in ("recall@10", "ndcg@10", "recall@20"):
        assert rep["paths"]["sid"][key] == pytest.approx(want[key], abs=1e-12), key
    # auto: the dense leaf wherever the model has a dense stage (this one does); "full" when asked for
    assert evaluate(root, EvalConfig(split="valid", max_users=30, ranking=False))["protocol"]["sid_mode"] == "dense"
    assert evaluate(root, EvalConfig(split="valid", max_users=30, ranking=False,
                                     sid_mode="full"))["protocol"]["sid_mode"] == "full"


def test_sweeps_score_the_sid_stage_as_served(run: tuple[Path, Recommender]) -> None:
    """The λ / beam / context sweeps of `genrec eval` score the SID path in the served mode (here the dense leaf):
    each case's target set to the 4th item of its served SID list, every sweep point at the main settings finds
    it there (MRR 1/4); the full-code beams order those items otherwise."""
    import dataclasses

    from genrec.eval.evaluate import run_sweeps, served_sid_stage

    root, _ = run
    rec = Recommender.from_checkpoint(root, sid_mode="dense")
    es = load_eval_data(rec, root, EvalConfig(split="valid", max_users=30)).es
    lists: dict[str, np.ndarray] = {}
    evaluate_retrieval(rec.catalog_model, es, paths=("sid",), ks=KS, beam_width=6, context_len=rec.context_len,
                       lists_out=lists, **served_sid_stage(rec))
    assert (lists["sid"][:, 3] >= 0).all()
    es = dataclasses.replace(es, target_rows=lists["sid"][:, 3])
    cfg = EvalConfig(split="valid", beam_width=6, sweep_beam=(6,), sweep_lambda=(0.0,), sweep_context=(rec.context_len,))
    sw = run_sweeps(rec, es, cfg, KS)
    for got in (sw["beam"][0], sw["lambda"][0], {k[4:]: v for k, v in sw["context"][0].items() if k.startswith("sid/")}):
        assert got["mrr"] == pytest.approx(0.25) and got["recall@5"] == 1.0
    rec.sid_mode = "full"  # the full-code beams rank the same targets elsewhere
    assert run_sweeps(rec, es, cfg, KS)["beam"][0]["mrr"] != pytest.approx(0.25)
