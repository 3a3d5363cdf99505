"""The Triton item-block path with M-FALCON candidates after the history (the joint training
step's layout): the kernel over the history, :func:`candidate_attention` over the candidates,
against SDPA with the explicit PinGER mask of the same layout -- forward and backward, under
the CPU interpreter (or on a GPU). Also: a candidate's output depends on no other candidate."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

pytest.importorskip("triton")

from genrec.kernels import item_block  # noqa: E402
from genrec.kernels.attention import ItemBlockMask, attention, candidate_attention  # noqa: E402
from genrec.model.layout import PAD, build_layout  # noqa: E402
from genrec.model.mask import reference_mask  # noqa: E402

_INTERPRETED = type(item_block._item_block_fwd_kernel).__name__ == "InterpretedFunction"
pytestmark = pytest.mark.skipif(not (_INTERPRETED or torch.cuda.is_available()),
                                reason="item_block imported before TRITON_INTERPRET=1 and no GPU")
DEVICE = "cpu" if _INTERPRETED else "cuda"


def _inputs(seed: int, b: int, n: int, T: int, m: int, h: int = 2, d: int = 16):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, n + 1, (b,), generator=g)
    lengths[0] = n
    s = n * T + m
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    return q, k, v, lengths.to(DEVICE)


@pytest.mark.parametrize("seed,b,n,T,m", [(0, 3, 5, 4, 3), (1, 2, 7, 2, 1), (2, 4, 3, 3, 6), (3, 2, 6, 4, 0)])
def test_item_block_with_candidates_equals_sdpa_with_the_pinger_mask(seed, b, n, T, m) -> None:
    q, k, v, lengths = _inputs(seed, b, n, T, m)
    lay = build_layout(lengths, n, "pinger", T, n_cand=m)
    vis = reference_mask(lay.meta, lay.meta, "pinger")[:, None]  # [B, 1, S, S]
    got = attention(q, k, v, mask=ItemBlockMask(lengths, T, m))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=vis)
    # rows past a short history are PAD queries (the kernel writes 0 there, SDPA attends to itself):
    # compare real history tokens and every candidate
    real = lay.meta.kind != PAD  # [B, S]
    torch.testing.assert_close(got.transpose(1, 2)[real], want.transpose(1, 2)[real], atol=2e-5, rtol=2e-5)
    w = torch.randn_like(got)
    keep = real[:, None, :, None].to(got.dtype)
    (gq, gk, gv) = torch.autograd.grad((got * w * keep).sum(), (q, k, v))
    (rq, rk, rv) = torch.autograd.grad((want * w * keep).sum(), (q, k, v))
    for a, r in ((gq, rq), (gk, rk), (gv, rv)):
        torch.testing.assert_close(a, r, atol=5e-5, rtol=5e-5)


def test_a_candidate_sees_no_other_candidate() -> None:
    g = torch.Generator().manual_seed(5)
    b, h, n, m, d = 2, 2, 6, 5, 16
    q, ks, vs = (torch.randn(b, h, m, d, generator=g) for _ in range(3))
    kd, vd = torch.randn(b, h, n, d, generator=g), torch.randn(b, h, n, d, generator=g)
    lengths = torch.tensor([6, 2])
    full = candidate_attention(q, kd, vd, ks, vs, lengths)
    for j in range(m):  # one candidate alone gives the same output
        alone = candidate_attention(q[:, :, j:j + 1], kd, vd, ks[:, :, j:j + 1], vs[:, :, j:j + 1], lengths)
        torch.testing.assert_close(alone[:, :, 0], full[:, :, j], atol=1e-6, rtol=1e-6)
    # a history key past the row's length changes nothing
    kd2 = kd.clone()
    kd2[1, :, 2:] += 100.0
    torch.testing.assert_close(candidate_attention(q, kd2, vd, ks, vs, lengths), full)


def test_bad_candidate_count_names_the_problem() -> None:
    q, k, v, lengths = _inputs(0, 2, 3, 4, 2)
    with pytest.raises(ValueError, match="whole number"):
        attention(q, k, v, mask=ItemBlockMask(lengths, 4, 3))
    with pytest.raises(ValueError, match="n_cand"):
        ItemBlockMask(lengths, 4, -1)
