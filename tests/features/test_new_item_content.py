"""Content vectors for items that came after `genrec features build` (the daily cycle's new items): the features'
encoder refitted, checked against the stored vectors, and applied to the new items -- so a new item lands where
the same text would have landed at build time, and the frozen SID codebooks read it in the space they were
fitted in."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genrec.data.schema import ITEMS_SCHEMA
from genrec.errors import DataError
from genrec.features.build import build_features
from genrec.features.content import content_encoder
from genrec.features.extend import new_item_content

WORDS = ["space", "star", "galaxy", "love", "heart", "kiss", "murder", "detective", "crime", "dragon", "magic",
         "sword", "laugh", "party", "war", "army"]


def _items(ids: list[int], seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=4).tolist()) + f" film {i}" for i in ids]
    return pa.table({"item_id": pa.array(ids, pa.int64()), "title": [f"t{i}" for i in ids], "text": texts,
                     "attributes": [json.dumps({}) for _ in ids]}, schema=ITEMS_SCHEMA)


def _events(ids: list[int]) -> pa.Table:
    rng = np.random.default_rng(1)
    n = 400
    return pa.table({"user_id": pa.array(rng.integers(0, 40, n), pa.int64()),
                     "item_id": pa.array(rng.choice(ids, n), pa.int64()),
                     "seq": pa.array(np.arange(n) % 10, pa.int32())})


@pytest.mark.parametrize("spec", ["tfidf", "file"])
def test_the_encoder_gives_back_the_fitted_items_vectors(spec: str, tmp_path: Path) -> None:
    """The fold-in of a fitted item is the fitted item's own vector (exact SVD, as catalogues up to 2,000 items
    get): the encoder carried over maps into the same space, not a new one."""
    items = _items(list(range(1, 61)))
    if spec == "file":
        rng = np.random.default_rng(3)
        pq.write_table(pa.table({"item_id": pa.array(range(1, 61), pa.int64()),
                                 "vector": pa.array(rng.normal(size=(60, 24)).tolist(), pa.list_(pa.float32()))}),
                       tmp_path / "v.parquet")
        spec = f"file:{tmp_path / 'v.parquet'}"
    vecs, encode = content_encoder(items, spec, dim=8, seed=0)
    again = encode(items.take(pa.array([5, 0, 33])))
    np.testing.assert_allclose(again, vecs[[5, 0, 33]], atol=1e-5)


def test_new_items_in_the_features_space(tmp_path: Path) -> None:
    old_ids = list(range(1, 81))
    items1 = _items(old_ids)
    build_features(items1, _events(old_ids), tmp_path / "features", content="tfidf", content_dim=12,
                   engagement_dim=4, seed=0)
    stored = np.load(tmp_path / "features" / "content.npy")
    # day 2: two new items, one with exactly the text of an old one (it must get that item's vector)
    twin_of = 17
    new = pa.table({"item_id": pa.array([500, 501], pa.int64()), "title": ["n0", "n1"],
                    "text": [items1.column("text")[twin_of - 1].as_py(), "dragon magic sword party film 501"],
                    "attributes": ["{}", "{}"]}, schema=ITEMS_SCHEMA)
    items2 = pa.concat_tables([items1, new])
    ids, content = new_item_content(tmp_path / "features", items2)
    assert ids.tolist() == [500, 501] and content.shape == (2, stored.shape[1])
    np.testing.assert_allclose(content[0], stored[twin_of - 1], atol=1e-5)
    assert abs(float(np.linalg.norm(content[1])) - 1.0) < 1e-5  # L2-normalised like every TF-IDF vector
    # items a SID version already codes are left out
    ids, _ = new_item_content(tmp_path / "features", items2, exclude=np.array([500]))
    assert ids.tolist() == [501]
    none_ids, none = new_item_content(tmp_path / "features", items1)
    assert none_ids.size == 0 and none.shape == (0, stored.shape[1])


def test_refused_when_the_featured_text_changed(tmp_path: Path) -> None:
    ids = list(range(1, 41))
    items = _items(ids)
    build_features(items, _events(ids), tmp_path / "features", content="tfidf", content_dim=8, engagement_dim=4)
    text = items.column("text").to_pylist()
    text[3] = "something else entirely"
    changed = items.set_column(items.schema.get_field_index("text"), "text", pa.array(text))
    with pytest.raises(DataError, match="does not give back their stored vectors"):
        new_item_content(tmp_path / "features", changed)
    with pytest.raises(DataError, match="not in the items table"):
        new_item_content(tmp_path / "features", items.slice(1))
