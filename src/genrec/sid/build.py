"""Versioned SID builds: quantise, disambiguate, build trie + index, swap ``CURRENT``.

PinGER: items get Semantic IDs from their content vectors; a new item is retrievable as
soon as it has a code, and the SID->items index is rebuilt and swapped under a running
server. Layout under ``out_root`` (normally ``WORKDIR/sid``)::

    v0001/ codes.npy (int32[N, L+1], row i = item_ids[i]), item_ids.npy, quantizer.safetensors,
           trie/ (see genrec.sid.trie), index/ (see genrec.sid.index), stats.json, manifest.json
    v0002/ ...
    CURRENT   text file with the name of the version in use

Non-standard here: a version folder is written whole into a temp folder and renamed
(genrec.workdir.atomic_dir); only then is ``CURRENT`` replaced (atomic_write_bytes). A
kill at any point leaves ``CURRENT`` naming the previous complete version. A lock file
(``.lock``, fcntl) keeps two builders from picking the same version number.
:func:`assign_sids` codes new items with the FROZEN codebooks of the current version.
``method="rqvae"`` swaps the quantiser for :class:`genrec.sid.rqvae.RQVAE`; the rest is
the same. What is quantised (:mod:`genrec.sid.source`): content vectors by default, engagement
vectors when ``genrec features build`` found the item text degenerate; each version's stats.json
says which, and why, under ``source``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from genrec.errors import ConfigError, DataError, MissingDataError
from genrec.sid.disambiguate import (check_item_ids, collision_rate, disambiguate, extend_disambiguation,
                                     lex_order)
from genrec.sid.index import SidIndex, level_bits
from genrec.sid.rqkmeans import ResidualKMeans, check_vectors
from genrec.sid.rqvae import RQVAE
# what a build quantises (genrec.sid.source; its public names stay importable from here too)
from genrec.sid.source import (RECIPE_KEYS, SID_SOURCES, choose_sid_source, features_text_quality, new_item_vectors,
                               sid_input_vectors, source_stats)
from genrec.sid.trie import SidTrie
from genrec.workdir import (atomic_dir, atomic_write_bytes, atomic_write_json, clean_stale_tmp, manifest,
                            read_json)

__all__ = ["SidBuild", "build_sids", "assign_sids", "open_current", "open_version", "default_codebook",
           "code_stats", "list_versions", "load_quantizer", "prune_versions", "choose_sid_source",
           "features_text_quality", "new_item_vectors", "sid_input_vectors", "SID_SOURCES"]

CURRENT = "CURRENT"
_VERSION_RE = re.compile(r"^v(\d{4,})$")


@dataclass
class SidBuild:
    """One complete SID version, opened read-only (trie and index memory-mapped)."""

    version: str
    path: Path
    item_ids: np.ndarray  # int64[N]
    codes: np.ndarray  # int32[N, L+1]: semantic levels + the disambiguation level
    codebook_sizes: list[int]  # length L+1
    trie: SidTrie
    index: SidIndex
    quantizer: ResidualKMeans | RQVAE
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def levels(self) -> int:
        """Number of SID levels including the disambiguation level."""
        return len(self.codebook_sizes)


MAX_CODEBOOK = 1024
"""The most codes per semantic level :func:`default_codebook` picks."""
ITEMS_PER_PREFIX = 16
"""How many items a full semantic prefix may hold on average before :func:`default_levels` adds a level."""


def default_levels(n_items: int) -> int:
    """Semantic levels when none are asked for: the fewest at which codebooks of at most
    :data:`MAX_CODEBOOK` codes leave at most :data:`ITEMS_PER_PREFIX` items per full prefix on average --
    one level up to 16,384 items, two up to ~16.8 million, three beyond. On the catalogues measured
    (MovieLens 100K, Amazon Beauty) one level of 1,024 codes led three levels on validation SID recall:
    fewer, larger levels make the SID head closer to a full softmax over items (docs/RESULTS.md, Q1)."""
    if n_items < 1:
        raise ConfigError(f"n_items must be >= 1, got {n_items}")
    levels = 1
    while MAX_CODEBOOK ** levels * ITEMS_PER_PREFIX < n_items:
        levels += 1
    return levels


def default_codebook(n_items: int, levels: int) -> int:
    """Codebook size K per semantic level: K**levels ~ n_items, clipped to 2..1024.

    Real content vectors are skewed, so far fewer than K**levels semantic codes get used:
    on Amazon Beauty (12,101 items, 3 levels, TF-IDF vectors, capacity 2.0) K = 23 gave
    3.6 items per used deepest semantic code and a disambiguation level of 8, inside the
    2-8 items-per-code target. E.g. 12,101 items, 3 levels -> 23.
    """
    if n_items < 1 or levels < 1:
        raise ConfigError(f"n_items and levels must be >= 1, got {n_items}, {levels}")
    return int(min(MAX_CODEBOOK, max(2, round(n_items ** (1.0 / levels)))))


def code_stats(codes: np.ndarray, sizes: list[int]) -> list[dict[str, float]]:
    """Per level: distinct codes used, used / K, perplexity exp(H) of the code distribution."""
    out = []
    for lvl, k in enumerate(sizes):
        counts = np.bincount(codes[:, lvl].astype(np.int64), minlength=k)
        p = counts[counts > 0] / max(codes.shape[0], 1)
        ent = float(-(p * np.log(p)).sum()) if p.size else 0.0
        out.append({"level": lvl, "K": int(k), "used": int((counts > 0).sum()),
                    "use_rate": float((counts > 0).sum() / k), "perplexity": float(math.exp(ent))})
    return out


def prefix_stats(codes: np.ndarray) -> list[dict[str, float]]:
    """Per depth d = 1..L: distinct prefixes and mean/max items per prefix."""
    out = []
    srt = codes[lex_order(codes)]
    n = codes.shape[0]
    for d in range(1, codes.shape[1] + 1):
        starts = np.ones(n, dtype=bool)
        if n > 1:
            starts[1:] = (srt[1:, :d] != srt[:-1, :d]).any(axis=1)
        sizes = np.diff(np.append(np.flatnonzero(starts), n))
        out.append({"depth": d, "prefixes": int(starts.sum()), "mean_items": float(sizes.mean()) if n else 0.0,
                    "max_items": int(sizes.max()) if n else 0})
    return out


def list_versions(out_root: str | Path) -> list[str]:
    """Complete version folders (those with a manifest), oldest first."""
    root = Path(out_root)
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if _VERSION_RE.match(p.name) and (p / "manifest.json").exists()]
    return sorted(found, key=lambda s: int(s[1:]))


def prune_versions(out_root: str | Path, keep: int = 3) -> list[str]:
    """Delete all but the newest ``keep`` complete versions, never the one in CURRENT.

    A server that still has an old version memory-mapped keeps reading it (POSIX keeps
    unlinked files alive while mapped). Returns the names removed.
    """
    if keep < 1:
        raise ConfigError(f"keep must be >= 1, got {keep}")
    root = Path(out_root)
    with _lock(root):
        cur = (root / CURRENT).read_text().strip() if (root / CURRENT).exists() else None
        old = [v for v in list_versions(root)[:-keep] if v != cur]
        for v in old:
            shutil.rmtree(root / v)
        return old


def _next_version(root: Path) -> str:
    nums = [int(m.group(1)) for p in root.iterdir() if (m := _VERSION_RE.match(p.name))]
    return f"v{(max(nums) + 1) if nums else 1:04d}"


@contextlib.contextmanager
def _lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def load_quantizer(path: str | Path) -> ResidualKMeans | RQVAE:
    """Open ``quantizer.safetensors`` as the class recorded in its ``meta`` entry."""
    state = load_file(str(path))
    if "meta" not in state:
        raise DataError("no 'meta' entry", path=path, field="meta")
    kind = json.loads(np.asarray(state["meta"], dtype=np.uint8).tobytes().decode()).get("kind", "rqkmeans")
    if kind == "rqvae":
        return RQVAE.from_state(state)
    if kind == "rqkmeans":
        return ResidualKMeans.from_state(state)
    raise DataError(f"unknown quantiser kind {kind!r}", path=path, field="meta.kind")


ADDED_IDS, ADDED_CONTENT = "added_item_ids.npy", "added_content.npy"


def added_items(version_path: str | Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(item ids int64[m], content vectors f32[m, dc]) of the items ``sid assign`` added to the catalogue
    in this version and its ancestors -- items the item features do not hold -- or None."""
    path = Path(version_path)
    if not (path / ADDED_IDS).exists():
        return None
    ids = np.load(path / ADDED_IDS)
    content = np.load(path / ADDED_CONTENT)
    if content.ndim != 2 or content.shape[0] != ids.shape[0]:
        raise DataError(f"added content {content.shape} does not match its item ids {ids.shape}",
                        path=path / ADDED_CONTENT)
    return ids.astype(np.int64), content.astype(np.float32)


def set_current(out_root: str | Path, version: str) -> SidBuild:
    """Point ``CURRENT`` at an existing, complete ``version`` (atomically); returns it opened."""
    root = Path(out_root)
    if not _VERSION_RE.match(version):
        raise ConfigError(f"not a version name: {version!r} (expected e.g. v0002; see `genrec sid list`)")
    with _lock(root):
        sb = open_version(root, version)  # refuses a missing or incomplete one, naming the file
        atomic_write_bytes(root / CURRENT, (version + "\n").encode())
    return sb


def _write_version(root: Path, item_ids: np.ndarray, codes: np.ndarray, sizes: list[int],
                   quantizer: ResidualKMeans | RQVAE, stats: dict[str, Any], man: dict[str, Any],
                   added: tuple[np.ndarray, np.ndarray] | None = None, publish: bool = True) -> str:
    """Write a new complete version folder and (``publish``) point CURRENT at it; returns its name.
    ``added``: the catalogue items this version adds beyond the item features (ids, content vectors)."""
    with _lock(root):
        clean_stale_tmp(root)
        version = _next_version(root)
        trie = SidTrie.build(codes, item_ids, sizes)
        index = SidIndex.build(codes, item_ids, sizes, version=version)
        stats = {**stats, "version": version, "trie_bytes": trie.nbytes(), "trie_nodes_per_depth": trie.nodes_per_depth,
                 "index_bits": index.bits}
        with atomic_dir(root / version) as tmp:
            np.save(tmp / "codes.npy", codes.astype(np.int32))
            np.save(tmp / "item_ids.npy", item_ids.astype(np.int64))
            quantizer.save(tmp / "quantizer.safetensors")
            trie.save(tmp / "trie")
            index.save(tmp / "index")
            atomic_write_json(tmp / "stats.json", stats)
            atomic_write_json(tmp / "manifest.json", {**man, "version": version})
            if added is not None and len(added[0]):
                np.save(tmp / ADDED_IDS, added[0].astype(np.int64))
                np.save(tmp / ADDED_CONTENT, added[1].astype(np.float32))
        if publish:
            atomic_write_bytes(root / CURRENT, (version + "\n").encode())
        return version


def build_sids(vectors: Any, item_ids: Any, out_root: str | Path, *, levels: int | None = None,
               codebook_size: int | list[int] | None = None, method: str = "rqkmeans", seed: int = 0,
               niter: int = 20, capacity: float | None = 2.0, rqvae_epochs: int = 30,
               inputs: dict[str, Any] | None = None, popularity: Any = None) -> SidBuild:
    """Quantise ``vectors`` f32[n, d] of items ``item_ids`` int64[n] into a new SID version.

    ``levels`` None picks :func:`default_levels`, ``codebook_size`` None :func:`default_codebook`. ``capacity`` (rqkmeans only):
    of the n_p items sharing a prefix, at most ceil(capacity * n_p / K) take the same next
    code (None = plain nearest centroid); see :func:`genrec.sid.rqkmeans.balanced_assign`.
    ``popularity`` (a number per item) numbers the disambiguation level most popular first
    (:func:`genrec.sid.disambiguate.disambiguate`; None: by item id). Writes ``out_root/v000k`` atomically, then points ``out_root/CURRENT`` at it, and
    returns the opened build. ``inputs`` go to the manifest; their ``source`` and ``features`` also
    make the stats' ``source`` entry (:func:`source_stats`).
    """
    t0 = time.perf_counter()
    x = check_vectors(vectors, name="vectors")
    ids = check_item_ids(item_ids, x.shape[0])
    levels = default_levels(x.shape[0]) if levels is None else levels
    k = default_codebook(x.shape[0], levels) if codebook_size is None else codebook_size
    rq: ResidualKMeans | RQVAE
    if method == "rqkmeans":
        rq = ResidualKMeans(levels, k, niter=niter, seed=seed, capacity=capacity)
    elif method == "rqvae":
        rq = RQVAE(levels, k, epochs=rqvae_epochs, seed=seed)
    else:
        raise ConfigError(f"method must be 'rqkmeans' or 'rqvae', got {method!r}")
    sem = rq.fit_encode(x)  # [n, L] training codes (balanced when capacity is set)
    dis = disambiguate(sem, ids, popularity=popularity)
    sizes = rq.codebook_sizes + [dis.final_size]
    level_bits(sizes)  # fail before writing anything if the codes do not pack
    t_fit = time.perf_counter() - t0
    src = source_stats(inputs or {})
    stats = {
        "n_items": int(x.shape[0]), "dim": int(x.shape[1]), "method": method, "levels": levels,
        "codebook_sizes": sizes, "collision_rate": dis.collision_rate, "max_collision_group": dis.max_group,
        "unique_rate": float(1.0 - collision_rate(dis.codes)),
        "codebook_use": code_stats(dis.codes, sizes), "prefixes": prefix_stats(dis.codes),
        "reconstruction": rq.level_errors(x, sem),
        "warnings": rq.stats.get("warnings", []) + ([src["warning"]] if "warning" in src else []),
        "fit_seconds": t_fit, "source": src,
    }
    man = manifest("sid", inputs=inputs or {}, params={"levels": levels, "codebook_size": k, "method": method,
                                                        "seed": seed, "niter": niter,
                                                        "capacity": capacity, "rqvae_epochs": rqvae_epochs,
                                                        "disambiguation": "item_id" if popularity is None
                                                        else "popularity"},
                   counts={"items": int(x.shape[0]), "levels_total": len(sizes)})
    root = Path(out_root)
    version = _write_version(root, ids, dis.codes, sizes, rq, stats, man)
    return open_version(root, version)


def open_version(out_root: str | Path, version: str) -> SidBuild:
    """Open one version folder (trie and index memory-mapped)."""
    path = Path(out_root) / version
    if not (path / "manifest.json").exists():
        raise MissingDataError(f"{path} is not a complete SID version (no manifest.json)")
    for name in ("codes.npy", "item_ids.npy", "quantizer.safetensors", "stats.json"):
        if not (path / name).exists():
            raise MissingDataError(f"{path / name} missing: SID version {version} is incomplete")
    codes = np.load(path / "codes.npy", mmap_mode="r")
    ids = np.load(path / "item_ids.npy", mmap_mode="r")
    if codes.ndim != 2 or codes.shape[0] != ids.shape[0]:
        raise DataError(f"codes {codes.shape} do not match item_ids {ids.shape}", path=path / "codes.npy")
    index = SidIndex.load(path / "index")
    return SidBuild(version=version, path=path, item_ids=ids, codes=codes, codebook_sizes=index.codebook_sizes,
                    trie=SidTrie.load(path / "trie"), index=index,
                    quantizer=load_quantizer(path / "quantizer.safetensors"), stats=read_json(path / "stats.json"))


def open_current(out_root: str | Path) -> SidBuild:
    """Open the version named by ``out_root/CURRENT``."""
    root = Path(out_root)
    cur = root / CURRENT
    if not cur.exists():
        raise MissingDataError(f"{cur} not found: run a SID build first (genrec sid build)")
    version = cur.read_text().strip()
    if not _VERSION_RE.match(version):
        raise DataError(f"not a version name: {version!r}", path=cur, line=1)
    return open_version(root, version)


def assign_sids(out_root: str | Path, new_vectors: Any, new_item_ids: Any,
                inputs: dict[str, Any] | None = None, *, content: Any = None,
                publish_if_grown: bool = True) -> SidBuild:
    """Code new items with the current version's frozen codebooks; write a new version.

    Items already in the current version keep their codes (their vectors are ignored).
    New items get the next free disambiguation code inside their semantic prefix, so the
    last level's codebook may grow (recorded in stats). The old version is not touched.
    When no item is new, nothing is written: the current version is returned, with
    ``stats["assigned"]`` describing this request (a new version would only make servers reload).

    ``content``: the new items' content vectors in the item features' space (rows as
    ``new_item_ids``). They are kept in the version (:func:`added_items`), and
    :func:`genrec.catalog.load_catalog` appends them to the catalogue, engagement imputed -- a new
    item is then retrievable and rankable by the served model as soon as it has codes (PinGER §1),
    and pointing ``CURRENT`` back drops it again. The new version becomes ``CURRENT``, also when the last
    level grew: models trained on the old sizes serve it, reaching the codes past their last-level head through
    the items' prefixes (:mod:`genrec.decode.prefix`). ``publish_if_grown=False`` keeps ``CURRENT`` where it
    was in that case (``genrec sid use`` publishes it later, e.g. after retraining)."""
    root = Path(out_root)
    cur = open_current(root)
    x = check_vectors(new_vectors, name="new_vectors")
    ids = check_item_ids(new_item_ids, x.shape[0], name="new_item_ids")
    if x.shape[1] != cur.quantizer.dim:
        raise DataError(f"new vectors have dimension {x.shape[1]}, the codebooks {cur.quantizer.dim}",
                        field="new_vectors")
    fresh = ~cur.index.contains(ids)
    if content is not None:
        content = check_vectors(content, name="new item content vectors")
        if content.shape[0] != ids.shape[0]:
            raise DataError(f"{content.shape[0]} content vectors for {ids.shape[0]} items", field="content")
    if not fresh.any():
        cur.stats = {**cur.stats, "assigned": {"requested": int(ids.shape[0]), "new": 0,
                                               "already_present": int(ids.shape[0]), "reconstruction_new": [],
                                               "final_level_grew": False, "unchanged": True}}
        return cur
    x_new, ids_new = x[fresh], ids[fresh]
    old_codes = np.asarray(cur.codes)
    old_ids = np.asarray(cur.item_ids)
    if ids_new.size:
        sem = cur.quantizer.encode(x_new)  # [m, L] with frozen codebooks
        full_new = extend_disambiguation(old_codes, sem, ids_new)
        recon = cur.quantizer.level_errors(x_new, sem)
    else:
        full_new = np.zeros((0, old_codes.shape[1]), dtype=np.int32)
        recon = []
    codes = np.concatenate([old_codes, full_new]).astype(np.int32)
    all_ids = np.concatenate([old_ids, ids_new]).astype(np.int64)
    sizes = list(cur.codebook_sizes)
    if full_new.shape[0]:
        sizes[-1] = max(sizes[-1], int(full_new[:, -1].max()) + 1)
    level_bits(sizes)
    sem_all = codes[:, :-1]
    stats = {
        "n_items": int(all_ids.shape[0]), "parent_version": cur.version, "method": cur.stats.get("method", "rqkmeans"),
        "levels": cur.quantizer.levels, "codebook_sizes": sizes,
        "collision_rate": collision_rate(sem_all), "max_collision_group": int(codes[:, -1].max()) + 1,
        "unique_rate": float(1.0 - collision_rate(codes)), "codebook_use": code_stats(codes, sizes),
        "prefixes": prefix_stats(codes),
        "assigned": {"requested": int(ids.shape[0]), "new": int(ids_new.shape[0]),
                     "already_present": int((~fresh).sum()), "reconstruction_new": recon,
                     "final_level_grew": sizes[-1] > cur.codebook_sizes[-1]},
    }
    prev = added_items(cur.path)
    added = prev
    if content is not None and ids_new.size:
        new_c = content[fresh]
        if prev is not None and prev[1].shape[1] != new_c.shape[1]:
            raise DataError(f"new content vectors have dimension {new_c.shape[1]}, the items added before "
                            f"{prev[1].shape[1]}", field="content")
        added = (ids_new, new_c) if prev is None else (np.concatenate([prev[0], ids_new]),
                                                       np.concatenate([prev[1], new_c]))
    publish = not stats["assigned"]["final_level_grew"] or publish_if_grown
    stats["assigned"]["added_to_catalogue"] = int(ids_new.shape[0]) if content is not None else 0
    stats["assigned"]["published"] = publish
    # the recipe of the codes (what was quantised: source, run, ...) carries over, for the next `sid assign`
    recipe = {k: v for k, v in read_json(cur.path / "manifest.json").get("inputs", {}).items() if k in RECIPE_KEYS}
    man = manifest("sid-assign", inputs={**recipe, **(inputs or {}), "parent_version": cur.version},
                   params={"frozen_codebooks": cur.version}, counts={"items": int(all_ids.shape[0]),
                                                                    "new_items": int(ids_new.shape[0])})
    version = _write_version(root, all_ids, codes, sizes, cur.quantizer, stats, man, added=added, publish=publish)
    return open_version(root, version)
