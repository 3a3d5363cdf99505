"""Debug (GPU only): the backward's stash path one launch at a time, each mode in its own subprocess
(an illegal instruction ends the process that meets it).

Usage:
    python benchmarks/debug_stash.py            # every mode, both head dims
    python benchmarks/debug_stash.py MODE D     # one

Modes, at B 2 x H 2 x 13 items x T 5 (lengths 13 and 7), bf16:
  dkv        delta + dense dk/dv with the stash: the stash's dS on the dense pairs against torch's
             (fp32 attention with the PinGER mask), and dk/dv's dense rows against torch
  dq         delta, then dq from a stash filled by torch (dense dk/dv not run): dq against torch
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

T, B, H, N = 5, 2, 2, 13


def reference(q, k, v, do, lengths, scale):
    from genrec.kernels.reference import item_block_mask

    S = q.shape[2]
    mask = item_block_mask(lengths, S // T, T)[:, None]  # [B, 1, S, S] bool, True = visible
    qf, kf, vf, dof = (x.float().requires_grad_() for x in (q, k, v, do))
    s = (qf @ kf.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    out = p @ vf
    dp = dof @ vf.transpose(-1, -2)
    delta = (dof * out).sum(-1, keepdim=True)
    ds = p * (dp - delta)  # unscaled, as the kernels keep it
    dq, dk, dv = torch.autograd.grad(out, (qf, kf, vf), dof)
    return out, ds, dq, dk, dv, mask


def run(mode: str, D: int) -> None:
    from genrec.kernels import item_block as ib
    from genrec.kernels.item_block import ItemBlockConfig, _Backward, item_block_attention_fwd
    from genrec.kernels.item_block_sm90 import stash_shape

    g = torch.Generator(device="cuda").manual_seed(D)
    q, k, v, do = (torch.randn(B, H, N * T, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
    lengths = torch.tensor([N, 7], dtype=torch.int32, device="cuda")
    scale = D ** -0.5
    ref_out, ref_ds, ref_dq, ref_dk, ref_dv, mask = reference(q, k, v, do, lengths, scale)
    kv = (64, 16, 4, 3, 1) if D == 128 else (64, 32, 4, 3, 1)
    cfg = ItemBlockConfig.tuned(D).replace(sm90_dense_kv=kv, sm90_dq_stash=(64, 64, 4, 2))
    out, lse = item_block_attention_fwd(q, k, v, lengths, T, scale, config=cfg)
    bw = _Backward(q, k, v, out, lse, do, lengths, T, scale, cfg)
    assert bw.stash
    bw.run_delta()
    torch.cuda.synchronize()
    # the stash's expected contents: dS on the dense pairs (key = a dense token, query sees it)
    dense_cols = torch.arange(N, device="cuda") * T + T - 1
    want = ref_ds[:, :, :, dense_cols]  # [B, H, S, n_items]
    vis = mask[:, :, :, dense_cols].expand_as(want)
    if mode == "dkv":
        bw.run_dense_kv()
        torch.cuda.synchronize()
        st = bw.ds_stash[..., :N].float()
        err = torch.where(vis, (st - want).abs(), 0.0).max() / want.abs().max()
        print(f"  {mode} D={D}: stash vs torch dS on visible pairs: {err:.2e}; "
              f"non-finite visible entries: {int((~torch.isfinite(st) & vis).sum())}", flush=True)
        dk_err = (bw.dk[:, :, dense_cols].float() - ref_dk[:, :, dense_cols]).nan_to_num(0.0).abs().max() / ref_dk.nan_to_num(0.0).abs().max()
        dv_err = (bw.dv[:, :, dense_cols].float() - ref_dv[:, :, dense_cols]).nan_to_num(0.0).abs().max() / ref_dv.nan_to_num(0.0).abs().max()
        print(f"  {mode} D={D}: dense dk {dk_err:.2e}, dense dv {dv_err:.2e}", flush=True)
    else:
        stash = torch.full(stash_shape(q, T), float("nan"), device="cuda", dtype=torch.bfloat16)
        stash[..., :N] = torch.where(vis, want, torch.zeros_like(want)).to(torch.bfloat16)
        bw.ds_stash = stash
        bw.run_dq()
        torch.cuda.synchronize()
        valid = (torch.arange(N * T, device="cuda")[None, :] < lengths[:, None] * T)[:, None, :, None]
        err = torch.where(valid, (bw.dq.float() - ref_dq).abs(), 0.0).max() / ref_dq.nan_to_num(0.0).abs().max()
        print(f"  {mode} D={D}: dq vs torch {err:.2e}", flush=True)
    del ib


def main() -> int:
    if len(sys.argv) == 3:
        run(sys.argv[1], int(sys.argv[2]))
        return 0
    for D in (64, 128):
        for mode in ("dkv", "dq"):
            r = subprocess.run([sys.executable, __file__, mode, str(D)], capture_output=True, text=True, timeout=300)
            lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "warn" not in ln.lower()]
            print(f"--- {mode} D={D}: rc {r.returncode}", flush=True)
            print("\n".join(lines[-6:]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
