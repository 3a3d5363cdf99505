"""The item-text check of `genrec features build` (issue 36, "data without text"): coverage of real text
(not an id placeholder), distinct ratio and duplicate share, the verdict in the features manifest -- and the
data with real titles (MovieLens 100K, Amazon Beauty) is not flagged, so its default SID source stays content beside engagement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from genrec.features.text_quality import MAX_DUPLICATE_SHARE, measure_text
from tests.synthetic_datasets import is_synthetic, stats

WORDS = ["red", "blue", "green", "matte", "glossy", "mini", "large", "vegan"]
NOUNS = ["lipstick", "shampoo", "mascara", "serum", "cream", "polish", "brush", "toner"]


def _items(texts: list[str], attrs: list[dict] | None = None) -> pa.Table:
    n = len(texts)
    return pa.table({"item_id": pa.array(range(100, 100 + n), pa.int64()), "text": texts,
                     "attributes": [json.dumps(a) for a in (attrs or [{}] * n)]})


TITLES = [f"{WORDS[i % 8]} {NOUNS[i // 8 % 8]} v{i}" for i in range(120)]  # no word in more than 1/8 of them


def test_real_titles_are_usable() -> None:
    q = measure_text(_items(TITLES[:60]))
    assert q["coverage"] == 1.0 and q["distinct_ratio"] == 1.0 and q["duplicate_share"] == 0.0
    assert not q["degenerate"] and q["reasons"] == []


@pytest.mark.parametrize("make", [
    lambda i: (f"item {i}", {}),  # generic: an items file with empty title/text columns
    lambda i: (f"Amazon item B00{i}X", {"asin": f"B00{i}X"}),  # Amazon: no title, brand or categories
    lambda i: ("wireless earbuds", {"synthesised": True}),  # a row the ingestor made up
    lambda i: (f"Product {i}", {"original_id": f"Product {i}"}),  # generic --map-ids: the id as the text
])
def test_id_placeholders_have_no_coverage(make: Callable[[int], tuple[str, dict]]) -> None:
    rows = [make(100 + k) for k in range(60)]
    q = measure_text(_items([t for t, _ in rows], [a for _, a in rows]))
    assert q["with_text"] == 0 and q["coverage"] == 0.0 and q["distinct_ratio"] == 0.0
    assert q["degenerate"] and "0.0% of the 60 items" in q["reasons"][0]


def test_category_only_text_is_degenerate_by_its_distinct_ratio() -> None:
    texts = [f"Amazon item B{i}. Categories: Beauty > {NOUNS[i % 5]}" for i in range(60)]
    q = measure_text(_items(texts, [{"asin": f"B{i}"} for i in range(60)]))
    assert q["coverage"] == 1.0 and q["distinct_texts"] == 5 and q["distinct_ratio"] == round(5 / 60, 4)
    assert q["degenerate"] and any("5 distinct texts for 60 items" in r for r in q["reasons"])
    assert {"amazon", "item", "categories", "beauty"} <= set(q["boilerplate_tokens"])


def test_duplicate_share_threshold() -> None:
    """Titles repeated in pairs by most items: distinct ratio fine, duplicate share over the bar; at the bar: usable."""
    n = 60
    k = int(n * MAX_DUPLICATE_SHARE)  # items in pairs, exactly at the threshold
    at = TITLES[: n - k] + [TITLES[n + i // 2] for i in range(k)]
    q = measure_text(_items(at))
    assert q["duplicate_share"] == MAX_DUPLICATE_SHARE and not q["degenerate"]
    over = TITLES[: n - k - 2] + [TITLES[n + i // 2] for i in range(k + 2)]
    q = measure_text(_items(over))
    assert q["duplicate_share"] > MAX_DUPLICATE_SHARE and q["distinct_ratio"] > 0.5 and q["degenerate"]


def test_movielens_titles_are_not_flagged_and_sid_build_keeps_content(featured: Callable[..., Path]) -> None:
    from genrec.cli import app
    from genrec.sid.build import choose_sid_source, features_text_quality

    wd = featured("movielens-100k")
    q = json.loads((wd / "features" / "manifest.json").read_text())["text_quality"]
    assert q["items"] == 1682 and q["coverage"] == 1.0 and q["distinct_ratio"] > 0.98
    assert q["duplicate_share"] < 0.05 and not q["degenerate"] and q["content_from_text"]
    assert choose_sid_source(features_text_quality(wd / "features")).source == "content+engagement"
    r = CliRunner().invoke(app, ["sid", "build", str(wd), "--levels", "2"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["source"] == "content+engagement" and "degenerate" not in r.stderr
    stats = json.loads((wd / "sid" / "v0001" / "stats.json").read_text())
    assert stats["source"]["used"] == "content+engagement" and stats["source"]["item_text"] == "usable"


def test_beauty_titles_are_not_flagged(tmp_path: Path, data_root: Path) -> None:
    from genrec.recipes.pipeline import open_store, prepare

    folder = data_root / "amazon-beauty-2014"
    prepare(tmp_path / "wd", "amazon-beauty-2014", data_dir=data_root)
    q = measure_text(open_store(tmp_path / "wd").read_items())
    assert q["items"] == (stats(folder)["items"] if is_synthetic(folder) else 12101)
    assert q["coverage"] > 0.99 and q["distinct_ratio"] > 0.95 and not q["degenerate"]


def test_taobao_sample_without_titles_is_flagged(featured: Callable[..., Path]) -> None:
    """Real data without titles: "Taobao item <id>. Category <c>" -- a category id is all the text says."""
    wd = featured("taobao")
    q = json.loads((wd / "features" / "manifest.json").read_text())["text_quality"]
    assert q["degenerate"] and q["duplicate_share"] > 0.8 and q["distinct_ratio"] < 0.2
    assert {"taobao", "item", "category"} <= set(q["boilerplate_tokens"])
