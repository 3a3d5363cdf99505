"""The item-block kernels as torch custom ops (what a compiled training forward calls), under the
CPU interpreter: registration checked by ``torch.library.opcheck``; the op inside
``torch.compile`` equals the PyTorch twin, forward and backward."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from genrec.kernels import item_block  # noqa: E402
from genrec.kernels.item_block import item_block_attention  # noqa: E402
from genrec.kernels.reference import item_block_attention_ref  # noqa: E402

_INTERPRETED = type(item_block._item_block_fwd_kernel).__name__ == "InterpretedFunction"
pytestmark = pytest.mark.skipif(
    not (_INTERPRETED or torch.cuda.is_available()),
    reason="genrec.kernels.item_block was imported before TRITON_INTERPRET=1 was set and there is no GPU",
)
DEVICE = "cpu" if _INTERPRETED else "cuda"


def _inputs(seed: int, B: int = 2, H: int = 2, n: int = 5, T: int = 3, D: int = 16):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(B, H, n * T, D, generator=g).to(DEVICE) for _ in range(4)]
    lengths = torch.randint(0, n + 1, (B,), generator=g).to(DEVICE)
    return xs, lengths, T


def test_opcheck_forward_op() -> None:
    (q, k, v, _), lengths, T = _inputs(0)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    torch.library.opcheck(torch.ops.genrec.item_block_fwd.default, (q, k, v, lengths, T, 0.25),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


@pytest.mark.parametrize("seed", range(3))
def test_compiled_op_equals_reference_forward_and_backward(seed: int) -> None:
    (q, k, v, do), lengths, T = _inputs(seed)
    f = torch.compile(lambda q, k, v: item_block_attention(q, k, v, lengths, T), backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    got_in = [x.clone().requires_grad_() for x in (q, k, v)]
    ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
    out = f(*got_in)
    ref = item_block_attention_ref(*ref_in, lengths, T)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    g_got = torch.autograd.grad(out, got_in, do)
    g_ref = torch.autograd.grad(ref, ref_in, do)
    for name, a, b in zip("qkv", g_got, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"d{name}")
