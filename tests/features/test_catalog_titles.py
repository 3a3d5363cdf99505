"""The catalogue's display titles: an item with no title (Taobao logs none) shows its text -- the description its
content vector came from -- instead of an empty column in ``genrec recommend`` (audit)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def test_items_without_titles_show_their_text(featured: Callable[..., Path]) -> None:
    from genrec.catalog import load_catalog, open_store

    wd = featured("taobao")
    items = open_store(wd).read_items()
    text = dict(zip(items.column("item_id").to_pylist(), items.column("text").to_pylist()))
    assert all(t is None for t in items.column("title").to_pylist())  # the data has none
    cat = load_catalog(wd, with_sids=False)
    assert cat.titles is not None and len(cat.titles) == len(cat.item_ids)
    for i, t in zip(cat.item_ids.tolist(), cat.titles):
        assert t == text[i] and t.startswith(f"Taobao item {i}. Category ")


def test_titles_are_kept_and_long_texts_shortened(tmp_path: Path) -> None:
    from genrec.recipes.pipeline import build_item_features, load_catalog, prepare

    src = tmp_path / "d"
    src.mkdir()
    (src / "events.csv").write_text("user_id,item_id,timestamp,action\n" + "".join(
        f"{u},{i},{t},view\n" for t, (u, i) in enumerate([(1, 1), (1, 2), (2, 1), (2, 3), (3, 2), (3, 3)])))
    long = "word " * 40
    (src / "items.csv").write_text(f"item_id,title,text\n1,Named,a named item\n2,,{long.strip()}\n3,,short text\n")
    wd = tmp_path / "wd"
    prepare(wd, "generic", source=src)
    build_item_features(wd, content_dim=2, engagement_dim=2)
    cat = load_catalog(wd, with_sids=False)
    got = dict(zip(cat.item_ids.tolist(), cat.titles))
    assert got[1] == "Named" and got[3] == "short text"
    assert got[2].endswith("...") and len(got[2]) == 83 and long.startswith(got[2][:-3])
