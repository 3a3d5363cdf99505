"""Training throughput of genrec's layouts at equal context, measured side by side in one run:
``genrec bench train`` (:mod:`genrec.bench.train`) with two switches for A/B experiments.

    python benchmarks/bench_train.py WORKDIR --preset cpu-small --steps 20 [--variants pinger,tiger] [--rounds 2]
        [--synthetic BxN] [--compile-mode MODE] [--fusion PATH] [--item-block original] [OVERRIDES ...]

A variant may name SID fusion's path after an ``@`` (``pinger@codes-torch``; see ``--fusion``); ``--item-block
original`` runs the item-block kernel's default tiles instead of the tuned ones. Prints a table last; full numbers
go to $OUT/bench_train.json when OUT is set.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.bench.train import flop_ceiling, parser, pinger_pairs, run  # noqa: E402,F401 - re-exported for tests

FUSION_PATHS = ("codes", "codes-torch", "embedded")


@contextlib.contextmanager
def fusion_path(name: str) -> Iterator[None]:
    """SID fusion's path while a variant runs: ``codes`` the model's (keys and values per codebook
    row, gathered; on CUDA the attention is genrec.kernels.sid_fusion's kernel), ``codes-torch`` the
    same with the attention in PyTorch, ``embedded`` the path codes replaced (the batch's SID tokens
    embedded, then projected). One function; the class is restored afterwards."""
    from genrec.model.fusion import SidFusion

    if name not in FUSION_PATHS:
        raise SystemExit(f"bench_train: unknown SID fusion path {name!r}; choose one of {FUSION_PATHS}")
    saved = dict(SidFusion.__dict__)
    if name == "codes-torch":
        SidFusion._use_kernel = lambda self, x: False  # type: ignore[method-assign]
    if name == "embedded":
        SidFusion.forward_codes = lambda self, codes, embed, dense: self(embed(codes), dense)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        for attr in ("_use_kernel", "forward_codes"):
            setattr(SidFusion, attr, saved[attr])


def main() -> None:
    ap = parser()
    ap.add_argument("--fusion", choices=FUSION_PATHS, default="codes",
                    help="SID fusion's path for variants that name none (see fusion_path); one function")
    ap.add_argument("--item-block", choices=("tuned", "original"), default="tuned",
                    help="the item-block kernel's configuration (attn_impl=triton): the model's or the defaults")
    a = ap.parse_intermixed_args()
    if a.item_block == "original":
        from genrec.kernels import item_block

        item_block.ItemBlockConfig.tuned = classmethod(lambda cls, head_dim, dtype=None: cls())  # type: ignore[method-assign,assignment]

    def context(spec: str) -> tuple[str, contextlib.AbstractContextManager[None]]:
        v, _, fusion = spec.partition("@")
        return v, fusion_path(fusion or a.fusion)

    run(a, context)


if __name__ == "__main__":
    main()
