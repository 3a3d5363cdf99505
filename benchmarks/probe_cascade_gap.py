"""Why `genrec bench kernels` timed the cascade's trusted eager call at W = 10 about twice as slow as
probe_cascade_host.py on the same machine and commit (twenty-fifth and twenty-sixth sessions: 0.147 against
0.0745 ms). The GPU clock is not it (the twenty-seventh session's clock log: 1,980 MHz throughout both).

One process, one set of inputs (the bench's shape: 8 requests x 1,000-key history, 12 x 64 heads, 3 SID
tokens per beam, W = 10, bf16), the same trusted call timed one way after another, each step changing one
thing from the probe's clock towards the bench's: the probe's interleaved rounds; the bench's `median_ms`
(5 warm-up calls, median of 20, each call after a synchronize) with grad on, then under no_grad, then with
100 calls; then the bench's own `bench_cascade(10, ...)` row; then the first clock again. Each line prints
the median and the 10th/90th percentiles of its per-call samples. Run on the GPU machine:
python3 benchmarks/probe_cascade_gap.py."""

from __future__ import annotations

import statistics
import time

import torch

from genrec.kernels import cascade as C
from genrec.validation import trusted_inputs
from probe_cascade_host import cascade_inputs  # (this folder: the script runs as benchmarks/probe_cascade_gap.py)


def synced(fn, n: int) -> list[float]:
    """Per-call milliseconds of ``n`` calls, each after a synchronize (CUDA events around the call)."""
    out = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return out


def interleaved(fn, rounds: int = 7) -> list[float]:
    """probe_cascade_host.py's sync clock: 20 synced calls then 200 back-to-back calls, per round."""
    out = []
    for _ in range(rounds):
        out += synced(fn, 20)
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
    return out


def report(name: str, xs: list[float]) -> None:
    q = statistics.quantiles(xs, n=10)
    print(f"{name:58s} median {statistics.median(xs):.4f}  p10 {q[0]:.4f}  p90 {q[-1]:.4f}  (n {len(xs)})", flush=True)


def main() -> None:
    q, ks, vs, kh, vh, hl = cascade_inputs("cuda")

    def trusted():
        with trusted_inputs():
            return C.cascade_attention_triton(q, kh, vh, ks, vs, hl, num_splits=1)

    for _ in range(20):
        trusted()
    torch.cuda.synchronize()
    report("1 probe clock (interleaved rounds)", interleaved(trusted))
    for _ in range(5):
        trusted()
    report("2 synced only, 5 warm-up, 20 calls (bench median_ms)", synced(trusted, 20))
    with torch.no_grad():
        for _ in range(5):
            trusted()
        report("3 as 2, under no_grad (as bench_cascade)", synced(trusted, 20))
        report("4 as 3, 100 calls", synced(trusted, 100))
        t0 = time.perf_counter()
        time.sleep(0.2)
        report(f"5 as 4 after {time.perf_counter() - t0:.1f} s idle (host sleeping)", synced(trusted, 100))
    from genrec.bench import kernels as K

    K.DEV = "cuda"
    report("6 after importing genrec.bench.kernels", synced(trusted, 100))
    K.bench_cascade(10, 5, 20, sweep=False)
    row = K.RESULTS["cascade"][-1]
    print(f"7 bench_cascade(10) row: trusted {row['triton_s1_trusted_ms']:.4f}  checked {row['triton_s1_ms']:.4f}  "
          f"per-beam {row['per_beam_sdpa_ms']:.4f}  b2b trusted {row['b2b_triton_s1_trusted_ms']:.4f}", flush=True)
    report("8 synced, after bench_cascade (its graphs captured)", synced(trusted, 100))
    report("9 probe clock again", interleaved(trusted))
    report("10 bench median_ms itself (5, 20)", [K.median_ms(trusted, 5, 20, "cuda") for _ in range(15)])


if __name__ == "__main__":
    main()
