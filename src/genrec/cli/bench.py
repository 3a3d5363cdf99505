"""``genrec bench``: serving load (serve), kernel and decode speed (kernels), the training step (train)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from genrec.cli._app import RUNDIR, bench_app, check_micro_batch, echo_json, friendly


@bench_app.command("kernels")
@friendly
def bench_kernels(
    iters: int = typer.Option(20, help="Timed runs per measurement (median)."),
    warmup: int = typer.Option(5, help="Untimed runs first."),
    quick: bool = typer.Option(False, help="Skip the block-size / split sweeps and the 8x128 shape."),
    only: str = typer.Option("correctness,train,cascade,ceilings", help="Kernel sections to run."),
    decode: str = typer.Option("beam,sid,trie,rank", help="Decode sections to run after ('' = none)."),
    tiny: bool = typer.Option(False, help="Tiny shapes (with TRITON_INTERPRET=1 also on a CPU: a smoke run)."),
    sustain: float = typer.Option(0.0, help="Also run each training row back to back this many seconds, with the "
                                            "SM clock and power draw it ran at (nvidia-smi)."),
) -> None:
    """Every fast path checked against its reference, then timed beside its peers in one run:
    item-block attention vs FlexAttention / SDPA, cascade vs per-beam attention, the H200
    ceilings; then beam search shared vs copied, the CUDA-graph SID decode, GPU vs CPU trie,
    ranking decode vs full prefill. Tables printed; JSON to $OUT when set. GPU only."""
    import torch

    from genrec.bench import decode as bench_decode
    from genrec.bench import kernels as bench_k

    args = ["--iters", str(iters), "--warmup", str(warmup), "--only", only] + (["--quick"] if quick else []) \
        + (["--tiny"] if tiny else []) + (["--sustain", str(sustain)] if sustain > 0 else [])
    rc = bench_k.main(args)
    if rc == 0 and decode and (torch.cuda.is_available() or tiny):
        rc = bench_decode.main(["--iters", str(iters), "--warmup", str(warmup), "--only", decode]
                               + (["--tiny"] if tiny else []))
    if rc:
        raise typer.Exit(rc)


@bench_app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@friendly
def bench_train(
    ctx: typer.Context,
    workdir: Path = RUNDIR,
    preset: str = typer.Option("cpu-small", help="Run preset the variants start from (as `genrec train`)."),
    variants: str = typer.Option("pinger,tiger", help="Comma-separated variants, each timed in turn; NAME+noattn "
                                                      "is NAME's attention-free bound (attention returns V)."),
    steps: int = typer.Option(20, help="Timed optimiser steps per variant."),
    warmup: int = typer.Option(3, help="Untimed steps first (compiles included)."),
    rounds: int = typer.Option(1, help="Run the variant list this many times, in turn (an A/B in one process)."),
    synthetic: str = typer.Option("", help="BxN: B random full-length histories of N catalogue items per step "
                                           "(the equal-context shape; adds the FLOP-ceiling column)."),
    compile_mode: str = typer.Option("", help="torch.compile mode with train.compile=true (reduce-overhead: "
                                              "CUDA graphs)."),
) -> None:
    """The training step of PinGER's layout against the TIGER layout (or any variants) at equal context, side
    by side in one process: ms/step, items/s, the ratio, and what the attention mask allows by FLOPs. Extra
    arguments are config overrides, e.g. train.compile=true model.d_model=768. JSON to $OUT when set."""
    from genrec.bench import train as bt

    argv = [str(workdir), "--preset", preset, "--variants", variants, "--steps", str(steps), "--warmup", str(warmup),
            "--rounds", str(rounds)] + (["--synthetic", synthetic] if synthetic else []) \
        + (["--compile-mode", compile_mode] if compile_mode else []) + list(ctx.args)
    bt.main(argv)


@bench_app.command("serve")
@friendly
def bench_serve(
    workdir: Path = RUNDIR,
    duration: float = typer.Option(60.0, help="Seconds of load."),
    concurrency: int = typer.Option(8, help="Closed-loop clients."),
    max_requests: int = typer.Option(1_000_000, help="Stop after this many requests."),
    url: Optional[str] = typer.Option(None, help="Target a running loopback server (default: start one)."),
    history_len: int = typer.Option(50, help="Items in each request's history (sampled from real users)."),
    beam_width: int = typer.Option(20, help="SID beam width asked for in each request."),
    k: int = typer.Option(10, help="Items asked for in each request."),
    rank: bool = typer.Option(True, help="Ask for the L1 ranking (--no-rank: retrieval only)."),
    two_process: bool = typer.Option(False, help="Start the server with ranking in a second process "
                                                  "(`genrec serve --two-process`); not with --url."),
    micro_batch: Optional[int] = typer.Option(None, help="Server-side micro-batch size; 1 = off (default: "
                                                         "`genrec serve`'s, 32)."),
    micro_batch_policy: Optional[str] = typer.Option(None, help="Server-side micro-batch policy: busy (the default) "
                                                              "or timed."),
    micro_batch_wait_ms: float = typer.Option(2.0, help="The timed policy's wait (ms)."),
    client: str = typer.Option("raw", help="Load-generator client: raw (lean HTTP/1.1 on asyncio streams) or httpx."),
    threads: Optional[int] = typer.Option(None, help="The started server's --threads (default: `genrec serve`'s, "
                                                     "from the machine); not with --url."),
    torch_threads: Optional[int] = typer.Option(None, help="The started server's --torch-threads (default: `genrec "
                                                           "serve`'s, from the machine); not with --url."),
    procs: int = typer.Option(1, help="Client processes the --concurrency clients are spread over (a client "
                                      "process near 1.0 client_busy is the bottleneck: add processes)."),
    fronts: Optional[int] = typer.Option(None, help="The started server's --fronts (HTTP in N front processes; default: "
                                                    "`genrec serve`'s); not with --url."),
) -> None:
    """Load-test /v1/recommend on loopback: p50/p99 latency, QPS, errors, and the client's CPU use."""
    from genrec.serve.loadtest import bench_serve as run_bench

    check_micro_batch(micro_batch_policy, micro_batch_wait_ms, micro_batch)
    if url is not None and (threads is not None or torch_threads is not None or fronts is not None):
        raise typer.BadParameter("--threads / --torch-threads / --fronts set up the server bench serve starts: not "
                                 "with --url")
    res = run_bench(workdir, url=url, duration=duration, concurrency=concurrency, max_requests=max_requests,
                    history_len=history_len, beam_width=beam_width, k=k, rank=rank, two_process=two_process,
                    micro_batch=micro_batch, micro_batch_policy=micro_batch_policy,
                    micro_batch_wait_ms=micro_batch_wait_ms, client=client, threads=threads,
                    torch_threads=torch_threads, procs=procs, fronts=fronts)
    typer.echo(res.table())
    echo_json(res.summary())
