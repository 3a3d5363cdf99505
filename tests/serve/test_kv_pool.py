"""KV pool: leases, seqlock reads, a model-checked op sequence, and thread/process stress with a
pool smaller than the concurrency (every read result is checked against that request's own KV)."""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genrec.model import GenRecModel, ModelBatch, ModelConfig
from genrec.model.kv_cache import KVCache
from genrec.model.layout import TokenMeta
from genrec.serve.kv_pool import KVPool, PoolSpec, StaleSlotError, pool_spec_for

SPEC = PoolSpec(layers=2, slots=3, kv_heads=2, n_max=8, head_dim=4, d_model=6)


def fake_cache(tag: int, n: int, spec: PoolSpec = SPEC) -> KVCache:
    """A batch-1 cache whose every value encodes ``tag`` (and position), so a foreign read is visible."""
    g = torch.Generator().manual_seed(tag)
    ks = [torch.randn(1, spec.kv_heads, n, spec.head_dim, generator=g) + tag for _ in range(spec.layers)]
    vs = [torch.randn(1, spec.kv_heads, n, spec.head_dim, generator=g) - tag for _ in range(spec.layers)]
    ar = torch.arange(n)[None]
    meta = TokenMeta(ar.clone(), torch.zeros_like(ar), ar + tag)
    return KVCache(ks, vs, meta, torch.tensor([n]), torch.full((1, spec.d_model), float(tag)), "pinger",
                   torch.tensor([tag * 10]))


def same(a: KVCache, b: KVCache) -> bool:
    return (all(torch.equal(x, y) for x, y in zip(a.k, b.k)) and all(torch.equal(x, y) for x, y in zip(a.v, b.v))
            and torch.equal(a.meta.tok, b.meta.tok) and torch.equal(a.meta.pos, b.meta.pos)
            and torch.equal(a.lengths, b.lengths) and torch.equal(a.last_hidden, b.last_hidden)
            and torch.equal(a.last_ts, b.last_ts))


@pytest.fixture
def pool(tmp_path: Path):
    p = KVPool.create(SPEC, tmp_path / "pool.json")
    yield p
    p.close()


def test_roundtrip_and_stale(pool: KVPool) -> None:
    a = pool.lease()
    with pytest.raises(StaleSlotError):
        pool.read(a.slot, a.gen)  # leased but not yet written
    c = fake_cache(7, 5)
    pool.write(a, c)
    assert same(pool.read(a.slot, a.gen), c)
    with pytest.raises(ValueError, match="already written"):
        pool.write(a, c)
    # reuse the slot: the old (slot, gen) becomes stale, the new one reads the new KV
    leases = [pool.lease() for _ in range(SPEC.slots)]
    again = [x for x in leases if x.slot == a.slot][0]
    assert again.gen > a.gen
    with pytest.raises(StaleSlotError):
        pool.read(a.slot, a.gen)
    with pytest.raises(StaleSlotError):
        pool.write(a, c)  # a superseded lease can never publish
    c2 = fake_cache(8, 3)
    pool.write(again, c2)
    assert same(pool.read(again.slot, again.gen), c2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_rows_written_and_read_as_one_equal_row_by_row(pool: KVPool, seed: int) -> None:
    """``write_rows`` / ``read_rows`` (one synchronisation for a batch's rows) against the one-row path: rows
    lo.. of a batch into shuffled slots, read back as one batch in another order, equal the rows themselves;
    a stale row fails the whole read; repeated slots and mixed token counts are refused."""
    rng = random.Random(seed)
    n = rng.randint(1, SPEC.n_max)
    batch = KVCache.stack([fake_cache(rng.randint(1, 99), n) for _ in range(4)])
    lo, m = rng.randint(0, 1), SPEC.slots
    leases = [pool.lease() for _ in range(m)]
    rng.shuffle(leases)
    pool.write_rows(leases, batch, lo)
    order = list(range(m))
    rng.shuffle(order)
    got = pool.read_rows([leases[j].slot for j in order], [leases[j].gen for j in order])
    assert same(got, KVCache.stack([batch.row(lo + j) for j in order]))
    for j in order:  # and each row alone, through the one-row path
        assert same(pool.read(leases[j].slot, leases[j].gen), batch.row(lo + j))
    with pytest.raises(StaleSlotError):
        pool.read_rows([leases[0].slot, leases[1].slot], [leases[0].gen, leases[1].gen + 1])
    fresh = [pool.lease() for _ in range(2)]
    with pytest.raises(ValueError, match="one slot per row"):
        pool.write_rows([fresh[0], fresh[0]], batch)
    with pytest.raises(ValueError, match="rows"):
        pool.write_rows(fresh, batch, 3)  # rows 3..4 of a batch of 4
    pool.write(fresh[0], fake_cache(5, 2))
    pool.write(fresh[1], fake_cache(6, 3))
    with pytest.raises(ValueError, match="different token counts"):
        pool.read_rows([x.slot for x in fresh], [x.gen for x in fresh])


def test_lease_prefers_free_slots_and_counts_occupancy(pool: KVPool) -> None:
    ls = [pool.lease() for _ in range(SPEC.slots)]
    assert sorted(x.slot for x in ls) == list(range(SPEC.slots))
    assert pool.occupancy() == SPEC.slots
    pool.release(ls[1])
    assert pool.occupancy() == SPEC.slots - 1
    assert pool.lease().slot == ls[1].slot  # the freed slot is reused first


def test_attach_by_path_sees_same_memory(pool: KVPool) -> None:
    other = KVPool.attach(pool.path)
    try:
        a = pool.lease()
        c = fake_cache(3, 4)
        pool.write(a, c)
        assert same(other.read(a.slot, a.gen), c)
        b = other.lease()  # leasing through the other mapping bumps the shared counters
        assert pool.generation(b.slot) == b.gen
    finally:
        other.close()


def test_bad_writes_are_refused(pool: KVPool) -> None:
    a = pool.lease()
    with pytest.raises(ValueError, match="pool holds"):
        pool.write(a, fake_cache(1, SPEC.n_max + 1, PoolSpec(2, 3, 2, SPEC.n_max + 1, 4, 6)))
    with pytest.raises(ValueError, match="slot"):
        pool.read(SPEC.slots, 1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["lease", "write", "read", "release"]), st.integers(0, 20)),
                min_size=1, max_size=40))
def test_ops_match_a_reference_model(tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]) -> None:
    """Random interleavings of lease/write/read/release vs an obviously-correct dict model."""
    pool = KVPool.create(SPEC, tmp_path_factory.mktemp("p") / "pool.json")
    try:
        leases: list = []  # every lease ever taken
        current: dict[int, int] = {}  # slot -> latest gen
        written: dict[tuple[int, int], KVCache] = {}
        for op, x in ops:
            if op == "lease" or not leases:
                le = pool.lease()
                assert le.gen > current.get(le.slot, 0)
                current[le.slot] = le.gen
                leases.append(le)
                continue
            le = leases[x % len(leases)]
            live = current[le.slot] == le.gen
            if op == "write":
                c = fake_cache(len(written) + 1, 1 + x % SPEC.n_max)
                if not live:
                    with pytest.raises(StaleSlotError):
                        pool.write(le, c)
                elif (le.slot, le.gen) in written:
                    with pytest.raises(ValueError):
                        pool.write(le, c)
                else:
                    pool.write(le, c)
                    written[(le.slot, le.gen)] = c
            elif op == "read":
                if live and (le.slot, le.gen) in written:
                    assert same(pool.read(le.slot, le.gen), written[(le.slot, le.gen)])
                else:
                    with pytest.raises(StaleSlotError):
                        pool.read(le.slot, le.gen)
            else:
                pool.release(le)
    finally:
        pool.close()


def _worker(path: str, wid: int, n_req: int, out: "mp.Queue | None" = None, res: list | None = None,
            barrier=None) -> None:  # noqa: ANN001
    """Write my own KV, wait a random bit (slow reader), read it back; stale -> retry. Report mismatches."""
    pool = KVPool.attach(path)
    if barrier is not None:
        barrier.wait(120)  # all processes hammer the pool at the same time
    rnd = random.Random(wid)
    stale = bad = 0
    try:
        for r in range(n_req):
            tag = wid * 1000 + r + 1
            mine = fake_cache(tag, 1 + tag % SPEC.n_max)
            while True:
                le = pool.lease()
                try:
                    pool.write(le, mine)
                    time.sleep(rnd.random() * 0.002)
                    got = pool.read(le.slot, le.gen)
                except StaleSlotError:
                    stale += 1
                    continue
                finally:
                    pool.release(le)
                bad += 0 if same(got, mine) else 1
                break
    finally:
        pool.close()
    if out is not None:
        out.put((stale, bad))
    if res is not None:
        res.append((stale, bad))


def test_thread_stress_pool_smaller_than_concurrency(pool: KVPool) -> None:
    res: list = []
    ts = [threading.Thread(target=_worker, args=(str(pool.path), w, 25, None, res)) for w in range(12)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert len(res) == 12
    assert sum(b for _, b in res) == 0  # never another request's KV
    assert sum(s for s, _ in res) > 0  # the pool really was contended (reads were refused and retried)


def test_process_stress_pool_smaller_than_concurrency(pool: KVPool) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    n = 6
    bar = ctx.Barrier(n)
    ps = [ctx.Process(target=_worker, args=(str(pool.path), w, 40, q, None, bar)) for w in range(n)]
    for p in ps:
        p.start()
    res = [q.get(timeout=120) for _ in ps]
    for p in ps:
        p.join(30)
    assert sum(b for _, b in res) == 0
    assert sum(s for s, _ in res) > 0


def test_rank_over_pooled_cache_equals_direct(tmp_path: Path) -> None:
    """The ranking process's view: model.rank over a cache read back from the pool == over the original."""
    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", dropout=0.0)
    model = GenRecModel(cfg).eval()
    pool = KVPool.create(pool_spec_for(cfg, 2, cfg.max_items), tmp_path / "m.json")
    try:
        g = torch.Generator().manual_seed(1)
        n = 6
        mb = ModelBatch(actions=torch.randint(0, cfg.n_actions, (1, n), generator=g),
                        surfaces=torch.zeros(1, n, dtype=torch.long), lengths=torch.tensor([n]),
                        sid_codes=torch.stack([torch.randint(0, k, (1, n), generator=g)
                                               for k in cfg.sid_codebook_sizes], -1),
                        item_feats=torch.randn(1, n, cfg.item_feat_dim, generator=g))
        cand = torch.nn.functional.normalize(torch.randn(1, 5, cfg.item_dim, generator=g), dim=-1)
        csid = torch.stack([torch.randint(0, k, (1, 5), generator=g) for k in cfg.sid_codebook_sizes], -1)
        with torch.no_grad():
            cache, _, _ = model.encode_history(mb)
            want = model.rank(cache, cand, csid, torch.tensor([0]))
            le = pool.lease()
            pool.write(le, cache)
            got = model.rank(pool.read(le.slot, le.gen), cand, csid, torch.tensor([0]))
        assert torch.equal(got, want)
    finally:
        pool.close()


def _cuda_reader(path: str, slot: int, gen: int, q: "mp.Queue") -> None:
    try:
        pool = KVPool.attach(path)
        c = pool.read(slot, gen)
        q.put([t.cpu().numpy() for t in c.k])  # numpy: a torch tensor would be shared via this exiting process
    except BaseException as e:  # noqa: BLE001 - the parent reports it instead of waiting out the queue
        q.put(f"{type(e).__name__}: {e}")


@pytest.mark.gpu
def test_cuda_ipc_pool_across_processes(tmp_path: Path) -> None:
    """GPU path: K/V on the device, IPC handles in the per-instance file, read from another process."""
    spec = PoolSpec(layers=2, slots=2, kv_heads=2, n_max=8, head_dim=4, d_model=6, device="cuda:0")
    pool = KVPool.create(spec, tmp_path / "cuda.json")
    try:
        c = fake_cache(5, 6, spec)
        c.k = [t.cuda() for t in c.k]
        c.v = [t.cuda() for t in c.v]
        le = pool.lease()
        pool.write(le, c)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_cuda_reader, args=(str(pool.path), le.slot, le.gen, q))
        p.start()
        ks = q.get(timeout=60)
        p.join(30)
        assert not isinstance(ks, str), ks
        assert all(torch.equal(torch.from_numpy(a), b.cpu()) for a, b in zip(ks, c.k))
    finally:
        pool.close()
