"""GPU-only diagnosis of the CUDA-IPC KV pool: does another process see the pool's device memory?

    python benchmarks/debug_cuda_ipc.py

Three checks, each in a spawned child with faulthandler on (a hang prints the child's stack after
20 s; a crash prints its signal and exit code), so one device call says where the path breaks:
1. torch's own CUDA tensor sharing through a torch.multiprocessing queue (is CUDA IPC usable here?);
2. ``KVPool.attach`` of a CUDA pool, stage by stage;
3. a ``read`` of a written slot, compared with what was written.
"""

from __future__ import annotations

import faulthandler
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as tmp


def _say(msg: str) -> None:
    print(f"[child {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _torch_child(q_in, q_out) -> None:  # noqa: ANN001 - torch.multiprocessing queues
    faulthandler.enable()
    faulthandler.dump_traceback_later(20, exit=True)
    t = q_in.get(timeout=20)
    _say(f"torch queue: got {tuple(t.shape)} on {t.device}")
    q_out.put(float(t.sum().item()))


def _pool_child(path: str, slot: int, gen: int, q_out) -> None:  # noqa: ANN001
    faulthandler.enable()
    faulthandler.dump_traceback_later(20, exit=True)
    try:
        from genrec.serve.kv_pool import KVPool
        _say("imported; attaching")
        pool = KVPool.attach(path)
        _say(f"attached: k on {pool.k.device}, shape {tuple(pool.k.shape)}")
        c = pool.read(slot, gen)
        _say("read done")
        q_out.put([t.cpu().numpy() for t in c.k])
    except BaseException as e:  # noqa: BLE001
        q_out.put(f"{type(e).__name__}: {e}")


def main() -> None:
    ctx = tmp.get_context("spawn")
    print("torch", torch.__version__, "cuda", torch.version.cuda, flush=True)
    # 1. torch's own path
    x = torch.arange(12, dtype=torch.float32, device="cuda").view(3, 4)
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_torch_child, args=(q_in, q_out))
    p.start()
    q_in.put(x)
    try:
        print("1. torch queue sharing:", q_out.get(timeout=40), "expected", float(x.sum()), flush=True)
    except Exception as e:  # noqa: BLE001
        print("1. torch queue sharing FAILED:", type(e).__name__, e, flush=True)
    p.join(10)
    print("   child exit code", p.exitcode, flush=True)

    # 2-3. the pool
    from genrec.model.kv_cache import KVCache
    from genrec.model.layout import TokenMeta
    from genrec.serve.kv_pool import KVPool, PoolSpec

    spec = PoolSpec(layers=2, slots=2, kv_heads=2, n_max=8, head_dim=4, d_model=6, device="cuda:0")
    with tempfile.TemporaryDirectory() as d:
        pool = KVPool.create(spec, Path(d) / "pool.json")
        n = 5
        ks = [torch.randn(1, 2, n, 4, device="cuda") for _ in range(2)]
        vs = [torch.randn(1, 2, n, 4, device="cuda") for _ in range(2)]
        meta = TokenMeta(torch.arange(n)[None], torch.zeros(1, n, dtype=torch.int64), torch.zeros(1, n, dtype=torch.int64))
        cache = KVCache(ks, vs, meta, torch.tensor([n]), torch.randn(1, 6), "pinger", None)
        le = pool.lease()
        pool.write(le, cache)
        print("2. pool written; handles:", [len(h["handle"]) for h in pool_desc(pool.path)], flush=True)
        q = ctx.Queue()
        p = ctx.Process(target=_pool_child, args=(str(pool.path), le.slot, le.gen, q))
        p.start()
        try:
            got = q.get(timeout=40)
            if isinstance(got, str):
                print("3. pool read FAILED in child:", got, flush=True)
            else:
                ok = all(torch.equal(torch.from_numpy(a), b.cpu()) for a, b in zip(got, ks))
                print("3. pool read across processes:", "equal" if ok else "DIFFERENT", flush=True)
        except Exception as e:  # noqa: BLE001
            print("3. pool read FAILED (no answer):", type(e).__name__, e, flush=True)
        p.join(10)
        print("   child exit code", p.exitcode, flush=True)
        pool.close()


def pool_desc(path: Path) -> list:
    import json
    return json.loads(path.read_text())["cuda_ipc"]


if __name__ == "__main__":
    main()
