"""Data without text (issue 36): MovieLens 100K (its first 500 movies: 65,909 ratings) ingested as generic data
whose items file has empty title and text columns. `genrec features build` flags the text as degenerate in its
manifest, and `genrec sid build` then quantises the engagement vectors by default -- saying so, and in
stats.json -- while an explicit `--source content` still builds content SIDs, with a warning."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from genrec.cli import app
from genrec.errors import ConfigError
from genrec.sid.build import build_sids, choose_sid_source, new_item_vectors, sid_input_vectors

faiss.omp_set_num_threads(1)
N_ITEMS = 500


@pytest.fixture(scope="module")
def titleless(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> tuple[Path, str]:
    """A run directory with MovieLens 100K's ratings of movies 1-500, those 500 items with blank titles and texts,
    and item features built by the CLI; returns it with `features build`'s stderr. (500, not all 1682 movies:
    TF-IDF over 1682 'item <id>' placeholders takes an exact SVD of a minute on 2 cores.)"""
    from genrec.recipes.pipeline import prepare

    raw = data_root / "movielens-100k"
    src = tmp_path_factory.mktemp("titleless")
    ratings = np.loadtxt(raw / "u.data", dtype=np.int64)  # user item rating timestamp
    ratings = ratings[ratings[:, 1] <= N_ITEMS]
    with open(src / "events.csv", "w") as f:
        f.write("user_id,item_id,timestamp,action\n")
        f.writelines(f"{u},{i},{t},rate\n" for u, i, _, t in ratings.tolist())
    (src / "items.csv").write_text("item_id,title,text\n" + "".join(f"{i},,\n" for i in range(1, N_ITEMS + 1)))
    wd = src / "wd"
    prepare(wd, "generic", source=src / "events.csv")
    r = CliRunner().invoke(app, ["features", "build", str(wd), "--content-dim", "16", "--engagement-dim", "8"])
    assert r.exit_code == 0, r.output
    return wd, r.stderr


def _sid_build(wd: Path, *args: str) -> tuple[dict, dict, np.ndarray, str]:
    """`genrec sid build WORKDIR --levels 2 ARGS` -> (stdout JSON, stats.json, codes, stderr)."""
    r = CliRunner().invoke(app, ["sid", "build", str(wd), "--levels", "2", *args])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    v = wd / "sid" / out["version"]
    return out, json.loads((v / "stats.json").read_text()), np.load(v / "codes.npy"), r.stderr


def test_features_build_flags_the_blank_text(titleless: tuple[Path, str]) -> None:
    wd, stderr = titleless
    q = json.loads((wd / "features" / "manifest.json").read_text())["text_quality"]
    assert q["items"] == N_ITEMS and q["with_text"] == 0 and q["coverage"] == 0.0 and q["distinct_ratio"] == 0.0
    assert q["degenerate"] and q["content_from_text"] and q["placeholder_examples"][0] == "item 1"
    assert "warning: the item text is degenerate" in stderr and "coverage 0.0%" in stderr
    assert "--source" in stderr


def test_default_sid_source_on_blank_text_is_engagement(titleless: tuple[Path, str]) -> None:
    wd, _ = titleless
    out, stats, codes, stderr = _sid_build(wd)
    assert out["source"] == "engagement"
    assert "item text is degenerate" in stderr and "coverage 0.0%" in stderr and "engagement vectors" in stderr
    assert stats["source"]["used"] == "engagement" and stats["source"]["item_text"] == "degenerate"
    assert "coverage 0.0%" in stats["source"]["why"] and stats["source"]["text_quality"]["coverage"] == 0.0
    man = json.loads((wd / "sid" / out["version"] / "manifest.json").read_text())
    assert man["inputs"]["source"] == "engagement"

    # the same codes as an explicit engagement build, other codes than a content build (which warns)
    out_e, stats_e, codes_e, stderr_e = _sid_build(wd, "--source", "engagement")
    np.testing.assert_array_equal(codes, codes_e)
    assert stats_e["source"]["used"] == "engagement" and "warning" not in stderr_e
    out_c, stats_c, codes_c, stderr_c = _sid_build(wd, "--source", "content")
    assert out_c["source"] == "content" and stats_c["source"]["used"] == "content"
    assert "warning: --source content on degenerate item text" in stderr_c and "coverage 0.0%" in stderr_c
    assert any("degenerate item text" in w for w in stats_c["warnings"])
    assert not np.array_equal(codes[:, :-1], codes_c[:, :-1])


def test_library_call_falls_back_like_the_cli(titleless: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    """`genrec.build_semantic_ids` (what the quickstart calls) chooses the source as `genrec sid build` does."""
    from genrec.recipes import pipeline

    wd, _ = titleless
    sb = pipeline.build_semantic_ids(wd)
    assert sb.stats["source"]["used"] == "engagement"
    assert "item text is degenerate" in capsys.readouterr().err


def test_engagement_source_quantises_the_engagement_vectors(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    c, e = rng.standard_normal((50, 6)).astype(np.float32), rng.standard_normal((50, 4)).astype(np.float32)
    np.testing.assert_array_equal(sid_input_vectors(c, e, "engagement"), e)
    with pytest.raises(ConfigError, match="needs the engagement vectors"):
        sid_input_vectors(c, None, "engagement")
    sb = build_sids(e, np.arange(50), tmp_path / "sid", levels=2, codebook_size=4, niter=5,
                    inputs={"source": "engagement"})
    assert sb.stats["source"] == {"used": "engagement", "vectors": "the engagement vectors",
                                  "item_text": "not checked"}
    with pytest.raises(ConfigError, match="sid assign"):  # a new item has no engagement to be coded from
        new_item_vectors(sb.path, c[:2], sb.quantizer.dim)


def test_choose_sid_source() -> None:
    bad = {"degenerate": True, "content_from_text": True, "coverage": 0.0, "with_text": 0, "items": 9,
           "distinct_texts": 0, "distinct_ratio": 0.0, "duplicate_share": 0.0}
    assert choose_sid_source(None) == choose_sid_source({**bad, "degenerate": False}) == choose_sid_source(
        {**bad, "content_from_text": False})  # older features, usable text, content from a file: as before
    assert choose_sid_source(None).source == "content+engagement" and choose_sid_source(None).message is None
    assert choose_sid_source(None, has_engagement=False).source == "content"  # no engagement vectors to add
    auto = choose_sid_source(bad)
    assert auto.source == "engagement" and not auto.loud and "--source content" in (auto.message or "")
    forced = choose_sid_source(bad, "content+engagement")
    assert forced.source == "content+engagement" and forced.loud and "--source content+engagement" in (
        forced.message or "")
    assert choose_sid_source({**bad, "degenerate": False}, "engagement").source == "engagement"
    with pytest.raises(ConfigError, match="--source must be one of"):
        choose_sid_source(None, "text")
