"""A readable table of recommendations (CLI ``genrec recommend`` and the quickstart)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table


def print_recommendations(recs: Any, *, who: str, step: int | None, console: Console | None = None,
                          label: Callable[[int], str] | None = None) -> None:
    """Print rank, item, title, source stage(s), SID, score and the top action probabilities. ``label``:
    how an item id is shown (e.g. the source file's id of remapped data); default the id itself."""
    con = console or Console()
    t = Table(title=f"genrec recommend - {who} ({recs.history_used} history items, step {step})")
    for col in ("#", "item", "title", "stage(s)", "SID", "score", "top actions"):
        t.add_column(col, overflow="fold")
    for i, r in enumerate(recs, 1):
        acts = ""
        if r.action_probs:
            top = sorted(r.action_probs.items(), key=lambda kv: -kv[1])[:3]
            acts = " ".join(f"{a}={p:.2f}" for a, p in top)
        t.add_row(str(i), label(r.item_id) if label else str(r.item_id), r.title or "", "+".join(r.sources),
                  "-".join(map(str, r.sid)) if r.sid else "", f"{r.score:.4f}", acts)
    con.print(t)
    if recs.dropped_items:
        con.print(f"[yellow]dropped {len(recs.dropped_items)} unknown history item(s): {recs.dropped_items[:10]}")
    if recs.history_truncated:
        con.print(f"kept the newest {recs.history_used} items (context); {recs.history_truncated} older ones dropped")
    con.print("timings (ms): " + ", ".join(f"{k}={v:.1f}" for k, v in recs.timings_ms.items()))
