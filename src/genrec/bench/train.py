"""The training step of genrec's layouts at equal context, measured side by side in one run: ``genrec bench
train`` (and ``benchmarks/bench_train.py``, which adds A/B switches for experiments).

For each variant: build the model + objective exactly as ``genrec train`` does, run ``warmup`` steps, then time
``steps`` optimiser steps (forward + backward + AdamW), synchronising the device. Reports items/s (history items
consumed per second: the comparable figure) and tokens/s (tokens through the backbone: L per item for PinGER's
training layout and for TIGER), the ratio to the TIGER layout of the same round, and with ``--synthetic`` (full
rows of one length) the FLOP ceiling of that ratio (:func:`flop_ceiling`). Prints a table last; the full numbers
go to ``$OUT/bench_train.json`` when OUT is set. ``--rounds N`` runs the variant list N times in turn, so an A/B
alternates in one process (separate processes on a shared host measured the same code 25% apart). Each variant's
compiled graph starts from a reset dynamo cache (else recompiles of the same forward would reach dynamo's limit
and run eager).

A variant named with the suffix ``+noattn`` (``pinger+noattn``) is a bound, not a model: every backbone attention
call returns its values unchanged (:func:`no_attention`), so the step keeps its embeddings, projections, MLPs,
norms, SID fusion, heads, losses and optimiser and loses only the attention's time. The TIGER step over that
row's step is the most any attention kernel, however fast, could make that variant gain at this shape.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from types import SimpleNamespace
from typing import Any, ContextManager

import torch
from torch.profiler import ProfilerActivity, profile as torch_profile

from genrec.catalog import load_catalog, open_store
from genrec.data.join import BucketJoinReader
from genrec.data.splits import SplitSpec
from genrec.model import backbone
from genrec.model.genrec_model import GenRecModel
from genrec.sid.build import open_current
from genrec.train.batches import BatchStream, TrainBatch, materialise
from genrec.train.config import compile_kwargs
from genrec.train.objective import JointObjective
from genrec.train.run import RunConfig, build_model_config, variant_overrides

__all__ = ["synthetic_batch", "pinger_pairs", "flop_ceiling", "no_attention", "bench_variant", "run_variants", "compare",
           "table", "main"]

NO_ATTENTION = "+noattn"  # variant suffix: the attention-free bound (no_attention)
BOUND = "none (bound)"  # a bound row's "attention" (the others': "model")


def synthetic_batch(step: int, batch: int, items: int, n_catalog: int, n_actions: int) -> TrainBatch:
    """Full-length histories of ``items`` random catalogue rows (every row exactly that long): the
    equal-context shape of the kernel benchmark, through the whole training step."""
    g = torch.Generator().manual_seed(step)
    rows = torch.randint(0, n_catalog, (batch, items), generator=g)
    z = torch.zeros(batch, items, dtype=torch.int64)
    return TrainBatch(rows, torch.randint(0, n_actions, (batch, items), generator=g), z, z,
                      torch.full((batch,), items, dtype=torch.int64), None, None, None, None, None)


def pinger_pairs(n_items: int, T: int) -> int:
    """(query, key) pairs PinGER's mask keeps in one full row of ``n_items`` items x ``T`` tokens: item i's
    dense token sees the i + 1 dense tokens up to its own, its SID token at level l the i earlier dense tokens
    and its own l levels (``genrec.bench.kernels._visible_pairs``, for one full row, in closed form)."""
    i_sum = n_items * (n_items - 1) // 2  # sum of i over the row's items
    return (i_sum + n_items) + sum(i_sum + l * n_items for l in range(1, T))


def flop_ceiling(n_items: int, T: int, d: int, d_ff: int) -> float:
    """The most PinGER's training step can gain over the TIGER layout at equal context from its attention
    mask alone, by FLOPs: (projections + MLP + causal attention) / (projections + MLP + PinGER's attention)
    per layer and row of S = T n tokens, both layouts running the same tokens through the same matmuls, the
    backward the same multiple of each. Heads, losses, embeddings and SID fusion are left out."""
    S = T * n_items
    dense = _dense_flops(S, d, d_ff)
    return (dense + 4 * d * S * (S + 1) // 2) / (dense + 4 * d * pinger_pairs(n_items, T))


def _dense_flops(S: int, d: int, d_ff: int) -> int:
    """One layer's forward FLOPs outside attention for S tokens: QKV + output projections, the 2-matrix MLP."""
    return 2 * S * (4 * d * d + 2 * d * d_ff)


def attention_free_ceiling(n_items: int, T: int, d: int, d_ff: int) -> float:
    """The TIGER layout's step over an attention-free one by FLOPs, at equal context (same terms as
    :func:`flop_ceiling`, PinGER's attention counted as zero): the most any attention kernel could give."""
    S = T * n_items
    dense = _dense_flops(S, d, d_ff)
    return (dense + 4 * d * S * (S + 1) // 2) / dense


@contextlib.contextmanager
def no_attention() -> Iterator[None]:
    """While it is open, every backbone self-attention returns its values ``v`` unchanged: a bound for
    benchmarks (the step without its attention's time, every other kernel kept, autograd intact through the
    QKV projection), never a model. Restored afterwards, also on error."""
    saved = backbone.attention

    def values(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return v  # [B, H, S, Dh]: the output's shape, in training (no cache) S is q's

    backbone.attention = values  # type: ignore[assignment]
    try:
        yield
    finally:
        backbone.attention = saved


def bench_variant(workdir: str, preset: str, variant: str, steps: int, warmup: int, extra: list[str],
                  profile: int = 0, synthetic: tuple[int, int] | None = None, trace: str = "",
                  compile_mode: str = "") -> dict:
    """One variant's timed steps (see the module docstring): its row of the table. ``extra`` are config
    overrides on top of ``preset``; ``compile_mode`` (else ``train.compile_mode``) applies with train.compile=true."""
    if synthetic:
        extra = [*extra, f"data.context_len={synthetic[1]}", f"train.batch_size={synthetic[0]}"]
    # eager unless asked (train.compile=true): what these commands measured before gpu-base compiled by default
    cfg = RunConfig.from_name(preset, ["train.compile=false", f"variant={variant}", *extra])
    store = open_store(workdir)
    info = store.info()
    catalog = load_catalog(workdir)
    sizes = [int(k) for k in open_current(os.path.join(workdir, "sid")).codebook_sizes]
    mcfg = build_model_config(cfg, catalog, len(info.actions), len(info.surfaces), sizes)
    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() and cfg.train.device != "cpu" else "cpu")
    model = GenRecModel(mcfg)
    mode = compile_mode or cfg.train.compile_mode
    if cfg.train.compile:
        torch._dynamo.reset()
        model.compile(**compile_kwargs(mode))
    ocfg = variant_overrides(cfg)[1].for_actions(len(info.actions))
    obj = JointObjective(model, catalog, ocfg, [info.actions.index(a) for a in info.positive_actions]).to(dev)
    ex = materialise(BucketJoinReader(store, split=SplitSpec("loo"), role="train", context_len=10 ** 9), catalog)
    stream: Any = BatchStream(ex, batch_size=cfg.train.batch_size, seed=0, context_len=cfg.data.context_len,
                         n_actions=len(info.actions), p_rank=cfg.data.p_rank if ocfg.w_action > 0 else 0.0,
                         max_cands=cfg.data.max_cands, neg_cands=cfg.data.neg_cands, n_catalog=len(catalog),
                         pad_multiple=cfg.data.pad_multiple)
    if synthetic:
        stream = SimpleNamespace(batch_at=lambda i: synthetic_batch(i, synthetic[0], synthetic[1], len(catalog),
                                                                    len(info.actions)))
    opt = torch.optim.AdamW(obj.parameters(), lr=1e-4)
    use_bf16 = dev.type == "cuda" and cfg.train.bf16
    items = tokens = 0
    t0 = 0.0
    # per-step GPU time of the forward (batch copy, model and loss), the backward and the optimiser, from
    # CUDA events recorded around each (no extra synchronisation inside the timed steps)
    phases: list[tuple[Any, ...]] = []

    def step(i: int) -> dict:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if dev.type == "cuda" else None
        if ev:
            ev[0].record()
        b = stream.batch_at(i).to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
            out = obj.training_step(b)
        if ev:
            ev[1].record()
        out["loss"].backward()
        if ev:
            ev[2].record()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if ev:
            ev[3].record()
            phases.append(tuple(ev))
        return out

    for i in range(warmup + steps):
        if i == warmup:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            items = tokens = 0
            phases.clear()
        out = step(i)
        items += int(out["n_items"])
        tokens += int(out["n_tokens"])
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    split = {}
    if phases:
        for name, (a, z) in {"forward": (0, 1), "backward": (1, 2), "optimizer": (2, 3)}.items():
            split[f"{name}_ms"] = sum(ev[a].elapsed_time(ev[z]) for ev in phases) / len(phases)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    if profile:
        with torch_profile(activities=acts) as prof:
            for i in range(profile):
                step(warmup + steps + i)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
        print(f"== profile: {variant} {' '.join(extra)}, {profile} steps, by {key}")
        print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60))
        if dev.type == "cuda":
            print(f"== profile: {variant}, by self_cpu_time_total")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    if trace:
        with torch_profile(activities=acts, with_stack=True) as prof:
            step(warmup + steps + profile)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        path = f"{trace}.{variant}.json"
        prof.export_chrome_trace(path)
        print(f"== trace: {variant} -> {path}")
    return {"variant": variant, "layout": mcfg.layout, "attn_impl": mcfg.attn_impl, "device": str(dev),
            "batch": cfg.train.batch_size, "context_items": cfg.data.context_len, "steps": steps,
            "seconds": dt, "ms_per_step": 1000 * dt / steps, "items_per_s": items / dt, "tokens_per_s": tokens / dt,
            "tokens_per_item": mcfg.sid_levels if mcfg.layout in ("pinger", "tiger") else 1,
            "d_model": mcfg.d_model, "d_ff": mcfg.d_ff,
            "compile_mode": mode if cfg.train.compile else "eager", **split}


def run_variants(workdir: str, preset: str, variants: Iterable[str], steps: int, warmup: int, overrides: list[str],
                 *, rounds: int = 1, synthetic: tuple[int, int] | None = None, compile_mode: str = "",
                 profile: int = 0, trace: str = "",
                 context: Callable[[str], tuple[str, ContextManager[Any]]] | None = None) -> list[dict]:
    """Every variant, ``rounds`` times in turn, compared (:func:`compare`). ``context(spec)`` may map a variant
    spec to (variant name, a context it runs in): the benchmark script's A/B switches."""
    rows = []
    specs = list(variants)
    for rnd in range(rounds):
        for spec in specs:
            bound = spec.endswith(NO_ATTENTION)
            base = spec[: -len(NO_ATTENTION)] if bound else spec
            name, ctx = context(base) if context else (base, contextlib.nullcontext())
            with ctx, (no_attention() if bound else contextlib.nullcontext()):
                r = bench_variant(workdir, preset, name, steps, warmup, overrides, profile, synthetic, trace,
                                  compile_mode)
            rows.append({**r, "variant": spec, "round": rnd + 1, "attention": BOUND if bound else "model"})
    return compare(rows, full_rows=synthetic is not None)


def compare(rows: list[dict], full_rows: bool) -> list[dict]:
    """Each row's items/s against the TIGER row of its round (else the round's first), and for PinGER rows of
    full-length histories (``full_rows``) the FLOP ceiling of that ratio, the ratio as a fraction of it
    (``share_of_ceiling``) and the fraction of the gain above 1x that it reaches (``share_of_possible_gain``)."""
    for r in rows:
        same = [b for b in rows if b["round"] == r["round"]]
        base = next((b for b in same if b["layout"] == "tiger" and b.get("attention") != BOUND), same[0])
        r["items_per_s_vs_tiger"] = r["items_per_s"] / base["items_per_s"]
        if r.get("attention") == BOUND:  # no attention at all: its FLOP figure is TIGER's over none
            if base["layout"] == "tiger" and full_rows:
                r["flop_ceiling_vs_tiger"] = attention_free_ceiling(r["context_items"], r["tokens_per_item"],
                                                                    r["d_model"], r["d_ff"])
            continue
        if r["layout"] == "pinger" and base["layout"] == "tiger" and full_rows:
            r["flop_ceiling_vs_tiger"] = flop_ceiling(r["context_items"], r["tokens_per_item"], r["d_model"], r["d_ff"])
            # the measured ratio as a fraction of the ceiling, and of the gain over 1x the ceiling allows
            r["share_of_ceiling"] = r["items_per_s_vs_tiger"] / r["flop_ceiling_vs_tiger"]
            r["share_of_possible_gain"] = (r["items_per_s_vs_tiger"] - 1) / (r["flop_ceiling_vs_tiger"] - 1) \
                if r["flop_ceiling_vs_tiger"] > 1 else None
    return rows


def table(rows: list[dict]) -> str:
    """The rows as the printed table."""
    lines = [f"{'variant':20s} {'round':>5s} {'attn':9s} {'device':6s} {'batch':>5s} {'ctx':>4s} {'ms/step':>8s} "
             f"{'items/s':>9s} {'tokens/s':>9s} {'vs tiger':>8s} {'fwd ms':>7s} {'bwd ms':>7s} {'opt ms':>7s} {'ceiling':>8s}"]
    for r in rows:
        split = " ".join(f"{r[k]:7.1f}" if k in r else f"{'-':>7s}" for k in ("forward_ms", "backward_ms", "optimizer_ms"))
        ceil = f"{r['flop_ceiling_vs_tiger']:7.2f}x" if "flop_ceiling_vs_tiger" in r else f"{'-':>8s}"
        lines.append(f"{r['variant']:20s} {r['round']:5d} {r['attn_impl']:9s} {r['device']:6s} {r['batch']:5d} "
                     f"{r['context_items']:4d} {r['ms_per_step']:8.1f} {r['items_per_s']:9.0f} {r['tokens_per_s']:9.0f} "
                     f"{r['items_per_s_vs_tiger']:8.2f}x {split} {ceil}")
    if any("flop_ceiling_vs_tiger" in r for r in rows):
        lines.append("(ceiling: what PinGER's mask allows over the TIGER layout by FLOPs at this context and width, "
                     "flop_ceiling(); share_of_ceiling and share_of_possible_gain in the JSON)")
    if any(r.get("attention") == BOUND for r in rows):
        lines.append(f"({NO_ATTENTION}: a bound, not a model -- attention returns V; its 'vs tiger' is the most any "
                     "attention kernel could give that variant here, its ceiling TIGER's FLOPs over none)")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="The training step of genrec's layouts at equal context, side by side.")
    ap.add_argument("workdir")
    ap.add_argument("--preset", default="cpu-small")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--variants", default="pinger,tiger",
                    help=f"comma-separated variants; a name ending in {NO_ATTENTION} is that variant's attention-free "
                         "bound (no_attention)")
    ap.add_argument("--rounds", type=int, default=1, help="run the variant list this many times, in turn")
    ap.add_argument("--synthetic", default="", metavar="BxN",
                    help="B random full-length histories of N catalogue items per step instead of the data's")
    ap.add_argument("--compile-mode", default="", help="torch.compile mode with train.compile=true "
                    "(e.g. reduce-overhead: CUDA graphs); default: torch's default")
    ap.add_argument("--profile", type=int, default=0, help="then profile N more steps of each variant (top ops)")
    ap.add_argument("--trace", default="", metavar="PREFIX",
                    help="then trace one more step of each variant (with Python stacks) to PREFIX.VARIANT.json")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. train.compile=true model.d_model=768")
    return ap


def parse_synthetic(text: str) -> tuple[int, int] | None:
    """``BxN`` -> (B, N); '' -> None."""
    if not text:
        return None
    try:
        b, n = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"bench train: --synthetic expects BxN (e.g. 8x1024), got {text!r}") from None
    if b < 1 or n < 1:
        raise SystemExit(f"bench train: --synthetic needs B, N >= 1, got {text!r}")
    return b, n


def run(a: argparse.Namespace, context: Callable[[str], tuple[str, ContextManager[Any]]] | None = None) -> list[dict]:
    """Parsed arguments -> the rows, printed as a table and written to $OUT/bench_train.json when OUT is set."""
    rows = run_variants(a.workdir, a.preset, a.variants.split(","), a.steps, a.warmup, a.overrides, rounds=a.rounds,
                        synthetic=parse_synthetic(a.synthetic), compile_mode=a.compile_mode, profile=a.profile,
                        trace=a.trace, context=context)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_train.json"), "w") as f:
            json.dump(rows, f, indent=2)
    print(table(rows))
    return rows


def main(argv: list[str] | None = None) -> int:
    run(parser().parse_intermixed_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
