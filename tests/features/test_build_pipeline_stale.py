"""A work directory prepared again over a trained one: its later stages (item features and what was built on
them) belong to the old tables, and loading them is refused with what to rerun (audit: a dataset with as many
actions would have been served silently with the old item vectors)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from genrec.errors import ConfigError


def test_features_from_other_tables_are_refused(tmp_path: Path, featured: Callable[..., Path]) -> None:
    from genrec.recipes.pipeline import load_catalog, prepare

    wd = featured("movielens-100k")
    assert len(load_catalog(wd, with_sids=False).item_ids) > 0  # same tables: loads
    src = tmp_path / "e.csv"
    src.write_text("user_id,item_id,timestamp,action\n" + "".join(f"{u},{i},{t},view\n" for t, (u, i) in
                                                                 enumerate([(1, 1), (1, 2), (2, 1), (2, 3)])))
    prepare(wd, "generic", source=src)  # another dataset over the same work directory
    with pytest.raises(ConfigError, match="prepared again since") as e:
        load_catalog(wd, with_sids=False)
    assert "features build" in str(e.value)
