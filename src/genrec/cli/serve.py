"""``genrec serve`` (the HTTP service) and ``genrec recommend`` (one user or history, in-process)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from genrec.cli._app import CHECKPOINT, RUNDIR, app, check_micro_batch, echo_json, friendly

SID_MODE_HELP = ("The SID stage: full (full-code beams), prefix / merged (beams over the semantic levels, then every "
                 "item under each prefix, beam by beam / by score: reaches items `genrec sid assign` added since "
                 "training), dense (the same beams, the item inside each prefix by its dense score) or auto "
                 "(default): merged while the catalogue holds such items, else dense where the model has a dense "
                 "stage, else full.")
SID_MODE_OVERRIDE_HELP = SID_MODE_HELP.replace("auto (default)", "default $GENREC_SID_MODE, else auto")


@app.command()
@friendly
def serve(
    workdir: Path = RUNDIR,
    checkpoint: Optional[str] = CHECKPOINT,
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback unless told otherwise)."),
    port: int = typer.Option(8000, help="TCP port to listen on."),
    workers: int = typer.Option(1, help="uvicorn worker processes (each loads its own bundle)."),
    two_process: bool = typer.Option(False, help="Ranking in a separate process over a shared KV pool."),
    fronts: Optional[int] = typer.Option(
        None, help="N > 0: N front processes answer HTTP (read, validate, serialise) and pass each request to this "
                   "process, which runs the model and batches requests from every front together: more requests a "
                   "second where one process's HTTP handling is the limit (a GPU server). 0: one process does both. "
                   "Default: min(4, cores // 4) on a CUDA server (one --workers) micro-batching under the busy "
                   "policy, --two-process or not; else 0."),
    threads: Optional[int] = typer.Option(
        None, help="Requests that run inference at once, per server process. Default from the machine: "
                   "min(4, cores) (one at a time stalled the 2-core CPU box under load; past 4 they queue on the "
                   "GIL)."),
    torch_threads: Optional[int] = typer.Option(
        None, help="torch's intra-op threads per server process. Default from the machine: on a CPU, cores // "
                   "(--threads x --workers), at least 1, so concurrent forwards use each core once (2-core box, "
                   "1-4 clients: 75-106 QPS, against 41-83 with torch's own thread per core); on CUDA, torch's "
                   "default."),
    max_body_bytes: int = typer.Option(1 << 20, help="Request body size limit (413 above)."),
    pool_slots: int = typer.Option(0, help="KV-pool slots (two-process mode): a micro-batch is ranked in calls of "
                                          "this many rows; 0: max(16, --micro-batch), one call a batch."),
    kv_pool_device: str = typer.Option(
        "auto", help="Two-process KV pool: auto (the server's device), cpu (shared memory) or cuda (CUDA IPC)."),
    device: str = typer.Option("cpu", help="Where the model runs: cpu, cuda or cuda:N."),
    micro_batch: Optional[int] = typer.Option(
        None, help="Group up to N concurrent requests into one forward; 1 = off (default: 32, the largest batch "
                   "bucket)."),
    micro_batch_policy: Optional[str] = typer.Option(
        None, help="With --micro-batch > 1: busy (the default: a lone request runs at once; requests queued while a "
                   "batch runs form the next batch, no timer) or timed (a group's first request waits "
                   "--micro-batch-wait-ms for more)."),
    micro_batch_wait_ms: float = typer.Option(2.0, help="The timed policy's wait for followers (ms)."),
    micro_batch_linger_ms: Optional[float] = typer.Option(
        None, help="The busy policy: a batch smaller than the batch two before it (under a closed loop, its cohort's "
                   "last) waits up to this long (ms) for more; 0 = off. Default: 3 on a CUDA server with front "
                   "processes (more requests a second and a shorter p99 there), else 0."),
    host_overlap: bool = typer.Option(
        False, help="Micro-batched requests parse their histories and format their answers in their own threads, "
                    "beside the batch running ahead (the batch runs only the model); off: the batch does all three "
                    "(on: 10% fewer requests a second on the 2-core CPU box, 12% on an H100)."),
    precision: str = typer.Option("float32", help="float32 or bf16 (autocast on CUDA; CPU stays float32)."),
    warm_beams: str = typer.Option(
        "20", help="SID beam widths (the requests' beam_width, comma-separated) whose CUDA graphs are captured "
                   "before the server says it is ready, at every batch and history bucket (and k 10): a width met "
                   "first under load captures its shapes then, each a stall of every batch behind it. Default 20, "
                   "the requests' default."),
    sid_mode: str = typer.Option("auto", help=SID_MODE_HELP),
    cuda_graphs: Optional[str] = typer.Option(
        None, help="On CUDA: which stages replay CUDA graphs: all (default: encode, SID decode, ranking), sid, off."),
    batch_buckets: Optional[str] = typer.Option(
        None, help="Static batch shapes: a micro-batch is padded to the next of these sizes, e.g. 1,2,4,8,16,32, "
                   "so each graph is captured once per size; auto (default: those sizes when CUDA graphs replay, "
                   "none on a CPU) or off."),
    admin_token: Optional[str] = typer.Option(
        None, envvar="GENREC_ADMIN_TOKEN", help="/admin/reload then needs 'Authorization: Bearer TOKEN' (set it "
                                                "whenever --host is not loopback)."),
    access_log: bool = typer.Option(False, help="uvicorn's access log: one line per request on stdout. Off by "
                                                "default (the start-up lines on stderr still come); /metrics "
                                                "counts requests either way."),
) -> None:
    """HTTP service: /v1/recommend, /v1/rank, /healthz, /readyz, /metrics, /admin/reload (or SIGHUP), and the
    explorer page at / (a user's history, each stage's candidates and latencies).
    With --workers > 1, SIGHUP the main process: it restarts every worker on the newest version.
    On stderr it says the URL it listens on, the checkpoint and index_version it loaded, the device, and
    when it is ready."""
    import os
    import signal

    if precision not in ("float32", "bf16"):
        raise typer.BadParameter(f"--precision must be float32 or bf16, got {precision!r}")
    if threads is not None and threads < 1:
        raise typer.BadParameter(f"--threads must be >= 1, got {threads}")
    if torch_threads is not None and torch_threads < 1:
        raise typer.BadParameter(f"--torch-threads must be >= 1, got {torch_threads}")
    if kv_pool_device not in ("auto", "cpu", "cuda"):
        raise typer.BadParameter(f"--kv-pool-device must be auto, cpu or cuda, got {kv_pool_device!r}")
    if fronts is not None and (fronts < 0 or (fronts > 0 and workers > 1)):
        raise typer.BadParameter(f"--fronts must be >= 0 and goes with --workers 1, got --fronts {fronts} "
                                 f"--workers {workers}")
    check_micro_batch(micro_batch_policy, micro_batch_wait_ms, micro_batch)
    if pool_slots < 0:
        raise typer.BadParameter(f"--pool-slots must be >= 0 (0: max(16, --micro-batch)), got {pool_slots}")
    try:
        beams = tuple(int(w) for w in warm_beams.split(","))  # (Engine.load warms each width once)
    except ValueError:
        raise typer.BadParameter(f"--warm-beams must be comma-separated beam widths, got {warm_beams!r}") from None
    if micro_batch_linger_ms is not None and not micro_batch_linger_ms >= 0:
        raise typer.BadParameter(f"--micro-batch-linger-ms must be >= 0, got {micro_batch_linger_ms}")
    os.environ["GENREC_PRECISION"] = precision  # read by every process that loads a model
    if cuda_graphs is not None:
        if cuda_graphs not in ("off", "sid", "all"):
            raise typer.BadParameter(f"--cuda-graphs must be off, sid or all, got {cuda_graphs!r}")
        os.environ["GENREC_CUDA_GRAPHS"] = cuda_graphs  # likewise
    # SIGHUP is the reload trigger: never the default "end the process", not even while torch imports and the
    # bundle loads (the app's own handler takes over once it runs)
    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN) if hasattr(signal, "SIGHUP") else None
    try:
        from genrec.infer.buckets import resolve_buckets
        from genrec.infer.load import find_checkpoint, resolve_sid_mode
        # first: without the [serve] extra this is the one line that says `pip install 'genrec[serve]'`
        from genrec.serve.config import (DEFAULT_MICRO_BATCH, DEFAULT_MICRO_BATCH_POLICY, ServeConfig,
                                         default_fronts, default_linger_ms, default_threads,
                                         default_torch_threads)
        from genrec.serve.schemas import MAX_BEAM

        if not all(1 <= w <= MAX_BEAM for w in beams):
            raise typer.BadParameter(f"--warm-beams: each width must be in 1..{MAX_BEAM} (a request's beam_width), "
                                     f"got {warm_beams}")

        os.environ["GENREC_SID_MODE"] = resolve_sid_mode(sid_mode)  # checked; read by every process, likewise
        if batch_buckets is not None:
            resolve_buckets(batch_buckets, graphed=True)  # checked: a bad list is one line here
            os.environ["GENREC_BATCH_BUCKETS"] = batch_buckets  # likewise
        find_checkpoint(workdir, checkpoint)  # before the server starts: a missing model is one line, not a traceback
    except BaseException:
        if hup is not None:
            signal.signal(signal.SIGHUP, hup)
        raise
    from genrec.serve.app import serve as run_server

    threads = default_threads(device) if threads is None else threads
    micro_batch = DEFAULT_MICRO_BATCH if micro_batch is None else micro_batch
    micro_batch_policy = micro_batch_policy or DEFAULT_MICRO_BATCH_POLICY
    if fronts is None:
        fronts = default_fronts(device, workers=workers, micro_batch=micro_batch,
                                micro_batch_policy=micro_batch_policy)
    if micro_batch_linger_ms is None:
        micro_batch_linger_ms = default_linger_ms(device, fronts, micro_batch_policy)
    if torch_threads is None:
        torch_threads = default_torch_threads(device, threads, workers)
    cfg = ServeConfig(workdir=workdir, checkpoint=checkpoint, device=device, two_process=two_process,
                      max_body_bytes=max_body_bytes, threads=threads, torch_threads=torch_threads,
                      pool_slots=pool_slots, micro_batch=micro_batch, micro_batch_policy=micro_batch_policy,
                      micro_batch_wait_ms=micro_batch_wait_ms, micro_batch_linger_ms=micro_batch_linger_ms,
                      kv_pool_device=kv_pool_device, host_overlap=host_overlap, admin_token=admin_token or None,
                      warm_beams=beams,
                      announce=True)
    run_server(cfg, host=host, port=port, workers=workers, access_log=access_log, fronts=fronts)


@app.command()
@friendly
def recommend(
    workdir: Path = typer.Argument(..., help="A trained run directory."),
    user: Optional[str] = typer.Option(None, help="Use this user's full event history from the tables (the "
                                                  "source file's id when the data was prepared with --map-ids)."),
    history: Optional[str] = typer.Option(None, help="Comma-separated item ids, oldest first (source-file ids "
                                                     "with --map-ids)."),
    k: int = typer.Option(10, help="How many items to return."),
    beam_width: int = typer.Option(20, help="SID beam width (HTTP: beam_width)."),
    diversity_lambda: float = typer.Option(0.0, help="PinGER prefix-depth diversity penalty (HTTP: diversity_lambda)."),
    rank: bool = typer.Option(True, help="The L1 ranking (--no-rank: order by retrieval; HTTP: rank)."),
    sources: Optional[str] = typer.Option(None, help="sid,ann (default: every stage the model has)."),
    overretrieve: int = typer.Option(3, help="L0 over-retrieval factor r (each stage returns K*r)."),
    exclude_history: bool = typer.Option(False, help="Drop items already in the history."),
    checkpoint: Optional[str] = CHECKPOINT,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    sid_mode: Optional[str] = typer.Option(None, help=SID_MODE_OVERRIDE_HELP),
    as_of: Optional[str] = typer.Option(None, help="With --user: valid | test -- the case genrec eval scores (the "
                                                   "events before that split's target), and where the target lands."),
) -> None:
    """Recommend items for a user (--user) or an ad-hoc history (--history): SID beams + ANN, ranked."""
    from genrec.errors import ConfigError
    from genrec.infer.cases import SourceIds, user_case
    from genrec.infer.recommender import Recommender

    if (user is None) == (history is None):
        raise ConfigError("give exactly one of --user ID or --history 'id,id,...'")
    if as_of is not None and user is None:
        raise ConfigError("--as-of goes with --user (an eval case is one user's events before a target)")
    target = None
    ids = SourceIds.of(workdir)  # --map-ids data: people type and read the source file's ids
    unknown: list[str] = []
    rec = Recommender.from_checkpoint(workdir, checkpoint, sid_mode=sid_mode)
    if user is not None:
        if ids is not None:
            uid = ids.user(user)
        else:
            try:
                uid = int(user)
            except ValueError:
                raise ConfigError(f"--user: expected an integer user id, got {user!r}") from None
        hist: list
        hist, target = user_case(workdir, uid, as_of, rec.split_kind)
    elif ids is not None:
        toks = [x.strip() for x in str(history).split(",") if x.strip()]
        unknown = [x for x in toks if x not in ids.items]
        hist = [ids.items[x] for x in toks if x in ids.items]
    else:
        try:
            hist = [int(x) for x in str(history).split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--history: expected comma-separated integer item ids, got {history!r}") from None
    srcs = None if sources is None else tuple(s.strip() for s in sources.split(",") if s.strip())
    from typing import cast

    from genrec.infer.results import RecommendationList

    recs = cast(RecommendationList, rec.recommend(
        hist, k=k, beam_width=beam_width, diversity_lambda=diversity_lambda, sources=srcs, rank=None if rank else False,
        overretrieve=overretrieve, exclude_history=exclude_history))  # one history -> one list
    if ids is not None:  # back to the source file's ids, for the reader
        recs.dropped_items = [*unknown, *(ids.item_original.get(i, i) for i in recs.dropped_items)]  # type: ignore[list-item]
    where = None
    if target is not None:
        got = [r.item_id for r in recs]
        where = {"split": as_of, **target, "rank": got.index(target["item_id"]) + 1 if target["item_id"] in got
                 else None}
    if as_json:
        out = {"step": rec.step, **recs.to_dict(), **({"target": where} if where else {})}
        if ids is not None:
            for d in out["items"]:
                d["original_item_id"] = ids.item_original.get(d["item_id"])
        echo_json(out)
        return
    from genrec.infer.show import print_recommendations

    who = f"user {user}" if user is not None else "the given history"
    if where is not None:
        who += f", as of the {as_of} case"
    print_recommendations(recs, who=who, step=rec.step,
                          label=None if ids is None else (lambda i: f"{ids.item_original.get(i, '?')} (#{i})"))
    if where is not None:
        name = ids.item_original.get(where["item_id"], where["item_id"]) if ids is not None else where["item_id"]
        typer.echo(f"held-out {as_of} target: item {name} ({where['action']}): "
                   + (f"rank {where['rank']} of {k}" if where["rank"] else f"not in the top {k}"))
