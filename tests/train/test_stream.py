"""Streaming training input (genrec.train.stream): the batches equal a plainly written twin of the windowed order
over the in-memory examples; an epoch holds the in-memory examples once each; resume reads no earlier window;
every rank takes the same number of steps; the Ray engine gives the embedded engine's batches."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from genrec.catalog import ItemCatalog
from genrec.data.join import BucketJoinReader
from genrec.data.splits import SplitSpec
from genrec.data.store import TableStore
from genrec.data.stream_index import build_stream_index
from genrec.data.synth import synthesize
from genrec.errors import DataError
from genrec.train.batches import BatchStream, TrainBatch, TrainExample, collate, materialise
from genrec.train.stream import (
    CollateOptions,
    EmbeddedEngine,
    StreamBatches,
    WindowPlan,
    WindowReader,
    row_counts,
)

SEED = 5
BUCKETS = 6


class CountingStore(TableStore):
    """The real store, recording which buckets' events are read."""

    reads: list[int]

    def read_events(self, bucket: int | None = None, *, columns: list[str] | None = None) -> pa.Table:
        if columns is None:  # the join's reads (the index reads four columns)
            self.reads.append(-1 if bucket is None else int(bucket))
        return super().read_events(bucket, columns=columns)


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wd = tmp_path_factory.mktemp("synth")
    # mostly non-positive actions in short slates: many slates without an interaction, so the join's seeded
    # choice of which to keep shows in the batches
    synthesize(wd, users=90, items=60, events=1500, seed=1, n_buckets=BUCKETS, actions={"view": 0.3, "hide": 0.7},
               positive_actions=("view",), slate_size=3)
    return wd / "tables"


@pytest.fixture(scope="module")
def setup(tables: Path) -> tuple[CountingStore, ItemCatalog, np.ndarray, dict[int, list[TrainExample]]]:
    store = CountingStore(tables)
    store.reads = []
    ids = store.read_items().column("item_id").to_numpy()
    cat = ItemCatalog(item_ids=ids, feats=torch.zeros(len(ids), 0), codes=None)
    counts = build_stream_index(store, SplitSpec("loo")).examples
    # the in-memory examples, per bucket (today's loader materialises the same join over every bucket)
    reader = BucketJoinReader(store, split=SplitSpec("loo"), role="train", context_len=10 ** 9, seed=SEED)
    by_bucket = {b: materialise(exs, cat) for b, exs in reader.iter_buckets()}
    return store, cat, counts, by_bucket


def _options(cat: ItemCatalog) -> CollateOptions:
    return CollateOptions(context_len=12, n_actions=2, p_rank=0.5, max_cands=6, neg_cands=2, n_catalog=len(cat),
                          pad_multiple=4)


def _stream(setup: tuple, *, batch: int, rank: int = 0, world: int = 1, k: int = 1) -> StreamBatches:
    store, cat, counts, _ = setup
    plan = WindowPlan(counts, batch_size=batch, seed=SEED, rank=rank, world=world, window_buckets=k)
    return StreamBatches(EmbeddedEngine(WindowReader(store, SplitSpec("loo"), cat, seed=SEED)), plan, _options(cat))


def twin(by_bucket: dict[int, list[TrainExample]], *, batch: int, rank: int, world: int, k: int,
         epochs: int) -> list[tuple[int, list[TrainExample]]]:
    """The module's order written out plainly over the in-memory examples: (epoch, examples) per step."""
    n = len(by_bucket)
    per = batch // world
    spe = min(sum(len(by_bucket[b]) for b in range(n) if b % world == r) for r in range(world)) // per
    out = []
    for e in range(epochs):
        own = [b for b in range(n) if b % world == rank]
        order = [int(b) for b in np.random.default_rng([SEED, e, rank, 1]).permutation(own)]
        seq: list[TrainExample] = []
        for w, i in enumerate(range(0, len(order), k)):
            win = [ex for b in order[i:i + k] for ex in by_bucket[b]]
            seq += [win[j] for j in np.random.default_rng([SEED, e, rank, 2, w]).permutation(len(win))]
        out += [(e, seq[s * per:(s + 1) * per]) for s in range(spe)]
    return out


def _equal(a: TrainBatch, b: TrainBatch) -> bool:
    for f in a.__dataclass_fields__:
        x, y = getattr(a, f), getattr(b, f)
        if not ((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))):
            return False
    return True


def _take(it: Iterator[TrainBatch], n: int) -> list[TrainBatch]:
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("batch,world,k", [(8, 1, 1), (8, 1, 4), (7, 1, 6), (8, 2, 2), (9, 3, 1)])
def test_streaming_equals_the_windowed_twin_of_the_in_memory_examples(setup: tuple, batch: int, world: int,
                                                                      k: int) -> None:
    _, cat, _, by_bucket = setup
    opts = _options(cat)
    for rank in range(world):
        ref = twin(by_bucket, batch=batch, rank=rank, world=world, k=k, epochs=2)
        got = _take(_stream(setup, batch=batch, rank=rank, world=world, k=k).iter_from(0), len(ref))
        for step, ((epoch, exs), b) in enumerate(zip(ref, got)):
            want = collate(exs, epoch=epoch, seed=SEED, context_len=opts.context_len, n_actions=opts.n_actions,
                           p_rank=opts.p_rank, max_cands=opts.max_cands, neg_cands=opts.neg_cands,
                           n_catalog=opts.n_catalog, pad_multiple=opts.pad_multiple)
            assert _equal(b, want), (rank, step)


def test_an_epoch_holds_the_in_memory_examples_once_each(setup: tuple) -> None:
    """An epoch's batches hold today's in-memory examples, each at most once (one rank: all but the same number
    of leftovers as BatchStream, whose steps per epoch it has); two ranks see disjoint examples, each rank only
    its own buckets'. (Whole histories, no ranking cut: each batch row names its example.)"""
    _, cat, _, by_bucket = setup
    whole = CollateOptions(context_len=10 ** 6, n_actions=2, p_rank=0.0)

    def key(ex: TrainExample) -> tuple[int, ...]:
        return tuple(int(r) for r in ex.rows)

    def epoch_rows(rank: int, world: int, k: int, epoch: int) -> Counter:
        store, _, counts, _ = setup
        plan = WindowPlan(counts, batch_size=8, seed=SEED, rank=rank, world=world, window_buckets=k)
        s = StreamBatches(EmbeddedEngine(WindowReader(store, SplitSpec("loo"), cat, seed=SEED)), plan, whole)
        got: Counter = Counter()
        for b in _take(s.iter_from(epoch * plan.steps_per_epoch), plan.steps_per_epoch):
            got.update(tuple(int(r) for r in b.rows[i, :int(b.lengths[i])]) for i in range(b.batch_size))
        return got

    every = [ex for b in sorted(by_bucket) for ex in by_bucket[b]]
    all_rows = Counter(key(ex) for ex in every)
    spe = BatchStream(every, batch_size=8, seed=SEED, context_len=12, n_actions=2).steps_per_epoch
    for epoch in (0, 1):
        one = epoch_rows(0, 1, 2, epoch)
        assert sum(one.values()) == spe * 8 and not one - all_rows  # a sub-multiset: nothing twice, nothing new
    ranks = [epoch_rows(r, 2, 1, 1) for r in range(2)]
    for r, got in enumerate(ranks):
        own = Counter(key(ex) for b in by_bucket if b % 2 == r for ex in by_bucket[b])
        assert not got - own
    assert not ranks[0] & ranks[1]


def test_resume_is_exact_and_reads_no_earlier_window(setup: tuple) -> None:
    store = setup[0]
    s = _stream(setup, batch=8, rank=1, world=2, k=1)
    spe = s.steps_per_epoch
    straight = _take(s.iter_from(0), 2 * spe + 2)
    plan = s.plan
    for start in (1, 3, spe - 1, spe, spe + 4, 2 * spe + 1):
        store.reads.clear()
        resumed = _take(_stream(setup, batch=8, rank=1, world=2, k=1).iter_from(start), 2)
        assert all(_equal(a, b) for a, b in zip(resumed, straight[start:start + 2])), start
        epoch, i = divmod(start, spe)
        first = plan.tasks(epoch, i)[0]
        assert store.reads[0] == first.buckets[0]  # the window holding the step is the first one read
        assert first.lo == i * plan.per_rank and first.start <= first.lo < first.start + first.size
        if first.start > 0:  # the earlier windows of the epoch are never read
            skipped = {b for w in plan.windows(epoch)[:first.window] for b in w}
            assert not skipped & set(store.reads[:len(first.buckets)])


def test_every_rank_takes_the_same_steps() -> None:
    counts = [50, 3, 40, 2, 9, 70, 0]  # uneven buckets
    plans = [WindowPlan(counts, batch_size=6, seed=0, rank=r, world=3, window_buckets=2) for r in range(3)]
    assert {p.steps_per_epoch for p in plans} == {min(50 + 2 + 0, 3 + 9, 40 + 70) // 2}
    for p in plans:
        for e in range(3):
            tasks = p.tasks(e)
            assert sum(t.hi - t.lo for t in tasks) == p.steps_per_epoch * p.per_rank
            assert sorted(b for w in p.windows(e) for b in w) == p.own
    with pytest.raises(DataError, match="rank 1's buckets hold 3 training examples"):
        WindowPlan([5, 3], batch_size=8, seed=0, world=2)


def test_a_changed_table_is_refused(setup: tuple) -> None:
    store, cat, counts, _ = setup
    wrong = counts.copy()
    wrong[0] += 1
    plan = WindowPlan(wrong, batch_size=8, seed=SEED, window_buckets=BUCKETS)
    s = StreamBatches(EmbeddedEngine(WindowReader(store, SplitSpec("loo"), cat, seed=SEED)), plan, _options(cat))
    with pytest.raises(DataError, match="the stream index counted"):
        next(s.iter_from(0))


def test_row_counts_are_the_in_memory_ones(setup: tuple) -> None:
    store, cat, _, by_bucket = setup
    every = [ex for b in sorted(by_bucket) for ex in by_bucket[b]]
    want = np.bincount(np.concatenate([e.rows for e in every]), minlength=len(cat))
    assert np.array_equal(row_counts(build_stream_index(store, SplitSpec("loo")), cat), want)


_RAY_CHILD = "GENREC_TEST_RAY_CHILD"


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_engine_gives_the_embedded_batches(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Run in a child pytest process: a Ray driver's core worker can end its process with exit status 1 when it
    loses its local raylet (seen twice on the loaded 2-core CI box, the suite dying with no summary right after
    this test), so Ray never lives in the suite's own process. The child also did so once after its check had
    passed (stdout ".", exit 1, nothing after): the child records a passed check in a file before Ray shuts down,
    and that record is what counts; a child that died before recording is run once more."""
    pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    if os.environ.get(_RAY_CHILD) == "1":
        _check_ray_engine(request.getfixturevalue("setup"), request.getfixturevalue("tables"),
                          request.getfixturevalue("local_ray"))
        Path(os.environ[_RAY_CHILD + "_DONE"]).write_text("passed")
        return
    node = f"{Path(__file__).resolve()}::test_ray_engine_gives_the_embedded_batches"
    done = tmp_path / "ray-check"
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
                              env={**os.environ, _RAY_CHILD: "1", _RAY_CHILD + "_DONE": str(done)},
                              capture_output=True, text=True, timeout=900)
        if done.exists() or "F" in proc.stdout.split("\n", 1)[0]:
            break
    assert done.exists() and done.read_text() == "passed", proc.stdout[-4000:] + proc.stderr[-2000:]


def _check_ray_engine(setup: tuple, tables: Path, _ray: None) -> None:
    from genrec.train.ray_engine import RayEngine

    store, cat, counts, _ = setup
    plan = WindowPlan(counts, batch_size=8, seed=SEED, rank=1, world=2, window_buckets=2)
    embedded = _stream(setup, batch=8, rank=1, world=2, k=2)
    start = plan.steps_per_epoch // 2 + 1  # mid-epoch (a resume), on into the next epoch
    want = _take(embedded.iter_from(start), plan.steps_per_epoch)
    with RayEngine(tables, None, SplitSpec("loo"), cat.item_ids, seed=SEED, workers=2) as engine:
        got = _take(StreamBatches(engine, plan, _options(cat)).iter_from(start), len(want))
    assert all(_equal(a, b) for a, b in zip(got, want))
