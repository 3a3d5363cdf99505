"""The quality ladder: the plain SASRec recipe up to genrec's joint model, one change per rung, same run.

    python benchmarks/quality_ladder.py WORKDIR --ladder configs/ladder-beauty.json \
        [--p5 DATA_DIR --yardstick ../shared/yardstick/sasrec.py] [--parallel 16] [--threads 1]

WORKDIR holds prepared tables, features and SIDs. Every rung of the ladder file trains in its own run
directory ``WORKDIR-ladder/<name>`` (tables/features/sid linked), all at once on the one device, with
the ladder's common overrides, periodic validation and the trainer's BEST checkpoint (chosen on
validation). With ``--p5`` the independent plain SASRec (``../shared/yardstick/sasrec.py``) trains
beside them on the same data, in the same call. Then every rung's BEST checkpoint is scored on all
validation users and all test users (full catalogue, history items not excluded): Recall/NDCG@10 of
its ANN path and, when it has SID heads, its SID path (beam ``--sid-beam``), with a paired bootstrap
interval against the rung it names as ``against`` (default: its ``base``, else the rung before), same
users, same path. A rung's ``base`` names an earlier rung whose overrides it extends by its own.

A rung's ``sid_from`` names another run directory whose SIDs it trains on (``{workdir}``: WORKDIR). A rung's
``"sid_from_rung": "<earlier rung>"`` trains on SIDs quantised from that rung's trained model's item vectors
(``genrec sid build --source model``): it starts only once the named rung has finished training (the others
keep training meanwhile; it is skipped if that rung failed), then builds them into ``WORKDIR-ladder/<name>-sid``
(tables and features linked from WORKDIR; ``"sid_args": [...]`` go to that ``sid build``, e.g.
``["--codebook-size", "64"]``), links that ``sid`` into its run directory and trains. Scoring is the same.

With ``--l0l1`` a rung with ranking heads and a dense stage also gets its L0 -> L1 path: the fusion weights
chosen on ``--fusion-users`` validation users (``genrec fusion tune``, stored with the checkpoint), then the
served funnel (SID stage as served at beam ``--sid-beam``, ANN, L1 ranking) scored like the other paths.

A ladder's top-level ``"sids": {"<name>": [<sid build args>]}`` declares SID variants of WORKDIR's tables and
features: each is built once (``genrec sid build WORKDIR-sid-<name> ARGS``, skipped when it exists) before any rung
trains, for rungs to name as ``"sid_from": "{workdir}-sid-<name>"``.

Prints Markdown tables; everything to ``$OUT/ladder.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _link_parts(base: Path, d: Path, sid_from: str | None = None,
                parts: tuple[str, ...] = ("tables", "features", "sid")) -> None:
    """Link WORKDIR's tables/features/sid into a rung's run directory (``sid_from``: another run
    directory's SIDs, e.g. the same tables quantised from another ``--source``)."""
    d.mkdir(parents=True, exist_ok=True)
    for part in parts:
        src = Path(sid_from) if part == "sid" and sid_from else base
        if (src / part).exists() and not (d / part).exists():
            (d / part).symlink_to((src / part).resolve())


def resolve(ladder: dict[str, Any]) -> None:
    """A rung's ``base`` names an earlier rung whose overrides come first (one change per rung); its
    ``sid_from_rung`` must name an earlier rung too."""
    by = {}
    for r in ladder["rungs"]:
        base = r.get("base")
        if base is not None and base not in by:
            raise SystemExit(f"rung {r['name']!r}: base {base!r} is not an earlier rung")
        dep = r.get("sid_from_rung")
        if dep is not None and dep not in by:
            raise SystemExit(f"rung {r['name']!r}: sid_from_rung {dep!r} is not an earlier rung")
        if dep is not None and r.get("sid_from"):
            raise SystemExit(f"rung {r['name']!r}: give sid_from or sid_from_rung, not both")
        r["overrides"] = [*(by[base]["overrides"] if base else []), *r.get("overrides", [])]
        by[r["name"]] = r


def sid_variants(base: Path, ladder: dict[str, Any]) -> list[list[str]]:
    """The ``genrec sid build`` commands for the ladder's ``sids`` not built yet, their folders
    (``WORKDIR-sid-<name>``, WORKDIR's tables and features linked) made; run them in order."""
    cmds = []
    for name, args in ladder.get("sids", {}).items():
        d = Path(f"{str(base).rstrip('/')}-sid-{name}")
        if (d / "sid" / "CURRENT").exists():
            continue
        _link_parts(base, d, parts=("tables", "features"))
        cmds.append([sys.executable, "-m", "genrec.cli", "sid", "build", str(d), *map(str, args)])
    return cmds


def readiness(rung: dict[str, Any], waiting: set[str], running: set[str], failed: set[str], root: Path) -> str:
    """Whether ``rung`` may start now: "go", "wait" (its ``sid_from_rung`` or ``after`` -- a rung whose checkpoint it
    starts from -- is still to train or training) or "skip" (that rung failed, or was not trained in this call and
    has no checkpoints under ``root``)."""
    dep = rung.get("sid_from_rung") or rung.get("after")
    if dep is None:
        return "go"
    if dep in waiting or dep in running:
        return "wait"
    if dep in failed or not (root / dep / "checkpoints").is_dir():
        return "skip"
    return "go"


def model_sid_command(base: Path, root: Path, rung: dict[str, Any]) -> list[str]:
    """For a rung with ``sid_from_rung``: link ``root/<name>-sid`` (WORKDIR's tables and features) and the rung's
    ``sid`` to its ``sid`` folder; return the ``genrec sid build --source model`` command that fills it."""
    d, sdir = root / rung["name"], root / f"{rung['name']}-sid"
    _link_parts(base, sdir, parts=("tables", "features"))
    (sdir / "sid").mkdir(exist_ok=True)
    d.mkdir(parents=True, exist_ok=True)
    if (d / "sid").is_symlink() or (d / "sid").exists():
        if not (d / "sid").is_symlink():
            raise SystemExit(f"{d / 'sid'}: a folder, not a link; move it away to train rung {rung['name']!r}")
        (d / "sid").unlink()
    (d / "sid").symlink_to((sdir / "sid").resolve())
    return [sys.executable, "-m", "genrec.cli", "sid", "build", str(sdir), "--source", "model", "--from-run",
            str(root / rung["sid_from_rung"]), *map(str, rung.get("sid_args", []))]


def train_all(base: Path, root: Path, ladder: dict[str, Any], a: argparse.Namespace) -> dict[str, float]:
    """Train every rung (``--parallel`` at a time) and the yardstick; returns seconds per rung."""
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    todo = [r for r in ladder["rungs"] if not (a.only and r["name"] not in a.only)]
    procs: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    took: dict[str, float] = {}
    yard = None
    if a.p5:
        out = root / "yardstick.jsonl"
        out.unlink(missing_ok=True)
        yard = subprocess.Popen([sys.executable, __file__, "--yardstick-child", a.yardstick, str(root / YARD_RANKS),
                                 a.p5, "--loss", "ce", "--out", str(out)], stdout=open(root / "yardstick.log", "wb"),
                                stderr=subprocess.STDOUT, env=dict(env, YARDSTICK_SEED=str(a.yardstick_seed)))
    failed: set[str] = set()
    while todo or procs:
        i = 0
        while i < len(todo) and len(procs) < a.parallel:
            state = readiness(todo[i], {r["name"] for r in todo}, set(procs), failed, root)
            if state == "wait":  # its sid_from_rung is still training: start the ones after it
                i += 1
                continue
            r = todo.pop(i)
            if state == "skip":
                dep = r.get("sid_from_rung") or r.get("after")
                print(f"{r['name']}: skipped (rung {dep!r} it needs has no trained model)", flush=True)
                failed.add(r["name"])
                continue
            d = root / r["name"]
            sid_from = r.get("sid_from")
            sid_cmd = model_sid_command(base, root, r) if r.get("sid_from_rung") else None
            _link_parts(base, d, sid_from.format(workdir=str(base).rstrip("/")) if sid_from else None)
            cmd = [sys.executable, "-m", "genrec.cli", "train", str(d), "--preset", ladder.get("preset", "gpu-base"),
                   "--no-resume", *ladder.get("common", []), *a.set, *r["overrides"]]
            first = shlex.join(sid_cmd[2:]) + "\n" if sid_cmd else ""
            (d / "command.txt").write_text(first + " ".join(cmd[2:]) + "\n")
            if sid_cmd:  # the SIDs from the named rung's model, then the training: one process, the loop goes on
                cmd = ["bash", "-c", f"{shlex.join(sid_cmd)} && exec {shlex.join(cmd)}"]
            procs[r["name"]] = (subprocess.Popen(cmd, stdout=open(d / "train.log", "wb"), stderr=subprocess.STDOUT,
                                                 env=env), time.perf_counter())
        time.sleep(2)
        for name, (p, t0) in list(procs.items()):
            if p.poll() is not None:
                took[name] = time.perf_counter() - t0
                status = "ok" if p.returncode == 0 else f"FAILED rc {p.returncode}"
                print(f"trained {name}: {status} in {took[name]:.0f}s", flush=True)
                if p.returncode != 0:
                    failed.add(name)
                    print((root / name / "train.log").read_text()[-3000:], flush=True)
                del procs[name]
    if yard is not None:
        yard.wait()
        print(f"yardstick: rc {yard.returncode}", flush=True)
    return took


def score(root: Path, ladder: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from genrec.eval.evaluate import EvalConfig, l0l1_pass, load_eval_data
    from genrec.eval.fusion_tune import tune_fusion
    from genrec.eval.metrics import topk_metrics
    from genrec.eval.retrieval import evaluate_retrieval
    from genrec.eval.significance import paired_ratio, paired_topk
    from genrec.infer.cases import SourceIds
    from genrec.infer.load import trained_temperature
    from genrec.infer.recommender import Recommender

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ks = (5, 10, 20)
    ranks: dict[str, dict[str, dict[str, np.ndarray]]] = {}  # rung -> split -> path -> per-user rank
    rows: list[dict[str, Any]] = []
    cases: dict[str, np.ndarray] = {}
    plain = yardstick_ranks(root)
    for r in ladder["rungs"]:
        d = root / r["name"]
        if not (d / "checkpoints").exists():
            print(f"{r['name']}: no checkpoints, skipped", flush=True)
            continue
        try:
            rec = Recommender.from_checkpoint(d, None, device=dev)
        except Exception as e:  # a rung that failed to train: say so, score the others
            print(f"{r['name']}: not scored ({e})", flush=True)
            continue
        row: dict[str, Any] = {"rung": r["name"], "change": r.get("change", ""), "step": rec.step}
        ranks[r["name"]] = {}
        funnel = a.l0l1 and rec.model.action_head is not None and rec.ann is not None
        util = {act: 1.0 for act in rec.actions}  # the leave-one-out target: the next interaction of any kind
        if funnel:  # L1's fusion weights chosen on validation users, stored with the checkpoint
            fz = tune_fusion(d, rec=rec, max_users=a.fusion_users, beam_width=a.sid_beam, utility=util)
            row["fusion"] = {**fz["chosen"], "sid_mode": fz["chosen_on"]["sid_mode"], "cases": fz["chosen_on"]["cases"]}
        for split in ("valid", "test"):
            data = load_eval_data(rec, d, EvalConfig(split=split, max_users=0))
            es = data.es
            tgt = np.asarray(es.target_rows)
            if split in cases and not np.array_equal(cases[split], tgt):
                raise SystemExit(f"{d}: its {split} cases differ from the other rungs' (other tables?)")
            cases[split] = tgt
            ro: dict[str, np.ndarray] = {}
            with torch.no_grad():
                evaluate_retrieval(rec.catalog_model, es, paths=("ann", "sid", "sid-dense"), beam_width=a.sid_beam,
                                   ks=ks, context_len=rec.context_len, trie=rec.trie, leaf_rows=rec.leaf_rows,
                                   batch_size=256, ranks_out=ro, dense_temperature=trained_temperature(rec.run_config))
            if funnel:
                with torch.no_grad():
                    l0l1_pass(rec, es, ks=ks, beam_width=a.sid_beam, diversity_lambda=0.0, overretrieve=3,
                              utility=util, batch_size=256, ranks_out=ro, transitions=data.transitions)
            ranks[r["name"]][split] = ro
            for path, rk in ro.items():
                for m, v in topk_metrics(rk, ks).items():
                    row[f"{split}/{path}/{m}"] = v
            if plain is not None:  # each path / the plain SASRec of this call, paired over the same users
                src = SourceIds.of(d)
                back = {i: o for o, i in src.users.items()} if src is not None else {}
                keys = [str(back.get(int(ex.user_id), ex.user_id)) for ex in es.examples]
                missing = [k for k in keys if k not in plain[split]]
                if missing:
                    raise SystemExit(f"{d}: {len(missing)} {split} users not in the plain SASRec's data, e.g. {missing[:3]}")
                against = [("vs_plain", split)] + ([("vs_plain_excl", "test_excl")] if split == "test" and
                                                    "test_excl" in plain else [])
                for name, ys in against:
                    yr = np.array([plain[ys][k] for k in keys])
                    for path, rk in ro.items():
                        for metric in ("recall@10", "ndcg@10"):
                            q = paired_ratio(rk, yr, metric, n_boot=a.n_boot)
                            row[f"{split}/{path}/{metric}/{name}"] = [q.observed, q.low, q.high]
        rows.append(row)
        print(f"scored {r['name']}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items()
                                                  if k.endswith(("recall@10", "ndcg@10"))), flush=True)
        del rec
    # paired intervals against the named (or previous) rung, same split and path
    names = [r["rung"] for r in rows]
    against = {r["name"]: r.get("against", r.get("base")) for r in ladder["rungs"]}
    for i, row in enumerate(rows):
        ref = against.get(row["rung"]) or (names[i - 1] if i else None)
        if ref is None or ref not in ranks:
            continue
        row["against"] = ref
        for split in ("valid", "test"):
            for path in ranks[row["rung"]][split]:
                if path not in ranks[ref][split]:
                    continue
                for metric in ("recall@10", "ndcg@10"):
                    d = paired_topk({"a": ranks[row["rung"]][split][path], "b": ranks[ref][split][path]}, metric,
                                    n_boot=a.n_boot)[("a", "b")]
                    row[f"{split}/{path}/{metric}/diff"] = [d.observed, d.low, d.high]
    return {"rows": rows, "cases": {s: len(c) for s, c in cases.items()}}


YARD_RANKS = "yardstick-ranks.npz"


def yardstick_child(script: str, ranks_file: str, args: list[str]) -> None:
    """Run the plain SASRec script as it is (its ``main``, its arguments), recording the 0-based rank of every
    target its final evaluations count, so genrec's paths can be paired with it user by user: its module-level
    ``metrics`` is wrapped (the rank computed as it computes it, then its own function called), not replaced.
    ``YARDSTICK_SEED`` (``--yardstick-seed``) shifts the seeds the script fixes, to measure its seed-to-seed spread.
    Its last three evaluations are the chosen checkpoint's validation, test and test-without-history, one row per
    line of ``sequential_data.txt``, in order; written as users (the line's first field), valid, test and
    test_excl (its ranks with the history's items left out, the figure a repeat-demoting L1 is to be read against)."""
    if shift := int(os.environ.get("YARDSTICK_SEED", "0")):  # its fixed seeds, shifted (this process only)
        import torch

        torch_seed, np_seed = torch.manual_seed, np.random.seed
        torch.manual_seed = lambda s: torch_seed(s + shift)  # type: ignore[assignment]
        np.random.seed = lambda s=None: np_seed(None if s is None else s + shift)  # type: ignore[assignment]
    spec = importlib.util.spec_from_file_location("yardstick_sasrec", script)
    assert spec is not None and spec.loader is not None, script
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seen: list[np.ndarray] = []
    inner = mod.metrics

    def metrics(scores: Any, target: Any, *rest: Any, **kw: Any) -> Any:
        seen.append((scores > scores.gather(1, target[:, None])).sum(1).cpu().numpy())
        return inner(scores, target, *rest, **kw)

    mod.metrics = metrics
    sys.argv = [script, *args]
    mod.main()
    with open(Path(args[0]) / "sequential_data.txt") as f:
        users = np.array([ln.split()[0] for ln in f if ln.strip()])
    n, ranks = len(users), np.concatenate(seen)
    valid, test, test_excl = ranks[-3 * n:-2 * n], ranks[-2 * n:-n], ranks[-n:]
    res = json.loads(Path(args[args.index("--out") + 1]).read_text().splitlines()[-1]) if "--out" in args else None
    if res is not None:  # the recorded ranks give back the script's own figures, or the pairing would be wrong
        for split, r in (("valid", valid), ("test", test), ("test_excl_history", test_excl)):
            if abs(float((r < 10).mean()) - res[split]["R@10"]) > 1e-6:
                raise SystemExit(f"yardstick ranks: {split} R@10 {(r < 10).mean():.6f} != its {res[split]['R@10']}")
    np.savez(ranks_file, users=users, valid=valid, test=test, test_excl=test_excl)


def yardstick_ranks(root: Path) -> dict[str, dict[str, int]] | None:
    """{split: {P5 user id: 0-based rank}} of the plain SASRec of this call (and "test_excl": its test ranks with
    the history's items left out, where recorded), or None without one."""
    p = root / YARD_RANKS
    if not p.exists():
        return None
    z = np.load(p)
    return {s: dict(zip(z["users"].tolist(), z[s].tolist())) for s in ("valid", "test", "test_excl") if s in z}


def yardstick_result(root: Path) -> dict[str, Any] | None:
    p = root / "yardstick.jsonl"
    if not p.exists():
        return None
    lines = [ln for ln in p.read_text().splitlines() if ln.strip()]
    return json.loads(lines[-1]) if lines else None


def train_summary(root: Path, ladder: dict[str, Any], took: dict[str, float]) -> list[dict[str, Any]]:
    """Per rung, from its train_log.jsonl: the last step, the median items/s over the log windows after the
    first (which holds start-up and compiles), the peak device memory (CUDA runs) and the training seconds."""
    out = []
    for r in ladder["rungs"]:
        p = root / r["name"] / "train_log.jsonl"
        rows = [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.exists() else []
        if not rows:
            continue
        rates = [x["items_per_s"] for x in rows[1:] or rows if "items_per_s" in x]
        peaks = [x["peak_mem_mib"] for x in rows if "peak_mem_mib" in x]
        out.append({"rung": r["name"], "steps": rows[-1].get("step"), "items_per_s": float(np.median(rates)) if rates
                    else None, "peak_mem_mib": max(peaks) if peaks else None, "seconds": took.get(r["name"])})
    return out


def train_table(rows: list[dict[str, Any]]) -> str:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    out = ["| rung | steps | items/s (median) | peak device MiB | training s |", "|---|---|---|---|---|"]
    out += [f"| {x['rung']} | {x['steps']} | {f(x['items_per_s'], ',.0f')} | {f(x['peak_mem_mib'], ',.0f')} | "
            f"{f(x['seconds'], '.0f')} |" for x in rows]
    return "\n".join(out)


def table(res: dict[str, Any], yard: dict[str, Any] | None) -> str:
    out = []
    if yard:
        out.append(f"plain SASRec (yardstick, same call, {yard.get('seconds', 0):.0f} s): valid R@10 "
                   f"{yard['valid']['R@10']:.4f} N@10 {yard['valid']['N@10']:.4f}; test R@10 {yard['test']['R@10']:.4f} "
                   f"N@10 {yard['test']['N@10']:.4f}\n")
    out.append("| rung | change | path | valid R@10 | valid N@10 | test R@10 | test N@10 | test R@10 ÷ plain (paired: R@10 / N@10 "
               "[95%]) | "
               "Δ test R@10 vs rung before [95%] | Δ test N@10 [95%] |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for row in res["rows"]:
        for path in ("ann", "sid", "sid-dense", "l0l1"):
            if f"test/{path}/recall@10" not in row:
                continue
            ratio = f"{row[f'test/{path}/recall@10'] / yard['test']['R@10']:.3f}" if yard else "-"
            if f"test/{path}/recall@10/vs_plain" in row:  # paired over the same users: R@10 and N@10, [95%]
                ratio = " / ".join(f"{q[0]:.3f} [{q[1]:.3f}, {q[2]:.3f}]" for q in
                                   (row[f"test/{path}/{m}/vs_plain"] for m in ("recall@10", "ndcg@10")))

            def diff(metric: str) -> str:
                d = row.get(f"test/{path}/{metric}/diff")
                if not d:
                    return "-"
                mark = " **decided**" if d[1] > 0 or d[2] < 0 else ""
                return f"{d[0]:+.4f} [{d[1]:+.4f}, {d[2]:+.4f}]{mark}"

            out.append(f"| {row['rung']} | {row['change']} | {path} | {row[f'valid/{path}/recall@10']:.4f} | "
                       f"{row[f'valid/{path}/ndcg@10']:.4f} | {row[f'test/{path}/recall@10']:.4f} | "
                       f"{row[f'test/{path}/ndcg@10']:.4f} | {ratio} | {diff('recall@10')} | {diff('ndcg@10')} |")
    return "\n".join(out)


def main() -> None:
    if sys.argv[1:2] == ["--yardstick-child"]:  # SCRIPT RANKS_FILE P5 ARGS...: the plain SASRec, ranks recorded
        yardstick_child(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--ladder", type=Path, required=True)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per training process")
    ap.add_argument("--p5", help="P5-form data directory: also train the plain SASRec yardstick on it, same call")
    ap.add_argument("--yardstick", default=str(Path(__file__).resolve().parents[2] / "shared/yardstick/sasrec.py"))
    ap.add_argument("--yardstick-seed", type=int, default=0, help="shift the plain SASRec's fixed seeds by this")
    ap.add_argument("--sid-beam", type=int, default=100)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--only", nargs="*", default=[], help="train only these rungs (score all that have checkpoints)")
    ap.add_argument("--set", nargs="*", default=[], help="extra key=value overrides for every rung (e.g. a time cap)")
    ap.add_argument("--score-only", action="store_true")
    ap.add_argument("--l0l1", action="store_true", help="also score each rung's L0 -> L1 path (fusion tuned on valid)")
    ap.add_argument("--fusion-users", type=int, default=0,
                    help="validation users the L1 fusion is chosen on (0 = all, as `genrec fusion tune`)")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    a = ap.parse_args()
    ladder = json.loads(a.ladder.read_text())
    resolve(ladder)
    root = a.workdir.parent / f"{a.workdir.name}-ladder"
    root.mkdir(parents=True, exist_ok=True)
    for cmd in [] if a.score_only else sid_variants(a.workdir, ladder):
        print(f"building SIDs: {shlex.join(cmd[2:])}", flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    took = {} if a.score_only else train_all(a.workdir, root, ladder, a)
    res = score(root, ladder, a)
    res["train_seconds"] = took
    res["train"] = train_summary(root, ladder, took)
    yard = yardstick_result(root)
    res["yardstick"] = yard
    res["ladder"] = ladder
    print("\n" + table(res, yard) + "\n\n" + train_table(res["train"]), flush=True)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "ladder.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
