"""A work directory prepared again over a trained one: its later stages (item features and what was built on
them) belong to the old tables, and loading them is refused with what to rerun (audit: a dataset with as many
actions would have been served silently with the old item vectors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from genrec.errors import ConfigError


def test_features_from_other_tables_are_refused(tmp_path: Path, datasets_root: Path) -> None:
    from genrec.pipeline import build_item_features, load_catalog, prepare

    if not (datasets_root / "movielens-100k").is_dir():
        pytest.skip("movielens-100k not available")
    wd = tmp_path / "wd"
    prepare(wd, "movielens-100k", data_dir=datasets_root)
    build_item_features(wd, content_dim=16, engagement_dim=8)
    assert len(load_catalog(wd, with_sids=False).item_ids) > 0  # same tables: loads
    src = tmp_path / "e.csv"
    src.write_text("user_id,item_id,timestamp,action\n" + "".join(f"{u},{i},{t},view\n" for t, (u, i) in
                                                                 enumerate([(1, 1), (1, 2), (2, 1), (2, 3)])))
    prepare(wd, "generic", source=src)  # another dataset over the same work directory
    with pytest.raises(ConfigError, match="prepared again since") as e:
        load_catalog(wd, with_sids=False)
    assert "features build" in str(e.value)
