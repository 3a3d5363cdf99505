"""Static look at the item-block kernels as compiled for the H200 (sm_90), on any machine, no GPU.

Usage:
    python benchmarks/inspect_item_block.py [--head-dims 64,128] [--dtype float32] [--config default] [--set KNOB=VALUE ...] [--out FILE.json]

Each of the three kernels the training step runs (forward; dq with the fused delta and SID dk/dv;
dense dk/dv) is compiled ahead of time by Triton for ``GPUTarget("cuda", 90, 32)`` with the
configuration ``ItemBlockConfig.tuned(D)`` (``--config default``: the one ``item_block_attention`` runs
when given none; ``--set`` changes knobs, e.g. ``--set dq_warps=4``),
specialised as the benchmark shape launches it (bf16, B 8 x 1,024 items x 5 tokens, contiguous
tensors: every pointer and every stride 16-aligned). It prints, per kernel: registers per thread,
the stack frame and the local-memory loads/stores in the SASS (register spills; those inside a
loop counted apart), shared memory, and the instruction counts that say which path the compiler
took -- HGMMA (Hopper warpgroup matmuls, and their full drains: one per HGMMA when ptxas has
serialized them) vs HMMA, LDGSTS/UTMALDG (asynchronous copies to shared memory) vs LDG (loads through
registers), MUFU (exp2 / log2 / reciprocal). The Gluon (Hopper) kernels that the configuration
switches on (``sm90_fwd``, ``sm90_dq``, ``sm90_dense_kv``; a Triton with Gluon needed) are compiled
the same way, with tensor descriptors as the launches build them, and listed after the three.

The local Triton may not be the GPU machine's (3.6 there): the figures guide which
configurations to time; only the timings on the GPU decide.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SHAPE = {"B": 8, "n_items": 1024, "T": 5}
OPS = ("HGMMA", "HMMA", "LDGSTS", "UTMALDG", "LDG", "LDS", "STS", "LDL", "STL", "MUFU", "FFMA", "BAR")
NOT_ALIGNED = {"H"}  # the head count (12 or 8); every other int argument is a multiple of 16 at this shape


def _signature(fn: Any, consts: dict[str, Any], elem: str = "bf16"
               ) -> tuple[dict[str, str], dict[tuple[int, ...], list[list[Any]]]]:
    sig: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        if name in ("qk_scale", "sm_scale"):
            sig[name] = "fp32"
        elif name in ("H", "S", "N_ITEMS") or not name[0].isupper():
            sig[name] = "i32"
        else:
            sig[name] = {"LSE": "*fp32", "DELTA": "*fp32", "LENGTHS": "*i32"}.get(name, f"*{elem}")
        if name not in NOT_ALIGNED:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def _sass_stats(cubin: bytes) -> dict[str, Any]:
    import triton

    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        usage = subprocess.run([str(bindir / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([str(bindir / "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)
    res = {k.lower(): int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage)}
    ops = collections.Counter(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", sass, flags=re.M))
    # warpgroup matmuls whose A operand comes from registers (HGMMA.* Rd, Ra, gdesc[...]) rather than shared memory
    reg_a = len(re.findall(r"\bHGMMA\.\S+\s+R\d+,\s*R\d+,", sass))
    # full waits for the warpgroup matmuls: a handful where the kernel drains on purpose; one after every
    # HGMMA when ptxas has serialized them (its C7514/C7515 notes: accumulator registers set or read
    # while products run)
    drains = len(re.findall(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0", sass))
    return {**res, **{op: ops.get(op, 0) for op in OPS}, "HGMMA_REG_A": reg_a, "LOCAL_IN_LOOPS": _local_in_loops(sass),
            "HGMMA_DRAINS": drains}


def _local_in_loops(sass: str) -> int:
    """Local-memory loads/stores (spill traffic) inside a loop of the SASS: between a backward
    branch's target label and the branch, for branches ahead of the last EXIT. A spill outside every loop costs a few cycles per program;
    one inside the main loop costs them per tile."""
    labels: dict[str, int] = {}
    insts: list[tuple[int, str]] = []
    label = None
    for line in sass.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line)
        if m:
            label = m.group(1)
            continue
        m = re.match(r"^\s+/\*([0-9a-f]+)\*/\s+(.*)$", line)
        if m:
            addr = int(m.group(1), 16)
            if label is not None:
                labels[label], label = addr, None
            insts.append((addr, m.group(2)))
    # ptxas places the slow paths of the barrier waits after the last EXIT; their jumps back into the
    # body are not loops
    end = max((addr for addr, text in insts if re.search(r"\bEXIT\b", text)), default=0)
    loops = [(labels[t], addr) for addr, text in insts for t in re.findall(r"BRA\s+`?\((\.L_x_\d+)\)", text)
             if t in labels and labels[t] <= addr < end]
    return sum(1 for addr, text in insts if re.search(r"\b(LDL|STL)\b", text) and any(a <= addr <= b for a, b in loops))


def kernels(D: int, cfg: Any, fp32: bool = False) -> list[tuple[str, Any, dict[str, Any], dict[str, int]]]:
    """(name, jit function, constexprs, launch options) of the three kernels, from the launches' own helpers."""
    from genrec.kernels import item_block as ib

    T, dtype = SHAPE["T"], {"IEEE": fp32, "UPCAST": False}  # fp32 inputs take exact (IEEE) products
    out = []
    for name, fn, launch in (("forward", ib._item_block_fwd_kernel, ib._fwd_launch),
                             ("dq (+delta, +SID dk/dv)", ib._item_block_bwd_dq_kernel, ib._dq_launch),
                             ("dense dk/dv", ib._item_block_bwd_dense_kv_kernel, ib._dense_kv_launch)):
        _, consts, opts = launch(cfg, T, D)
        out.append((name, fn, {**consts, **dtype}, opts))
    return out


def _desc_type(rows: int, D: int, stride: int) -> str:
    """The specialisation string of a bf16 tensor descriptor as ``item_block_sm90._desc`` builds it
    (a ``[B, H, R, D]`` tensor, boxes of ``[1, 1, rows, D]``; ``stride`` the row stride)."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from genrec.kernels.item_block_sm90 import _smem_layout

    B, H, R = 2, 2, 64 * SHAPE["T"]
    base = torch.zeros(B * H * R * stride, dtype=torch.bfloat16)
    return mangle_type(TensorDescriptor(base, [B, H, R, D], [H * R * stride, R * stride, stride, 1], [1, 1, rows, D],
                                        _smem_layout(rows, D, False)))


def sm90_kernels(D: int, cfg: Any) -> list[tuple[str, Any, dict[str, str], dict[str, Any], int]]:
    """(name, Gluon function, signature, constexprs, warps) of the sm90 kernels ``cfg`` switches on."""
    from genrec.kernels import item_block as ib
    from genrec.kernels import item_block_sm90 as sm

    T = SHAPE["T"]
    scal = {"H": "i32", "S": "i32", "n_items": "i32", "qk_scale": "fp32"}
    out = []
    if cfg.sm90_fwd:
        bm, bn, w, st, ar = ib._sm90_tiles(cfg.sm90_fwd)
        sig = {"q_desc": _desc_type(bm, D, D), "k_desc": _desc_type(bm, D, D), "v_desc": _desc_type(bm, D, D),
               "kd_desc": _desc_type(bn, D, T * D), "vd_desc": _desc_type(bn, D, T * D),
               "O": "*bf16", "LSE": "*fp32", "LENGTHS": "*i32", **scal}
        out.append(("sm90 forward", sm._sm90_fwd_kernel, sig, {"T": T, "BLOCK_ITEMS": bm // T, "BLOCK_M": bm,
                    "BLOCK_N": bn, "D": D, "STAGES": st, "A_REGS": bool(ar), "LPT": cfg.lpt, "num_warps": w}, w))
    if cfg.sm90_dq:
        bm, bn, w, st, ar = ib._sm90_tiles(cfg.sm90_dq)
        sig = {"q_desc": _desc_type(bm, D, D), "do_desc": _desc_type(bm, D, D), "k_desc": _desc_type(bm, D, D),
               "v_desc": _desc_type(bm, D, D), "kd_desc": _desc_type(bn, D, T * D),
               "vd_desc": _desc_type(bn, D, T * D), "O": "*bf16", "LSE": "*fp32", "DELTA": "*fp32", "DQ": "*bf16",
               "DK": "*bf16", "DV": "*bf16", "LENGTHS": "*i32", **scal, "sm_scale": "fp32"}
        out.append(("sm90 dq (+delta, +SID)", sm._sm90_dq_kernel, sig, {"T": T, "BLOCK_ITEMS": bm // T, "BLOCK_M": bm,
                    "BLOCK_N": bn, "D": D, "STAGES": st, "A_REGS": ar, "LPT": ib._dq_lpt(cfg), "num_warps": w}, w))
    if cfg.sm90_dense_kv:
        bi, bq, w, st, ar = ib._sm90_tiles(cfg.sm90_dense_kv)
        sig = {"q_desc": _desc_type(bq, D, D), "do_desc": _desc_type(bq, D, D), "kd_desc": _desc_type(bi, D, T * D),
               "vd_desc": _desc_type(bi, D, T * D), "LSE": "*fp32", "DELTA": "*fp32", "DK": "*bf16", "DV": "*bf16",
               "LENGTHS": "*i32", **scal, "sm_scale": "fp32"}
        out.append(("sm90 dense dk/dv", sm._sm90_dense_kv_kernel, sig, {"T": T, "BLOCK_I": bi, "BLOCK_Q": bq, "D": D,
                    "STAGES": st, "A_REGS": ar, "LPT": ib._kv_lpt(cfg), "num_warps": w}, w))
    for _, _, sig, consts, _ in out:
        sig.update({name: "constexpr" for name in consts})
    return out


def inspect(D: int, changes: dict[str, int], fp32: bool = False, base: str = "tuned") -> list[dict[str, Any]]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from genrec.kernels.item_block import ItemBlockConfig

    import torch

    dtype = torch.float32 if fp32 else torch.bfloat16
    if base == "tuned":
        cfg = ItemBlockConfig.tuned(D, dtype)
    else:  # what item_block_attention runs when the caller passes no configuration
        from genrec.kernels.item_block import default_config

        cfg = default_config(dtype)
    cfg = cfg.replace(**changes)
    rows = []
    for name, fn, consts, opts in kernels(D, cfg, fp32):
        sig, attrs = _signature(fn, consts, "fp32" if fp32 else "bf16")
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options=opts)
        rows.append({"D": D, "kernel": name, "options": opts, "shared_bytes": k.metadata.shared,
                     **_sass_stats(k.asm["cubin"])})
    from genrec.kernels.item_block_sm90 import HAVE_GLUON

    if HAVE_GLUON and not fp32:  # the Gluon kernels take bf16/fp16 only
        from triton.experimental.gluon._runtime import GluonASTSource

        for name, fn, sig, consts, warps in sm90_kernels(D, cfg):
            # pointers and the multiple-of-16 ints specialised as the JIT launch specialises them
            attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
                     if sig[a].startswith("*") or (sig[a] == "i32" and a not in NOT_ALIGNED)}
            k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
            rows.append({"D": D, "kernel": name, "options": {"num_warps": warps, "num_stages": consts["STAGES"]},
                         "shared_bytes": k.metadata.shared, **_sass_stats(k.asm["cubin"])})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", help="an ItemBlockConfig knob (int, bool, or comma-separated ints for a tuple)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                    help="the inputs' dtype (float32: each product as three TF32 ones, twice the shared memory per tile)")
    ap.add_argument("--config", choices=("tuned", "default"), default="tuned",
                    help="the base configuration: the model's (ItemBlockConfig.tuned) or item_block_attention's "
                         "when no config is passed (item_block.default_config)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("inspect_item_block: unset TRITON_INTERPRET (this compiles for sm_90)")
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the launch-time default of the Triton versions in use
    changes: dict[str, Any] = {}
    for kv in a.set:
        k, v = kv.split("=", 1)
        if "," in v:  # a tuple knob, e.g. sm90_fwd=64,64,4,2,1
            changes[k] = tuple(int(x) for x in v.split(","))
        else:
            changes[k] = v.lower() == "true" if v.lower() in ("true", "false") else int(v)
    fp32 = a.dtype == "float32"
    rows = [r for D in (int(x) for x in a.head_dims.split(",")) for r in inspect(D, changes, fp32, a.config)]
    import triton

    base = "ItemBlockConfig.tuned" if a.config == "tuned" else "item_block.default_config"
    print(f"triton {triton.__version__}, sm_90, {a.dtype}, {base}(D, {a.dtype})"
          + (f" with {changes}" if changes else ""))
    print(f"{'D':>4} {'kernel':24s} {'warps':>5} {'stages':>6} {'regs':>4} {'stack':>5} {'LDL/STL':>8} {'smem KB':>7} "
          f"{'HGMMA':>5} {'drains':>6} {'HMMA':>4} {'LDGSTS':>6} {'UTMALDG':>7} {'LDG':>5} {'MUFU':>5} {'loop LDL/STL':>12}")
    for r in rows:
        print(f"{r['D']:>4} {r['kernel']:24s} {r['options']['num_warps']:>5} {r['options'].get('num_stages', '-'):>6} "
              f"{r.get('reg', 0):>4} {r.get('stack', 0):>5} {str(r['LDL']) + '/' + str(r['STL']):>8} "
              f"{r['shared_bytes'] / 1024:>7.1f} {r['HGMMA']:>5} {r['HGMMA_DRAINS']:>6} {r['HMMA']:>4} {r['LDGSTS']:>6} "
              f"{r['UTMALDG']:>7} {r['LDG']:>5} {r['MUFU']:>5} {r['LOCAL_IN_LOOPS']:>12}")
    if a.out:
        Path(a.out).write_text(json.dumps({"triton": triton.__version__, "dtype": a.dtype, "changes": changes,
                                           "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
