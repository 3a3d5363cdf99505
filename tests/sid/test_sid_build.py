"""Versioned builds: unique codes, trie/index agree with codes.npy, assign_sids, atomic CURRENT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import faiss
import numpy as np
import pytest

from genrec.errors import ConfigError, DataError, MissingDataError
from genrec.sid import assign_sids, build_sids, default_codebook, default_levels, open_current
from genrec.sid.build import list_versions, open_version, prune_versions
from genrec.sid.rqvae import RQVAE
from genrec.sid.index import SidIndex

faiss.omp_set_num_threads(1)


def _data(n: int = 300, d: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((12, d)) * 3
    x = (centers[rng.integers(0, 12, n)] + rng.standard_normal((n, d))).astype(np.float32)
    ids = rng.choice(100_000, size=n, replace=False).astype(np.int64)
    return x, ids


def _check_consistent(b) -> None:
    codes = np.asarray(b.codes)
    ids = np.asarray(b.item_ids)
    assert len({tuple(r) for r in codes.tolist()}) == len(ids)  # 100% unique full codes
    assert (codes < np.asarray(b.codebook_sizes)).all()
    np.testing.assert_array_equal(b.index.codes_of(ids), codes)
    leaves = b.trie.node_of_prefix(codes)
    assert (leaves >= 0).all() and len(set(leaves.tolist())) == len(ids)
    np.testing.assert_array_equal(np.asarray(b.trie.leaf_items)[leaves], ids)
    for row, i in zip(codes[:50].tolist(), ids[:50].tolist()):
        assert b.index.lookup(row).tolist() == [i]
        assert i in b.index.lookup(row[:1]).tolist()


def test_build_and_open(tmp_path) -> None:
    x, ids = _data()
    b = build_sids(x, ids, tmp_path, levels=2, codebook_size=6, niter=5)
    assert b.version == "v0001" and (tmp_path / "CURRENT").read_text().strip() == "v0001"
    assert b.codes.shape == (300, 3) and b.codebook_sizes[:2] == [6, 6]
    assert b.codebook_sizes[2] == b.stats["max_collision_group"]
    _check_consistent(b)
    s = b.stats
    assert s["unique_rate"] == 1.0 and 0 <= s["collision_rate"] < 1
    assert s["reconstruction"][1]["mse"] < s["reconstruction"][0]["mse"]
    assert [u["level"] for u in s["codebook_use"]] == [0, 1, 2] and 0 < s["codebook_use"][0]["perplexity"] <= 6
    assert isinstance(b.index.keys, np.memmap)
    man = (tmp_path / "v0001" / "manifest.json").read_text()
    assert '"kind": "sid"' in man
    again = open_current(tmp_path)
    np.testing.assert_array_equal(np.asarray(again.codes), np.asarray(b.codes))
    b2 = build_sids(x, ids, tmp_path, levels=2, codebook_size=6, niter=5)  # same inputs -> same codes
    assert b2.version == "v0002" and list_versions(tmp_path) == ["v0001", "v0002"]
    np.testing.assert_array_equal(np.asarray(b2.codes), np.asarray(b.codes))


def test_assign_sids_frozen_codebook(tmp_path) -> None:
    x, ids = _data(400)
    b1 = build_sids(x[:300], ids[:300], tmp_path, levels=2, codebook_size=5, niter=5)
    old_codes = np.asarray(b1.codes).copy()
    # 50 existing (with different vectors: ignored) + 100 new items
    x_req = np.concatenate([x[300:], x[:50] + 5.0])
    id_req = np.concatenate([ids[300:], ids[:50]])
    b2 = assign_sids(tmp_path, x_req, id_req, publish_if_grown=True)
    assert b2.version == "v0002" and open_current(tmp_path).version == "v0002"
    _check_consistent(b2)
    np.testing.assert_array_equal(b2.index.codes_of(ids[:300]), old_codes)  # old items keep their codes
    new = b2.index.codes_of(ids[300:])
    np.testing.assert_array_equal(new[:, :2], b1.quantizer.encode(x[300:]))  # frozen codebooks
    assert b2.stats["assigned"] == {**b2.stats["assigned"], "new": 100, "already_present": 50}
    # old version untouched
    v1 = open_version(tmp_path, "v0001")
    np.testing.assert_array_equal(np.asarray(v1.codes), old_codes)
    assert len(v1.index) == 300 and len(b2.index) == 400
    # assigning the same items again changes nothing and writes no version (servers would reload for nothing)
    b3 = assign_sids(tmp_path, x_req, id_req)
    np.testing.assert_array_equal(b3.index.codes_of(ids), b2.index.codes_of(ids))
    assert b3.version == "v0002" and list_versions(tmp_path) == ["v0001", "v0002"]
    assert b3.stats["assigned"]["unchanged"] and b3.stats["assigned"]["already_present"] == 150


def test_assign_publishes_a_grown_level_unless_held_and_use_switches_back(tmp_path) -> None:
    from genrec.sid.build import set_current

    x, ids = _data(300)
    b1 = build_sids(x[:200], ids[:200], tmp_path, levels=2, codebook_size=5, niter=5)
    # one vector repeated: every copy lands in the same semantic prefix, so the disambiguation level must grow
    many = np.repeat(x[:1], 12, axis=0)
    b2 = assign_sids(tmp_path, many, np.arange(1000, 1012), publish_if_grown=False)  # held
    assert b2.codebook_sizes[-1] > b1.codebook_sizes[-1] and not b2.stats["assigned"]["published"]
    assert open_current(tmp_path).version == "v0001" and list_versions(tmp_path) == ["v0001", "v0002"]
    # by default a grown version is published too (served models reach its new codes through their prefixes)
    b3 = assign_sids(tmp_path, np.repeat(x[:1], 12, axis=0), np.arange(2000, 2012))
    assert b3.codebook_sizes[-1] > b1.codebook_sizes[-1] and b3.stats["assigned"]["published"]
    assert open_current(tmp_path).version == b3.version == "v0003"
    assert set_current(tmp_path, "v0002").version == "v0002" and open_current(tmp_path).version == "v0002"
    with pytest.raises(ConfigError, match="not a version name"):
        set_current(tmp_path, "latest")
    with pytest.raises(MissingDataError, match="v0099"):
        set_current(tmp_path, "v0099")
    assert open_current(tmp_path).version == "v0002"


def test_injected_failure_keeps_current(tmp_path, monkeypatch) -> None:
    x, ids = _data(200)
    build_sids(x, ids, tmp_path, levels=2, codebook_size=4, niter=3)

    def boom(self, folder):  # fails after the trie is already written
        raise RuntimeError("disk full")

    monkeypatch.setattr(SidIndex, "save", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        build_sids(x, ids, tmp_path, levels=2, codebook_size=4, niter=3)
    assert (tmp_path / "CURRENT").read_text().strip() == "v0001"
    assert not (tmp_path / "v0002").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    monkeypatch.undo()
    _check_consistent(open_current(tmp_path))


def test_sigkill_mid_build_keeps_current(tmp_path) -> None:
    x, ids = _data(200)
    build_sids(x, ids, tmp_path, levels=2, codebook_size=4, niter=3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "ids.npy", ids)
    marker = tmp_path / "reached"
    script = textwrap.dedent(f"""
        import time, numpy as np
        from pathlib import Path
        from genrec.sid import build_sids
        from genrec.sid.trie import SidTrie
        orig = SidTrie.save
        def slow_save(self, folder):
            orig(self, folder)
            Path({str(marker)!r}).write_text("x")
            time.sleep(60)
        SidTrie.save = slow_save
        root = Path({str(tmp_path)!r})
        build_sids(np.load(root / "x.npy"), np.load(root / "ids.npy"), root, levels=2, codebook_size=4, niter=3)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 30
        while not marker.exists():
            assert proc.poll() is None, "builder exited early"
            assert time.time() < deadline, "builder never reached the trie write"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "CURRENT").read_text().strip() == "v0001"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-v0002")]  # half-written, never renamed
    assert list_versions(tmp_path) == ["v0001"]
    _check_consistent(open_current(tmp_path))
    b = build_sids(x, ids, tmp_path, levels=2, codebook_size=4, niter=3)  # cleans the leftover
    assert b.version == "v0002"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_default_codebook_and_errors(tmp_path) -> None:
    assert default_codebook(12_101, 3) == 23
    for n, L in [(100, 2), (10_000, 3), (1_000_000, 3), (50, 1), (10**9, 2)]:
        k = default_codebook(n, L)
        assert 0.5 <= n / k**L <= 2 or k == 1024
    x, ids = _data(50)
    with pytest.raises(MissingDataError, match="CURRENT"):
        open_current(tmp_path)
    with pytest.raises(ConfigError, match="rqvae"):
        build_sids(x, ids, tmp_path, method="pq")
    with pytest.raises(DataError, match="item_ids"):
        build_sids(x, np.zeros(50, np.int64), tmp_path)
    with pytest.raises(DataError, match="rows"):
        build_sids(x, ids[:10], tmp_path)
    build_sids(x, ids, tmp_path, levels=1, codebook_size=3, niter=2)
    with pytest.raises(DataError, match="dimension"):
        assign_sids(tmp_path, np.zeros((2, 3), np.float32), [1, 2])
    (tmp_path / "CURRENT").write_text("garbage\n")
    with pytest.raises(DataError, match="CURRENT:1"):
        open_current(tmp_path)


def test_default_levels_leave_at_most_sixteen_items_a_prefix(tmp_path) -> None:
    """The fewest levels at which codebooks of <= 1,024 codes hold <= 16 items per full prefix on average: one
    level up to 16,384 items, two up to 1,024**2 * 16; a build given no levels uses them (+ disambiguation)."""
    for n, want in [(1, 1), (1_682, 1), (12_101, 1), (16_384, 1), (16_385, 2), (1024**2 * 16, 2),
                    (1024**2 * 16 + 1, 3)]:
        assert default_levels(n) == want, n
        assert n / default_codebook(n, want) ** want <= 16
    with pytest.raises(ConfigError, match="n_items"):
        default_levels(0)
    x, ids = _data(60)
    b = build_sids(x, ids, tmp_path, codebook_size=4, niter=2)
    assert len(b.codebook_sizes) == 2 and b.codebook_sizes[0] == 4  # one semantic level + disambiguation


def test_prune_keeps_current(tmp_path) -> None:
    x, ids = _data(60)
    for _ in range(4):
        build_sids(x, ids, tmp_path, levels=1, codebook_size=3, niter=2)
    (tmp_path / "CURRENT").write_text("v0001\n")  # rolled back to the oldest
    assert prune_versions(tmp_path, keep=2) == ["v0002"]
    assert list_versions(tmp_path) == ["v0001", "v0003", "v0004"]
    assert open_current(tmp_path).version == "v0001"


def test_rqvae_build_and_assign(tmp_path) -> None:
    x, ids = _data(300, d=8)
    b = build_sids(x[:250], ids[:250], tmp_path, levels=2, codebook_size=6, method="rqvae", rqvae_epochs=5)
    assert isinstance(b.quantizer, RQVAE) and b.stats["method"] == "rqvae"
    _check_consistent(b)
    b2 = assign_sids(tmp_path, x[250:], ids[250:])
    assert isinstance(b2.quantizer, RQVAE)
    _check_consistent(b2)
    np.testing.assert_array_equal(b2.index.codes_of(ids[250:])[:, :2], b.quantizer.encode(x[250:]))
