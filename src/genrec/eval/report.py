"""Evaluation reports: JSON (the measured numbers), a Markdown table, and PNG plots drawn from the JSON.

The plots follow the figures the papers argue with: recall vs beam width, recall and distinct
first-level codes vs the diversity penalty λ (PinGER's diversity study), recall vs context length,
and recall vs serving history tokens for the PinGER layout against the TIGER layout (PinGER's
token-efficiency figure: one token per history item instead of L). Non-standard: every figure
is a pure function of report dicts (``figure_*``), so a test can read the plotted line data back
from the matplotlib figure and compare it with the JSON; nothing is re-measured here.

CLI (besides ``genrec eval``, which writes these files)::

    python -m genrec.eval.report render  REPORT.json            # redo .md + PNGs from the JSON
    python -m genrec.eval.report tokens  A.json B.json -o out.png  # token efficiency across runs
    python -m genrec.eval.report context LADDER.json ... -o out.png # recall, memory vs the context trained at
"""

from __future__ import annotations

import argparse
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from genrec.errors import DataError  # noqa: E402
from genrec.workdir import atomic_write_bytes, atomic_write_json, read_json  # noqa: E402

PATH_NAMES = {"sid": "SID beams (constrained)", "ann": "ANN (exact dense)", "l0l1": "L0+L1 (union, ranked)",
              "popularity": "Popularity"}


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}"
    return str(v)


def _fusion_line(f: dict[str, Any] | None) -> str:
    if not f:
        return ""
    src = "chosen on validation by `genrec fusion tune`" if f.get("stored") else "defaults"
    t, h = f.get("transition_weight") or 0.0, f.get("history_weight") or 0.0
    return (f" L1 score = {f['action_weight']:g} · utility + {f['retrieval_weight']:g} · dense logit + "
            f"{f['sid_weight']:g} · log P(SID)" + (f" + {t:g} · log P(item | last item)" if t > 0 else "")
            + (f" {'+' if h > 0 else '−'} {abs(h):g} · [item in the history]" if h != 0 else "") + f" ({src}).")


def markdown(report: dict[str, Any]) -> str:
    """The human-readable table of one report."""
    p = report.get("protocol", {})
    ks = p.get("ks", [5, 10, 20])
    cols = [f"Recall@{k}" for k in ks] + [f"NDCG@{k}" for k in ks] + [f"MRR@{max(ks)}"]
    keys = [f"recall@{k}" for k in ks] + [f"ndcg@{k}" for k in ks] + ["mrr"]
    split = report.get("split", "?")
    lines = [f"# genrec eval — {split} split, step {report.get('step')}", ""]
    if report.get("test_split"):
        lines += ["**Test split** (touched once; model choice happened on valid). "
                  f"Earlier test reports in this run dir: {len(report.get('previous_test_reports', []))}.", ""]
    lines += [f"Variant `{report.get('variant')}` (layout `{report.get('layout')}`), {p.get('cases')} cases, "
              f"{p.get('catalogue_items')} items, split `{p.get('split_kind')}`, full catalogue, history items "
              f"{'excluded' if p.get('history_excluded') else 'NOT excluded'}; beam {p.get('beam_width')}, "
              f"λ = {p.get('diversity_lambda')}, over-retrieval r = {p.get('overretrieve')}."
              + _fusion_line(p.get("l1_fusion")), "",
              "| Path | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for name, m in report.get("paths", {}).items():
        lines.append(f"| {PATH_NAMES.get(name, name)} | " + " | ".join(_fmt(m.get(k)) for k in keys) + " |")
    if report.get("model_selection"):
        lines += ["", f"Checkpoint: {report['model_selection']}."]
    for note in report.get("notes") or []:
        lines += ["", f"**Note:** {note}."]
    r = report.get("ranking")
    if r:
        aucs = r.get("auc", {})
        hk = next((k for k in r if k.startswith("hit@") and not k.endswith("_chance")), "hit@3")
        neg = r.get("n_sampled_negatives")
        size = (r.get("slate_size") or {}).get("mean")
        lines += ["", f"Ranking on {r.get('n_slates')} held-out feedview slates ({r.get('n_items')} logged items"
                  + (f", {neg} sampled impression-only negatives" if neg else "")
                  + (f"; {size:.1f} candidates a slate" if isinstance(size, float) and not math.isnan(size) else "")
                  + "). AUC over the logged items; Hit ranks each whole slate by the utility"
                  + (f" {r['utility']}" if r.get("utility") else "") + ":", "",
                  "| scorer | " + " | ".join([f"AUC {a}" for a in aucs] + [hk.capitalize(),
                                                                         f"{hk.capitalize()} by chance"])
                  + " |", "|---|" + "---|" * (len(aucs) + 2),
                  "| the action heads | " + " | ".join([_fmt(v) for v in aucs.values()]
                                                      + [_fmt(r.get(hk)), _fmt(r.get(f"{hk}_chance"))]) + " |"]
        prior = r.get("prior")
        if prior:
            lines.append("| counts: the user's and the item's action shares | "
                         + " | ".join([_fmt(prior["auc"].get(a)) for a in aucs] + [_fmt(prior.get(hk)), ""]) + " |")
    d = report.get("sid_diagnostics") or {}
    if d:
        lines += ["", "SID diagnostics:", ""] + [f"- {k}: {_fmt(v)}" for k, v in d.items()]
    for name, rows in (report.get("sweeps") or {}).items():
        if not rows:
            continue
        first = {"lambda": "lambda", "beam": "beam_width", "context": "context_len"}.get(name)
        hdr = [first] * (first in rows[0]) + [h for h in rows[0] if h != first]  # the swept variable first
        lines += ["", f"Sweep over {name}:", "", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        lines += ["| " + " | ".join(_fmt(row.get(h)) for h in hdr) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- figures
def _sweep(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    rows = (report.get("sweeps") or {}).get(name) or []
    if not rows:
        raise DataError(f"report has no '{name}' sweep", field=f"sweeps.{name}")
    return rows


def figure_beam(report: dict[str, Any], metric: str = "recall@10") -> Figure:
    """SID-path recall vs beam width."""
    rows = sorted(_sweep(report, "beam"), key=lambda r: r["beam_width"])
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["beam_width"] for r in rows], [r[metric] for r in rows], marker="o", label=f"SID {metric}")
    ax.set_xlabel("beam width W")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs beam width (λ = {rows[0].get('lambda')})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def figure_lambda(report: dict[str, Any], metric: str = "recall@10") -> Figure:
    """SID-path recall (left axis) and distinct first-level codes among beams (right axis) vs λ."""
    rows = sorted(_sweep(report, "lambda"), key=lambda r: r["lambda"])
    fig, ax = plt.subplots(figsize=(5, 3.5))
    xs = [r["lambda"] for r in rows]
    ax.plot(xs, [r[metric] for r in rows], marker="o", color="tab:blue", label=metric)
    ax.set_xlabel("diversity penalty λ")
    ax.set_ylabel(metric, color="tab:blue")
    if all("distinct_first_codes" in r for r in rows):  # full-code beams (the other SID modes record no beams)
        ax2 = ax.twinx()
        ax2.plot(xs, [r["distinct_first_codes"] for r in rows], marker="s", color="tab:orange",
                 label="distinct first-level codes")
        ax2.set_ylabel("distinct first-level codes / user", color="tab:orange")
    ax.set_title(f"diversity vs recall (beam {rows[0].get('beam_width')})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def figure_context(report: dict[str, Any], metric: str = "recall@10") -> Figure:
    """Recall of each path vs context length (history items fed to the model)."""
    rows = sorted(_sweep(report, "context"), key=lambda r: r["context_len"])
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for p in ("sid", "ann"):
        key = f"{p}/{metric}"
        if key in rows[0]:
            ax.plot([r["context_len"] for r in rows], [r[key] for r in rows], marker="o", label=PATH_NAMES[p])
    ax.set_xlabel("context length (history items)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs context length")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def token_points(report: dict[str, Any], metric: str = "recall@10") -> tuple[list[float], list[float]]:
    """(serving history tokens, SID recall) points of one run: its context sweep, else its one setting."""
    rows = (report.get("sweeps") or {}).get("context") or []
    if rows and f"sid/{metric}" in rows[0]:
        rows = sorted(rows, key=lambda r: r["history_tokens"])
        return [float(r["history_tokens"]) for r in rows], [float(r[f"sid/{metric}"]) for r in rows]
    tpi = (report.get("sid_diagnostics") or {}).get("history_tokens_per_item", 1)
    sid = (report.get("paths") or {}).get("sid")
    if sid is None:
        raise DataError("report has no SID path", field="paths.sid")
    return [float(report["protocol"]["context_len"] * tpi)], [float(sid[metric])]


def figure_tokens(reports: Sequence[dict[str, Any]], metric: str = "recall@10",
                  labels: Sequence[str] | None = None) -> Figure:
    """PinGER's token-efficiency figure: SID recall vs serving history tokens, one line per run."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, rep in enumerate(reports):
        xs, ys = token_points(rep, metric)
        lab = labels[i] if labels else f"{rep.get('variant') or rep.get('layout')} ({rep.get('layout')})"
        ax.plot(xs, ys, marker="o", label=lab)
    ax.set_xscale("log")
    ax.set_xlabel("serving history tokens (items × tokens per item)")
    ax.set_ylabel(f"SID {metric}")
    ax.set_title("recall vs serving history tokens")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def trained_context_points(ladders: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per scored rung of ``benchmarks/quality_ladder.py`` outputs (``ladder.json``) that trained at its
    own context: layout (the rung's ``variant=``), context (``data.context_len=``), validation Recall@10 per path,
    peak device MiB and items/s of its training. Rungs without both overrides, a score and a training row are
    left out (a rung that failed)."""
    pts: list[dict[str, Any]] = []
    for lad in ladders:
        rows = {r["rung"]: r for r in lad.get("rows", [])}
        train = {t["rung"]: t for t in lad.get("train", [])}
        for rung in (lad.get("ladder") or {}).get("rungs", []):
            ov = dict(o.split("=", 1) for o in rung.get("overrides", []) if "=" in o)
            name = rung["name"]
            if "variant" not in ov or "data.context_len" not in ov or name not in rows or name not in train:
                continue
            r = rows[name]
            pts.append({"rung": name, "layout": ov["variant"], "context": int(ov["data.context_len"]),
                        "peak_mib": float(train[name]["peak_mem_mib"]), "items_per_s": float(train[name]["items_per_s"]),
                        **{p: float(r[f"valid/{p}/recall@10"]) for p in ("sid", "ann") if f"valid/{p}/recall@10" in r}})
    if not pts:
        raise DataError("no rung trained at its own context (variant= and data.context_len= overrides, scored)")
    return sorted(pts, key=lambda q: (q["layout"], q["context"]))


def figure_trained_context(points: Sequence[dict[str, Any]]) -> Figure:
    """Training at each context, per layout: validation Recall@10 (SID solid, ANN dashed) and peak device memory
    against the history items trained on (issue 40's context table, drawn)."""
    fig, (ax, am) = plt.subplots(1, 2, figsize=(9, 3.6))
    for i, lay in enumerate(sorted({q["layout"] for q in points})):
        qs = [q for q in points if q["layout"] == lay]
        xs = [q["context"] for q in qs]
        for p, style in (("sid", "-"), ("ann", "--")):
            if all(p in q for q in qs):
                ax.plot(xs, [q[p] for q in qs], style, color=f"C{i}", marker="o", label=f"{lay} {p.upper()}")
        am.plot(xs, [q["peak_mib"] / 1024 for q in qs], color=f"C{i}", marker="o", label=lay)
    for a, y in ((ax, "validation Recall@10"), (am, "peak device memory (GiB)")):
        a.set_xscale("log")
        a.set_xlabel("history items trained on")
        a.set_ylabel(y)
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    return fig


def figures(report: dict[str, Any]) -> dict[str, Figure]:
    """Every figure this report has data for."""
    out: dict[str, Figure] = {}
    sweeps = report.get("sweeps") or {}
    if sweeps.get("beam"):
        out["beam"] = figure_beam(report)
    if sweeps.get("lambda"):
        out["lambda"] = figure_lambda(report)
    if sweeps.get("context"):
        out["context"] = figure_context(report)
        if "sid/recall@10" in sweeps["context"][0]:
            out["tokens"] = figure_tokens([report])
    return out


def save_figure(fig: Figure, path: str | Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def write_report(report: dict[str, Any], folder: str | Path, stem: str) -> dict[str, Path]:
    """``folder/stem.json`` + ``stem.md`` + ``stem-<plot>.png`` for each plot the data allows."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = {"json": folder / f"{stem}.json", "md": folder / f"{stem}.md"}
    atomic_write_json(files["json"], report)
    atomic_write_bytes(files["md"], markdown(report).encode())
    for name, fig in figures(report).items():
        files[name] = save_figure(fig, folder / f"{stem}-{name}.png")
    return files


def render(json_path: str | Path) -> dict[str, Path]:
    """Regenerate the Markdown and PNGs of a report from its JSON (nothing re-measured)."""
    p = Path(json_path)
    try:
        report = read_json(p)
    except json.JSONDecodeError as e:
        raise DataError(f"not valid JSON: {e.msg}", path=p, line=e.lineno) from None
    return write_report(report, p.parent, p.stem)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m genrec.eval.report")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="redo .md and PNGs from a report JSON")
    r.add_argument("report")
    t = sub.add_parser("tokens", help="recall vs serving history tokens across runs (PinGER vs TIGER)")
    t.add_argument("reports", nargs="+")
    t.add_argument("-o", "--out", required=True)
    c = sub.add_parser("context", help="recall and memory vs the context trained at (quality_ladder.py outputs)")
    c.add_argument("ladders", nargs="+")
    c.add_argument("-o", "--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "render":
        for k, v in render(a.report).items():
            print(f"{k}: {v}")
    elif a.cmd == "context":
        print(save_figure(figure_trained_context(trained_context_points([read_json(p) for p in a.ladders])), a.out))
    else:
        reps = [read_json(p) for p in a.reports]
        print(save_figure(figure_tokens(reps), a.out))


if __name__ == "__main__":
    main()
