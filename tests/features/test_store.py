"""ItemVectors: round trip, memory mapping, index_of, concat, atomic save under exception and SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.errors import DataError, MissingDataError
from genrec.features import store as store_mod
from genrec.features.store import ItemVectors
from genrec.workdir import clean_stale_tmp, read_json


def make(n: int = 5, dc: int = 3, de: int = 2, seed: int = 0, ids: np.ndarray | None = None) -> ItemVectors:
    rng = np.random.default_rng(seed)
    ids = ids if ids is not None else rng.permutation(np.arange(100, 100 + 3 * n, 3))
    return ItemVectors(item_ids=ids, content=rng.normal(size=(n, dc)).astype(np.float32),
                       engagement=rng.normal(size=(n, de)).astype(np.float32),
                       meta={"inputs": {"items": {"rows": n}}, "params": {"seed": seed}, "note": "x"})


def test_round_trip_memory_mapped(tmp_path: Path) -> None:
    v = make()
    v.save(tmp_path / "features")
    w = ItemVectors.load(tmp_path / "features", verify=True)
    assert isinstance(w.content, np.memmap) and isinstance(w.engagement, np.memmap)
    np.testing.assert_array_equal(w.item_ids, v.item_ids)
    np.testing.assert_array_equal(w.content, v.content)
    np.testing.assert_array_equal(w.engagement, v.engagement)
    m = read_json(tmp_path / "features" / "manifest.json")
    assert m["kind"] == "features" and m["params"] == {"seed": 0} and m["inputs"] == {"items": {"rows": 5}}
    assert m["counts"]["items"] == 5 and m["counts"]["content_dim"] == 3 and m["counts"]["engagement_dim"] == 2
    assert m["extra"] == {"note": "x"} and "numpy" in m["versions"] and set(m["files"]) == set(store_mod.FILES.values())
    assert w.meta["params"] == {"seed": 0} and w.meta["note"] == "x"
    w.save(tmp_path / "again")  # a loaded store saves again without nesting its manifest
    assert "manifest" not in read_json(tmp_path / "again" / "manifest.json")["extra"]


def test_verify_detects_corruption(tmp_path: Path) -> None:
    make().save(tmp_path / "f")
    arr = np.load(tmp_path / "f" / "content.npy")
    arr[0, 0] += 1
    np.save(tmp_path / "f" / "content.npy", arr)
    ItemVectors.load(tmp_path / "f")  # no verify: loads
    with pytest.raises(DataError, match="checksum mismatch for content.npy"):
        ItemVectors.load(tmp_path / "f", verify=True)


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(MissingDataError, match="manifest.json missing"):
        ItemVectors.load(tmp_path / "nothing")
    make().save(tmp_path / "f")
    (tmp_path / "f" / "engagement.npy").unlink()
    with pytest.raises(MissingDataError, match="engagement.npy missing"):
        ItemVectors.load(tmp_path / "f")


def test_constructor_validates() -> None:
    with pytest.raises(DataError, match="duplicate item_id 7"):
        ItemVectors(np.array([7, 8, 7]), np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(DataError, match="engagement must be"):
        ItemVectors(np.array([7, 8]), np.zeros((2, 2), np.float32), np.zeros((3, 2), np.float32))


@settings(max_examples=30, deadline=None)
@given(ids=st.lists(st.integers(-10**12, 10**12), min_size=1, max_size=40, unique=True), data=st.data())
def test_index_of_matches_dict_twin(ids: list[int], data: st.DataObject) -> None:
    v = ItemVectors(np.array(ids), np.zeros((len(ids), 1), np.float32), np.zeros((len(ids), 1), np.float32))
    q = data.draw(st.lists(st.sampled_from(ids), min_size=0, max_size=30))
    twin = {it: i for i, it in enumerate(ids)}
    np.testing.assert_array_equal(v.index_of(np.array(q, dtype=np.int64)), [twin[x] for x in q])
    qq = np.array(q[: len(q) // 2 * 2], dtype=np.int64).reshape(-1, 2)  # shape is kept
    assert v.index_of(qq).shape == qq.shape
    unknown = data.draw(st.integers(-10**12, 10**12).filter(lambda x: x not in twin))
    with pytest.raises(DataError, match=f"first {unknown}"):
        v.index_of(np.array(q + [unknown]))


def test_concat() -> None:
    v = make()
    c = v.concat()
    assert c.shape == (5, 5) and c.dtype == np.float32
    np.testing.assert_array_equal(c[:, :3], v.content)
    np.testing.assert_array_equal(c[:, 3:], v.engagement)
    rows = v.index_of(v.item_ids[::-1])
    np.testing.assert_array_equal(c[rows], c[::-1])


def test_exception_mid_save_keeps_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = make(seed=1)
    old.save(tmp_path / "f")
    calls = {"n": 0}
    real = store_mod._write_array

    def failing(path: Path, arr: np.ndarray) -> str:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        return real(path, arr)

    monkeypatch.setattr(store_mod, "_write_array", failing)
    with pytest.raises(OSError, match="disk full"):
        make(seed=2).save(tmp_path / "f")
    w = ItemVectors.load(tmp_path / "f", verify=True)
    np.testing.assert_array_equal(w.content, old.content)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # temp folder removed


def test_sigkill_mid_save_keeps_previous(tmp_path: Path) -> None:
    """A real kill: the child blocks after writing its first file; the old folder must survive."""
    old = make(seed=1)
    old.save(tmp_path / "f")
    marker = tmp_path / "writing"
    child = textwrap.dedent(f"""
        import time, numpy as np
        from pathlib import Path
        from genrec.features import store
        real = store._write_array
        def slow(path, arr):
            out = real(path, arr)
            Path({str(marker)!r}).touch()
            time.sleep(60)
            return out
        store._write_array = slow
        rng = np.random.default_rng(9)
        v = store.ItemVectors(np.arange(5), rng.normal(size=(5, 3)).astype(np.float32),
                              rng.normal(size=(5, 2)).astype(np.float32))
        v.save(Path({str(tmp_path / "f")!r}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], env=dict(os.environ))
    try:
        deadline = time.time() + 60
        while not marker.exists():
            assert proc.poll() is None, "child exited before reaching the save"
            assert time.time() < deadline, "child never started writing"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    w = ItemVectors.load(tmp_path / "f", verify=True)
    np.testing.assert_array_equal(w.item_ids, old.item_ids)
    np.testing.assert_array_equal(w.content, old.content)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1  # the killed writer's temp folder ...
    assert clean_stale_tmp(tmp_path) == 1  # ... which the cleaner removes
    assert ItemVectors.load(tmp_path / "f").content.shape == (5, 3)
