"""benchmarks/inspect_item_block.py compiles the three training kernels for sm_90 on a machine
without a GPU (Triton's own ptxas) and reads their SASS. Also a guard on the code path: at the
benchmark's shape every kernel must take Hopper's warpgroup matmuls (HGMMA) fed by asynchronous
copies (LDGSTS), and the forward must not spill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "benchmarks" / "inspect_item_block.py"


def _inspect(tmp_path: Path, head_dims: str, *extra: str) -> tuple[list[dict], str]:
    """Run the tool (without the interpreter, which the test session may have set): its rows and stdout."""
    triton = pytest.importorskip("triton")
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 6):
        pytest.skip("the tool's ahead-of-time compile call is written for Triton >= 3.6 (checked on 3.6 and 3.9)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "inspect.json"
    proc = subprocess.run([sys.executable, str(TOOL), "--head-dims", head_dims, *extra, "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())["rows"], proc.stdout


def test_kernels_compile_for_sm90_to_warpgroup_matmuls(tmp_path: Path) -> None:
    rows, stdout = _inspect(tmp_path, "64")
    triton_rows = [r for r in rows if not r["kernel"].startswith("sm90")]
    assert [r["kernel"] for r in triton_rows] == ["forward", "dq (+delta, +SID dk/dv)", "dense dk/dv"]
    for r in triton_rows:
        assert r["HGMMA"] > 0 and r["HMMA"] == 0, r
        assert r["LDGSTS"] > 0, r
        assert 0 < r["reg"] <= 255 and r["shared_bytes"] > 0, r
    assert rows[0]["stack"] == 0 and rows[0]["LDL"] == rows[0]["STL"] == 0, rows[0]
    assert "forward" in stdout  # the table


def test_sm90_kernels_compile_to_tma_and_warpgroup_matmuls_without_spills(tmp_path: Path) -> None:
    """The Gluon (Hopper) kernels of the tuned configuration, compiled here for sm_90 (no GPU runs
    Gluon in CI): TMA copies feeding warpgroup matmuls, no spills, and shared memory small enough
    for two programs per SM (their timings on the H200 assume it)."""
    pytest.importorskip("triton")
    from genrec.kernels.item_block import ItemBlockConfig
    from genrec.kernels.item_block_sm90 import HAVE_GLUON

    if not HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    rows = [r for r in _inspect(tmp_path, "64,128")[0] if r["kernel"].startswith("sm90")]
    expected = sum(bool(getattr(ItemBlockConfig.tuned(D), k)) for D in (64, 128)
                   for k in ("sm90_fwd", "sm90_dq", "sm90_dense_kv"))
    assert expected > 0 and len(rows) == expected, [r["kernel"] for r in rows]
    knob = {"forward": "sm90_fwd", "dq": "sm90_dq", "dense": "sm90_dense_kv"}
    for r in rows:
        assert r["HGMMA"] > 0 and r["HMMA"] == 0, r
        assert r["UTMALDG"] > 0 and r["LDGSTS"] == 0, r
        # no spill traffic in any loop (per tile); a few spilled words outside the loops are tolerated
        # (at head dim 128, dense dk/dv with K in registers keeps three values on the stack under
        # Triton 3.9's ptxas, none under 3.6's)
        assert r["LOCAL_IN_LOOPS"] == 0 and r["stack"] <= 32, r
        # the matmuls stay asynchronous: ptxas serializes all of them (a full wait after each) when
        # accumulator registers are set or read while products run -- the first draft of the pipelined
        # dq loop did that, and ran 1.12-1.17x slower
        assert r["HGMMA_DRAINS"] * 4 < r["HGMMA"], r
        assert 0 < r["shared_bytes"] <= 228 * 1024 // 2 - 1024, r
    # where a tuned tuple holds loop operands in registers (its 5th element), the kernel must read more
    # A operands from registers than the same tiles without it (compiled here for comparison)
    for D in (64, 128):
        cfg = ItemBlockConfig.tuned(D)
        regs = {k: getattr(cfg, k) for k in knob.values() if getattr(cfg, k) and len(getattr(cfg, k)) > 4
                and getattr(cfg, k)[4]}
        if not regs:
            continue
        sets = [a for k, t in regs.items() for a in ("--set", f"{k}={','.join(map(str, t[:4]))}")]
        plain = {r["kernel"]: r for r in _inspect(tmp_path, str(D), *sets)[0] if r["kernel"].startswith("sm90")}
        for r in rows:
            if r["D"] == D and knob[r["kernel"].split()[1]] in regs:
                assert r["HGMMA_REG_A"] > plain[r["kernel"]]["HGMMA_REG_A"], (r, plain[r["kernel"]])


def test_sm90_register_operands_compile_and_take_effect(tmp_path: Path) -> None:
    """The fifth element of the sm90 tuples holds the loops' A operands in registers (forward: Q;
    dq: Q, then dO; dense dk/dv: K, then V): without spills, within two programs' shared memory, and
    at least half of each kernel's warpgroup matmuls then read A from registers (the tuned ones:
    only the P V / P^T dO / dS K products, 17-33%)."""
    pytest.importorskip("triton")
    from genrec.kernels.item_block_sm90 import HAVE_GLUON

    if not HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    # dense dk/dv with K alone in registers: K and V both spill under Triton 3.9 (not under 3.6); dq
    # with Q alone: with dO too, Triton 3.9's ptxas serializes the pipelined loop's matmuls (C7512)
    rows = _inspect(tmp_path, "128", "--set", "sm90_fwd=64,64,4,2,1", "--set", "sm90_dq=64,64,4,2,1",
                    "--set", "sm90_dense_kv=64,16,4,3,1")[0]
    rows = [r for r in rows if r["kernel"].startswith("sm90")]
    assert len(rows) == 3, [r["kernel"] for r in rows]
    for r in rows:
        # no spill traffic in any loop (per tile); a few spilled words outside the loops are tolerated
        # (at head dim 128, dense dk/dv with K in registers keeps three values on the stack under
        # Triton 3.9's ptxas, none under 3.6's)
        assert r["LOCAL_IN_LOOPS"] == 0 and r["stack"] <= 32, r
        # the matmuls stay asynchronous: ptxas serializes all of them (a full wait after each) when
        # accumulator registers are set or read while products run -- the first draft of the pipelined
        # dq loop did that, and ran 1.12-1.17x slower
        assert r["HGMMA_DRAINS"] * 4 < r["HGMMA"], r
        assert 0 < r["shared_bytes"] <= 228 * 1024 // 2 - 1024, r
        assert 2 * r["HGMMA_REG_A"] >= r["HGMMA"] > 0, r


def test_tuned_kernels_fit_an_sm_in_fp32(tmp_path: Path) -> None:
    """fp32 tiles take twice the shared memory: the tuned configuration for fp32 must still fit one
    program's 227 KB on an H100/H200 (at head dim 128 the bf16 tiles needed 320 KB: every fp32
    training step of a head-dim-128 model failed to launch on the GPU before 2026-12-01)."""
    rows, _ = _inspect(tmp_path, "64,128", "--dtype", "float32")
    assert len(rows) == 6, [r["kernel"] for r in rows]
    for r in rows:
        assert 0 < r["shared_bytes"] <= 227 * 1024, r
        # fp32 products on the tensor cores (three TF32 products each), not the FMA units: with "ieee"
        # products ptxas kept 14-22 KB per thread on the stack at head dim 128 (and took ~50 s a kernel)
        assert r["HGMMA"] > 0 and r["stack"] <= 4096, r


def test_default_kernels_fit_an_sm_in_fp32(tmp_path: Path) -> None:
    """What item_block_attention runs when given no configuration must fit too: before
    item_block.default_config capped fp32 tiles, dense dk/dv at head dim 128 wanted 321 KB of shared memory
    and the call failed to launch on the H200 (OutOfResources, in `genrec bench kernels`' checks)."""
    rows, stdout = _inspect(tmp_path, "64,128", "--dtype", "float32", "--config", "default")
    assert "default_config" in stdout
    assert len(rows) == 6, [r["kernel"] for r in rows]
    for r in rows:
        assert 0 < r["shared_bytes"] <= 227 * 1024, r
        assert r["HGMMA"] > 0, r


def test_local_memory_is_counted_inside_loops_only(benchmark_script) -> None:
    """The spill check's loop finder, on hand-written SASS: a backward branch closes a loop from its
    target label; local loads/stores before the loop or after it are not counted, those inside are;
    the barrier-wait slow paths after the last EXIT, which jump back into the body, are not loops."""
    mod = benchmark_script("inspect_item_block")
    sass = """
        /*0000*/                   STL [R1], R8 ;
.L_x_3:
        /*0010*/                   HGMMA.64x32x16.F32.BF16 R168, R224, gdesc[UR16], RZ, !UPT ;
        /*0020*/                   LDL R9, [R1] ;
        /*0030*/              @P0 BRA `(.L_x_3) ;
        /*0040*/                   LDL.LU R244, [R1+0x4] ;
        /*0050*/              @P1 BRA `(.L_x_9) ;
.L_x_9:
        /*0060*/                   EXIT ;
.L_x_5:
        /*0070*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR6+0x14020], R4 ;
        /*0080*/              @!P0 BRA `(.L_x_5) ;
        /*0090*/                   BRA `(.L_x_3) ;
"""
    assert mod._local_in_loops(sass) == 1
    assert mod._local_in_loops(sass.replace("LDL R9, [R1] ;", "NOP ;")) == 0


def test_warp_specialized_forward_prototype_compiles_asynchronously() -> None:
    """``benchmarks/probe_ws_fwd.py`` (two query blocks on one K/V ring: a TMA producer warp and two
    consumer warp groups, not used by genrec) compiles for sm_90 within one SM's shared memory, with
    register reallocation between its partitions, no spills and its matmuls left asynchronous."""
    triton = pytest.importorskip("triton")
    from genrec.kernels.item_block_sm90 import HAVE_GLUON

    if not HAVE_GLUON or tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 6):
        pytest.skip("needs Gluon's warp specialisation (Triton >= 3.6)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    proc = subprocess.run([sys.executable, str(TOOL.parent / "probe_ws_fwd.py"), "--compile-only"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    st = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0 < st["shared_bytes"] <= 227 * 1024 and st["warps"] == 12, st
    assert st["setmaxnreg"] > 0 and st["local"] == 0, st
    assert st["HGMMA"] > 0 and st["HGMMA_DRAINS"] * 4 < st["HGMMA"], st
