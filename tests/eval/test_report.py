"""Report plots are drawn from the JSON's numbers (read back from the figures), Markdown shows them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from genrec.errors import DataError
from genrec.eval import report as R


def _report(split: str = "test", layout: str = "pinger", tpi: int = 1) -> dict:
    paths = {p: {"recall@5": 0.01 * i, "recall@10": 0.02 * i, "recall@20": 0.03 * i, "ndcg@5": 0.004 * i,
                 "ndcg@10": 0.005 * i, "ndcg@20": 0.006 * i, "mrr": 0.007 * i, "n": 100.0}
             for i, p in enumerate(("sid", "ann", "l0l1", "popularity"), 1)}
    return {
        "split": split, "test_split": split == "test", "previous_test_reports": [], "step": 7,
        "variant": layout, "layout": layout,
        "protocol": {"ks": [5, 10, 20], "cases": 100, "catalogue_items": 50, "split_kind": "loo",
                     "history_excluded": False, "beam_width": 20, "diversity_lambda": 0.0, "overretrieve": 3,
                     "context_len": 10},
        "paths": paths,
        "ranking": {"auc": {"view": 0.61, "like": 0.62}, "hit@3": 0.77, "n_slates": 9, "n_items": 40},
        "sid_diagnostics": {"history_tokens_per_item": tpi, "distinct_first_codes": 3.5},
        "sweeps": {
            "beam": [{"beam_width": w, "lambda": 0.0, "recall@10": r, "distinct_first_codes": 2.0}
                     for w, r in ((50, 0.3), (10, 0.1), (20, 0.2))],
            "lambda": [{"lambda": x, "beam_width": 20, "recall@10": r, "distinct_first_codes": d}
                       for x, r, d in ((0.0, 0.2, 2.0), (0.5, 0.21, 4.0), (1.0, 0.19, 7.5), (2.0, 0.15, 11.0))],
            "context": [{"context_len": c, "history_tokens": c * tpi, "sid/recall@10": 0.01 * c,
                         "ann/recall@10": 0.02 * c} for c in (2, 5, 10)],
        },
    }


def _lines(fig) -> list[tuple[np.ndarray, np.ndarray]]:  # type: ignore[no-untyped-def]
    return [(np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float))
            for ax in fig.axes for ln in ax.get_lines()]


def test_figures_plot_the_json_numbers() -> None:
    rep = _report()
    (x, y), = _lines(R.figure_beam(rep))
    np.testing.assert_array_equal(x, [10, 20, 50])  # sorted by beam width
    np.testing.assert_array_equal(y, [0.1, 0.2, 0.3])
    (x1, y1), (x2, y2) = _lines(R.figure_lambda(rep))
    np.testing.assert_array_equal(x1, [0, 0.5, 1, 2])
    np.testing.assert_array_equal(y1, [0.2, 0.21, 0.19, 0.15])
    np.testing.assert_array_equal(y2, [2, 4, 7.5, 11])
    (cx, sid), (_, ann) = _lines(R.figure_context(rep))
    np.testing.assert_array_equal(cx, [2, 5, 10])
    np.testing.assert_allclose(sid, [0.02, 0.05, 0.1])
    np.testing.assert_allclose(ann, [0.04, 0.1, 0.2])


def test_render_redraws_from_changed_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "eval-test-step7.json"
    path.write_text(json.dumps(_report()))
    drawn: dict[str, list] = {}
    real_save = R.save_figure

    def spy(fig, out):  # type: ignore[no-untyped-def]
        drawn[Path(out).name] = _lines(fig)
        return real_save(fig, out)

    monkeypatch.setattr(R, "save_figure", spy)
    files = R.render(path)
    assert {"json", "md", "beam", "lambda", "context", "tokens"} <= set(files)
    assert all(p.exists() and p.stat().st_size > 0 for p in files.values())
    assert files["beam"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    np.testing.assert_array_equal(drawn["eval-test-step7-beam.png"][0][1], [0.1, 0.2, 0.3])
    # change one measured number in the JSON: the regenerated plot follows it
    rep = json.loads(path.read_text())
    rep["sweeps"]["beam"][1]["recall@10"] = 0.9  # beam width 10
    rep["sweeps"]["lambda"][3]["distinct_first_codes"] = 16.0
    path.write_text(json.dumps(rep))
    drawn.clear()
    R.render(path)
    np.testing.assert_array_equal(drawn["eval-test-step7-beam.png"][0][1], [0.9, 0.2, 0.3])
    np.testing.assert_array_equal(drawn["eval-test-step7-lambda.png"][1][1], [2, 4, 7.5, 16])
    md = files["md"].read_text()  # the markdown is regenerated too
    assert "| 10 | 2.0000 | 0.0000 | 0.9000 |" in md and "| 2.0000 | 20 | 16.0000 | 0.1500 |" in md


def test_token_efficiency_pinger_vs_tiger(tmp_path: Path) -> None:
    pinger, tiger = _report(layout="pinger", tpi=1), _report(layout="tiger", tpi=4)
    tiger["sweeps"]["context"] = [{"context_len": c, "history_tokens": 4 * c, "sid/recall@10": 0.015 * c}
                                  for c in (2, 5, 10)]
    (px, py), (tx, ty) = _lines(R.figure_tokens([pinger, tiger]))
    np.testing.assert_array_equal(px, [2, 5, 10])
    np.testing.assert_array_equal(tx, [8, 20, 40])
    np.testing.assert_allclose(ty, [0.03, 0.075, 0.15])
    # a report without a context sweep contributes its one setting: context_len x tokens per item
    del tiger["sweeps"]["context"]
    (_, _), (tx, ty) = _lines(R.figure_tokens([pinger, tiger]))
    np.testing.assert_array_equal(tx, [40])
    np.testing.assert_allclose(ty, [0.02])
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(pinger))
    b.write_text(json.dumps(tiger))
    R.main(["tokens", str(a), str(b), "-o", str(tmp_path / "tok.png")])
    assert (tmp_path / "tok.png").read_bytes()[:4] == b"\x89PNG"


def test_markdown_table_and_errors(tmp_path: Path) -> None:
    md = R.markdown(_report())
    assert "**Test split**" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| L0+L1"))
    assert row.split("|")[1:8] == [" L0+L1 (union, ranked) ", " 0.0300 ", " 0.0600 ", " 0.0900 ", " 0.0120 ",
                                   " 0.0150 ", " 0.0180 "]
    assert "| 0.6100 | 0.6200 | 0.7700 |" in md
    assert "Test split" not in R.markdown(_report(split="valid"))
    rep = _report()
    del rep["sweeps"]["beam"]
    with pytest.raises(DataError, match="beam"):
        R.figure_beam(rep)
    bad = tmp_path / "bad.json"
    bad.write_text('{"split": "test",\n "paths": ]')
    with pytest.raises(DataError, match="bad.json:2"):
        R.render(bad)


def test_trained_context_plot_reads_the_ladders(tmp_path: Path) -> None:
    """Rungs that trained at their own context, from two ladder outputs (one layout each); a rung with no score
    (failed) is left out; the figure's lines are the recalls and peak memory of the JSON, in context order."""
    def ladder(layout: str, ctxs: tuple[int, ...], failed: int | None = None) -> dict:
        rungs = [{"name": f"{layout}-{c}", "overrides": [f"variant={layout}", f"data.context_len={c}"]} for c in ctxs]
        scored = [c for c in ctxs if c != failed]
        rows = [{"rung": f"{layout}-{c}", "valid/sid/recall@10": c / 1e4,
                 **({"valid/ann/recall@10": c / 5e3} if layout == "pinger" else {})} for c in scored]
        train = [{"rung": f"{layout}-{c}", "peak_mem_mib": 8.0 * c, "items_per_s": 1e3 + c, "steps": 4} for c in ctxs]
        return {"ladder": {"rungs": rungs}, "rows": rows, "train": train}

    lads = [ladder("tiger", (200, 50)), ladder("pinger", (50, 2000, 200), failed=2000)]
    pts = R.trained_context_points(lads)
    assert [(q["layout"], q["context"]) for q in pts] == [("pinger", 50), ("pinger", 200), ("tiger", 50), ("tiger", 200)]
    lines = _lines(R.figure_trained_context(pts))
    mem = ([50, 200], [400 / 1024, 1600 / 1024])  # recall axis: pinger SID, ANN, tiger SID; then memory
    want = [([50, 200], [0.005, 0.02]), ([50, 200], [0.01, 0.04]), ([50, 200], [0.005, 0.02]), mem, mem]
    assert len(lines) == len(want)
    for (x, y), (wx, wy) in zip(lines, want):
        np.testing.assert_allclose(x, wx)
        np.testing.assert_allclose(y, wy)
    paths = [tmp_path / f"{i}.json" for i in range(2)]
    for p, lad in zip(paths, lads):
        p.write_text(json.dumps(lad))
    R.main(["context", *map(str, paths), "-o", str(tmp_path / "c.png")])
    assert (tmp_path / "c.png").stat().st_size > 1000
    with pytest.raises(DataError, match="no rung"):
        R.trained_context_points([{"ladder": {"rungs": []}}])
