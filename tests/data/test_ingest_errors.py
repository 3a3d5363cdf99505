"""Bad input: each case raises a DataError naming the file, the 1-based line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from genrec.data.ingest import prepare_dataset
from genrec.errors import DataError

U_ITEM = "".join(f"{i}|Movie {i} (1995)|01-Jan-1995||http://x|" + "|".join(["0"] * 18 + ["1"]) + "\n"
                 for i in range(1, 6))


def _ml100k(folder: Path, u_data: str, u_item: str = U_ITEM) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "u.data").write_text(u_data)
    (folder / "u.item").write_bytes(u_item.encode("latin-1"))
    return folder


def _good_rows(n: int) -> list[str]:
    return [f"{1 + k % 7}\t{1 + k % 5}\t{1 + k % 5}\t{880000000 + k}" for k in range(n)]


def _expect(exc: pytest.ExceptionInfo[DataError], path: Path, line: int, field: str | None) -> None:
    e = exc.value
    assert e.path == str(path), str(e)
    assert e.line == line, str(e)
    assert e.field == field, str(e)
    msg = str(e)
    assert msg.startswith(f"{path}:{line}: ")
    if field is not None:
        assert f"field {field!r}" in msg


def test_truncated_last_line(tmp_path: Path) -> None:
    rows = _good_rows(3000)
    text = "\n".join(rows) + "\n" + "3\t2"  # last record cut after the item id
    f = _ml100k(tmp_path, text)
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-100k", f)
    _expect(ei, f / "u.data", 3001, "rating")
    assert "truncated" in str(ei.value)


def test_wrong_delimiter(tmp_path: Path) -> None:
    f = _ml100k(tmp_path, "\n".join(r.replace("\t", ",") for r in _good_rows(10)) + "\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-100k", f)
    _expect(ei, f / "u.data", 1, "item_id")
    assert "wrong delimiter" in str(ei.value) and "','" in str(ei.value)


def test_non_integer_id_deep_in_file(tmp_path: Path) -> None:
    rows = _good_rows(5000)
    rows[4320] = "22\tabc\t1\t878887116"
    f = _ml100k(tmp_path, "\n".join(rows) + "\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-100k", f)
    _expect(ei, f / "u.data", 4321, "item_id")
    assert "'abc'" in str(ei.value)


def test_nan_rating_and_negative_id(tmp_path: Path) -> None:
    rows = _good_rows(20)
    rows[5] = "1\t2\tnan\t5"
    f = _ml100k(tmp_path / "a", "\n".join(rows) + "\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-100k", f)
    _expect(ei, f / "u.data", 6, "rating")
    rows = _good_rows(20)
    rows[9] = "-4\t2\t3\t5"
    f = _ml100k(tmp_path / "b", "\n".join(rows) + "\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-100k", f)
    _expect(ei, f / "u.data", 10, "user_id")


def test_non_integer_id_dat(tmp_path: Path) -> None:
    (tmp_path / "movies.dat").write_text("1::A (1990)::Drama\n")
    (tmp_path / "ratings.dat").write_text("1::1::5::10\n1::1::4::11\n2::x1::4::11\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-10m", tmp_path)
    _expect(ei, tmp_path / "ratings.dat", 3, "MovieID")


def test_missing_column(tmp_path: Path) -> None:
    (tmp_path / "ratings.csv").write_text("userId,movieId,timestamp\n1,1,5\n")
    (tmp_path / "movies.csv").write_text("movieId,title,genres\n1,A (1990),Drama\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-latest-small", tmp_path)
    _expect(ei, tmp_path / "ratings.csv", 1, "rating")
    assert "header lacks column 'rating'" in str(ei.value)


def test_missing_column_movies_csv(tmp_path: Path) -> None:
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,1,4,5\n")
    (tmp_path / "movies.csv").write_text("movieId,genres\n1,Drama\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-latest-small", tmp_path)
    _expect(ei, tmp_path / "movies.csv", 1, "title")


@pytest.mark.parametrize("layout", ["100k", "csv", "dat"])
def test_duplicate_item_ids(tmp_path: Path, layout: str) -> None:
    if layout == "100k":
        f = _ml100k(tmp_path, "1\t1\t4\t5\n", U_ITEM + U_ITEM.splitlines(keepends=True)[2])
        path, name, field = f / "u.item", "movielens-100k", "movie id"
        line = 6
    elif layout == "csv":
        (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,1,4,5\n")
        (tmp_path / "movies.csv").write_text("movieId,title,genres\n1,A (1990),Drama\n2,B,Drama\n1,C,Drama\n")
        path, name, field, line = tmp_path / "movies.csv", "movielens-latest-small", "movieId", 4
    else:
        (tmp_path / "ratings.dat").write_text("1::1::4::5\n")
        (tmp_path / "movies.dat").write_text("1::A (1990)::Drama\n1::B::Drama\n")
        path, name, field, line = tmp_path / "movies.dat", "movielens-10m", "MovieID", 2
    with pytest.raises(DataError) as ei:
        prepare_dataset(name, tmp_path)
    _expect(ei, path, line, field)
    assert "duplicate item id" in str(ei.value)


@pytest.mark.parametrize("which", ["u.data", "u.item"])
def test_empty_file(tmp_path: Path, which: str) -> None:
    f = _ml100k(tmp_path, "" if which == "u.data" else "1\t1\t4\t5\n", "" if which == "u.item" else U_ITEM)
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-100k", f)
    _expect(ei, f / which, 1, "user_id" if which == "u.data" else "movie id")
    assert "empty" in str(ei.value)


def test_empty_csv_with_header_only(tmp_path: Path) -> None:
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n")
    (tmp_path / "movies.csv").write_text("movieId,title,genres\n1,A (1990),Drama\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-latest-small", tmp_path)
    _expect(ei, tmp_path / "ratings.csv", 2, "userId")


def test_event_item_not_in_items(tmp_path: Path) -> None:
    rows = _good_rows(50)
    rows[41] = "3\t99\t4\t5"
    f = _ml100k(tmp_path, "\n\n".join(rows) + "\n")  # blank lines between records: line numbers still exact
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-100k", f)
    _expect(ei, f / "u.data", 83, "item_id")
    assert "movie 99" in str(ei.value)


def test_bad_genre_flag(tmp_path: Path) -> None:
    bad = U_ITEM.replace("|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|1\n", "|0|0|2|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|1\n", 1)
    f = _ml100k(tmp_path, "1\t1\t4\t5\n", bad)
    with pytest.raises(DataError) as ei:
        prepare_dataset("movielens-100k", f)
    _expect(ei, f / "u.item", 1, "Adventure")  # third flag = u.genre index 2


def test_amazon_bad_inputs(tmp_path: Path) -> None:
    (tmp_path / "sequential_data.txt").write_text("1 1 2\r\n2 3 x4\r\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("amazon-p5", tmp_path)
    _expect(ei, tmp_path / "sequential_data.txt", 2, "item_id (position 2)")
    (tmp_path / "sequential_data.txt").write_text("1 1 2\r\n1 3 4\r\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("amazon-p5", tmp_path)
    _expect(ei, tmp_path / "sequential_data.txt", 2, "user_id")


def test_amazon_synthesises_missing_items(tmp_path: Path) -> None:
    import gzip
    import json

    (tmp_path / "sequential_data.txt").write_text("1 1 2\r\n2 2 3\r\n")
    lines = [{"asin": "A1", "item_id": 1, "title": "Soap &amp; Co", "categories": [["Beauty"]]},
             {"asin": "A2", "item_id": 2, "title": None, "categories": [["Beauty", "Skin"]], "brand": "B"}]
    (tmp_path / "item_text.jsonl.gz").write_bytes(gzip.compress("\n".join(json.dumps(x) for x in lines).encode()))
    ds = prepare_dataset("amazon-p5", tmp_path)
    items = {r["item_id"]: r for r in ds.items.to_pylist()}
    assert items[1]["title"] == "Soap & Co" and json.loads(items[1]["attributes"])["title_raw"] == "Soap &amp; Co"
    assert items[2]["text"] == "Amazon item A2. Brand: B. Categories: Beauty > Skin"
    assert json.loads(items[3]["attributes"])["synthesised"] is True
    assert ds.info.extra["counts"]["synthesised_items"] == 1
    lines.append(lines[0])
    (tmp_path / "item_text.jsonl.gz").write_bytes(gzip.compress("\n".join(json.dumps(x) for x in lines).encode()))
    with pytest.raises(DataError) as ei:
        prepare_dataset("amazon-p5", tmp_path)
    _expect(ei, tmp_path / "item_text.jsonl.gz", 3, "item_id")


def test_taobao_unknown_behavior(tmp_path: Path) -> None:
    (tmp_path / "UserBehavior.csv").write_text("1,2,3,pv,100\n1,3,3,like,101\n")
    with pytest.raises(DataError) as ei:
        prepare_dataset("taobao", tmp_path)
    _expect(ei, tmp_path / "UserBehavior.csv", 2, "behavior_type")
    assert "'like'" in str(ei.value)


def test_taobao_items_most_frequent_category(tmp_path: Path) -> None:
    import json

    rows = ["1,5,30,pv,1", "1,5,20,pv,2", "2,5,30,pv,3", "2,6,9,buy,4", "2,7,4,pv,5", "3,7,2,pv,6"]
    (tmp_path / "UserBehavior.csv").write_text("\n".join(rows) + "\n")
    ds = prepare_dataset("taobao", tmp_path)
    items = {r["item_id"]: r for r in ds.items.to_pylist()}
    assert json.loads(items[5]["attributes"]) == {"category_id": 30, "category_ids": [20, 30]}
    assert json.loads(items[6]["attributes"]) == {"category_id": 9}
    assert json.loads(items[7]["attributes"])["category_id"] == 2  # tie 1-1 -> smallest id
    assert items[6]["text"] == "Taobao item 6. Category 9" and items[6]["title"] is None
