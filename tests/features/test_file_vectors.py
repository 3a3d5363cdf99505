"""``file:`` content vectors: Parquet (list column or v0..vd), .npy + item_ids.npy, and every error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genrec.errors import ConfigError, DataError, MissingDataError
from genrec.features.content import content_vectors

IDS = [5, 3, 9, 7]


def items() -> pa.Table:
    return pa.table({"item_id": pa.array(IDS, pa.int64()), "text": ["a", "b", "c", "d"]})


def file_rows() -> tuple[list[int], np.ndarray]:
    """Rows in a different order from the catalogue, plus one item (11) not in it."""
    ids = [9, 11, 5, 7, 3]
    vecs = np.arange(len(ids) * 3, dtype=np.float32).reshape(len(ids), 3) + 0.5
    return ids, vecs


def expected() -> np.ndarray:
    ids, vecs = file_rows()
    return np.stack([vecs[ids.index(i)] for i in IDS])


def write_list_parquet(path: Path, ids: list[int], vecs: list[list[float] | None]) -> Path:
    pq.write_table(pa.table({"item_id": pa.array(ids, pa.int64()),
                             "vector": pa.array(vecs, pa.list_(pa.float32()))}), path)
    return path


def test_parquet_list_column_aligned(tmp_path: Path) -> None:
    ids, vecs = file_rows()
    p = write_list_parquet(tmp_path / "v.parquet", ids, vecs.tolist())
    out = content_vectors(items(), f"file:{p}")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected())


def test_parquet_v_columns_aligned(tmp_path: Path) -> None:
    ids, vecs = file_rows()
    cols = {"item_id": pa.array(ids, pa.int64())}
    for j in (2, 0, 1):  # column order in the file does not matter
        cols[f"v{j}"] = pa.array(vecs[:, j])
    pq.write_table(pa.table(cols), tmp_path / "v.parquet")
    np.testing.assert_array_equal(content_vectors(items(), f"file:{tmp_path / 'v.parquet'}"), expected())


def test_npy_aligned(tmp_path: Path) -> None:
    ids, vecs = file_rows()
    np.save(tmp_path / "vecs.npy", vecs)
    np.save(tmp_path / "item_ids.npy", np.array(ids))
    np.testing.assert_array_equal(content_vectors(items(), f"file:{tmp_path / 'vecs.npy'}"), expected())


def test_dim_projects_down_and_none_keeps(tmp_path: Path) -> None:
    ids, vecs = file_rows()
    p = write_list_parquet(tmp_path / "v.parquet", ids, vecs.tolist())
    assert content_vectors(items(), f"file:{p}", dim=None).shape == (4, 3)
    assert content_vectors(items(), f"file:{p}", dim=8).shape == (4, 3)  # upper bound
    assert content_vectors(items(), f"file:{p}", dim=2).shape == (4, 2)


def test_missing_item_names_id_and_file(tmp_path: Path) -> None:
    p = write_list_parquet(tmp_path / "v.parquet", [5, 9, 7], [[1.0], [2.0], [3.0]])
    with pytest.raises(DataError, match=r"v\.parquet.*first missing item_id 3"):
        content_vectors(items(), f"file:{p}")


def test_duplicate_names_row(tmp_path: Path) -> None:
    p = write_list_parquet(tmp_path / "v.parquet", [5, 3, 9, 3, 7], [[1.0]] * 5)
    with pytest.raises(DataError, match=r"v\.parquet:4: field 'item_id': duplicate item_id 3"):
        content_vectors(items(), f"file:{p}")


def test_nan_names_row(tmp_path: Path) -> None:
    p = write_list_parquet(tmp_path / "v.parquet", IDS, [[1.0, 2.0], [1.0, 2.0], [np.nan, 1.0], [0.0, 1.0]])
    with pytest.raises(DataError, match=r"v\.parquet:3: field 'vector': .*NaN"):
        content_vectors(items(), f"file:{p}")


def test_ragged_names_row(tmp_path: Path) -> None:
    p = write_list_parquet(tmp_path / "v.parquet", IDS, [[1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [0.0]])
    with pytest.raises(DataError, match=r"v\.parquet:4: field 'vector': ragged"):
        content_vectors(items(), f"file:{p}")


def test_null_vector_and_null_value(tmp_path: Path) -> None:
    p = write_list_parquet(tmp_path / "a.parquet", IDS, [[1.0], None, [1.0], [1.0]])
    with pytest.raises(DataError, match=r"a\.parquet:2: field 'vector': null vector"):
        content_vectors(items(), f"file:{p}")
    p = write_list_parquet(tmp_path / "b.parquet", IDS, [[1.0, 2.0], [1.0, 2.0], [1.0, None], [1.0, 2.0]])
    with pytest.raises(DataError, match=r"b\.parquet:3: field 'vector': null value"):
        content_vectors(items(), f"file:{p}")


def test_v_columns_with_gap_or_null(tmp_path: Path) -> None:
    pq.write_table(pa.table({"item_id": pa.array(IDS, pa.int64()), "v0": [1.0] * 4, "v2": [1.0] * 4}),
                   tmp_path / "gap.parquet")
    with pytest.raises(DataError, match="no gaps"):
        content_vectors(items(), f"file:{tmp_path / 'gap.parquet'}")
    pq.write_table(pa.table({"item_id": pa.array(IDS, pa.int64()), "v0": [1.0, None, 1.0, 1.0]}),
                   tmp_path / "null.parquet")
    with pytest.raises(DataError, match=r"null\.parquet:2: field 'v0'"):
        content_vectors(items(), f"file:{tmp_path / 'null.parquet'}")


def test_npy_errors(tmp_path: Path) -> None:
    np.save(tmp_path / "vecs.npy", np.ones((4, 2), np.float32))
    with pytest.raises(MissingDataError, match="item_ids.npy"):
        content_vectors(items(), f"file:{tmp_path / 'vecs.npy'}")
    np.save(tmp_path / "item_ids.npy", np.array([5, 3, 9]))
    with pytest.raises(DataError, match="3 item ids but 4 vectors"):
        content_vectors(items(), f"file:{tmp_path / 'vecs.npy'}")
    np.save(tmp_path / "item_ids.npy", np.array([5, 3, 5, 7]))
    with pytest.raises(DataError, match=r"item_ids\.npy:3: field 'item_id': duplicate item_id 5"):
        content_vectors(items(), f"file:{tmp_path / 'vecs.npy'}")
    ragged = np.empty(4, dtype=object)
    ragged[:] = [[1.0], [1.0, 2.0], [1.0], [1.0]]
    np.save(tmp_path / "rag.npy", ragged, allow_pickle=True)
    with pytest.raises(DataError, match="ragged"):
        content_vectors(items(), f"file:{tmp_path / 'rag.npy'}")


def test_missing_file_and_bad_suffix(tmp_path: Path) -> None:
    with pytest.raises(MissingDataError, match="does not exist"):
        content_vectors(items(), f"file:{tmp_path / 'nope.parquet'}")
    (tmp_path / "v.csv").write_text("item_id,v0\n")
    with pytest.raises(ConfigError, match="parquet or .npy"):
        content_vectors(items(), f"file:{tmp_path / 'v.csv'}")
