"""``genrec bench train`` (genrec.bench.train) and benchmarks/bench_train.py: the FLOP-ceiling column, a whole run
through the CLI on real data, and the script's SID fusion switch (each path computes the model's function while a
variant runs, and the class is restored afterwards: an A/B alternates paths in one process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genrec.model.config import ModelConfig
from genrec.model.encoders import SidEmbedding
from genrec.model.fusion import SidFusion

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_train.py"


def test_fusion_paths_compute_one_function_and_restore_the_class(benchmark_script) -> None:
    bench = benchmark_script("bench_train")
    before = dict(SidFusion.__dict__)
    cfg = ModelConfig.from_name("tiny", sid_codebook_sizes=[3, 3, 3])
    torch.manual_seed(0)
    fusion, emb = SidFusion(cfg), SidEmbedding(cfg)
    codes, dense = torch.randint(0, 3, (4, 5, 3)), torch.randn(4, 5, cfg.d_model)  # 60 SID tokens > 9 rows
    want = fusion.forward_codes(codes, emb, dense)
    calls = []
    for name in bench.FUSION_PATHS:
        with bench.fusion_path(name):
            calls.append((SidFusion.forward_codes is before["forward_codes"],
                          SidFusion._use_kernel is before["_use_kernel"]))
            torch.testing.assert_close(fusion.forward_codes(codes, emb, dense), want, atol=1e-5, rtol=1e-5)
        assert SidFusion.__dict__["forward_codes"] is before["forward_codes"]
        assert SidFusion.__dict__["_use_kernel"] is before["_use_kernel"]
    # codes-torch switches the kernel off, embedded replaces the method, while the variant runs
    assert calls == [(True, True), (True, False), (False, True)]
    with pytest.raises(SystemExit, match="unknown SID fusion path"), bench.fusion_path("nope"):
        pass


def test_flop_ceiling_counts_the_masks_pairs(benchmark_script) -> None:
    """The ceiling column: PinGER's pairs in closed form against the rule mask itself, and the ceiling against
    the hand-worked figures in docs/RESULTS.md (d 768, d_ff 3,072; 1.30x / 1.92x / 2.41x at 1,024 / 4,096 /
    8,192 items of 4 tokens, 1.40x at 1,024 items of 5)."""
    from genrec.bench import train as bench
    from genrec.kernels.reference import item_block_mask

    assert benchmark_script("bench_train").flop_ceiling is bench.flop_ceiling  # the script runs the package's
    for n, T in ((1, 1), (1, 4), (7, 2), (12, 5)):
        assert bench.pinger_pairs(n, T) == int(item_block_mask(torch.tensor([n]), n, T).sum()), (n, T)
    got = [round(bench.flop_ceiling(n, T, 768, 3072), 2) for n, T in ((1024, 4), (4096, 4), (8192, 4), (1024, 5))]
    assert got == [1.30, 1.92, 2.41, 1.40]
    assert bench.flop_ceiling(1, 1, 64, 256) == 1.0  # one token: the same single pair either way


def test_cli_bench_train_compares_layouts_on_real_data(prepared, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """`genrec bench train` end to end on MovieLens 100K: both layouts step, the table and the JSON carry the
    ratio to TIGER, full synthetic rows carry the ceiling, and an override reaches the model."""
    import json

    from typer.testing import CliRunner

    from genrec.bench.train import flop_ceiling
    from genrec.cli import app

    monkeypatch.setenv("OUT", str(tmp_path))
    r = CliRunner().invoke(app, ["bench", "train", str(prepared), "--preset", "cpu-tiny", "--synthetic", "2x12",
                                 "--steps", "2", "--warmup", "1", "model.d_model=48", "model.n_heads=2"])
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "bench_train.json").read_text())
    assert [x["layout"] for x in rows] == ["pinger", "tiger"]
    assert all(x["d_model"] == 48 and x["context_items"] == 12 and x["ms_per_step"] > 0 for x in rows)
    assert rows[1]["items_per_s_vs_tiger"] == 1.0
    assert rows[0]["flop_ceiling_vs_tiger"] == pytest.approx(flop_ceiling(12, rows[0]["tokens_per_item"], 48, rows[0]["d_ff"]))
    assert rows[0]["share_of_ceiling"] == pytest.approx(rows[0]["items_per_s_vs_tiger"] / rows[0]["flop_ceiling_vs_tiger"])
    assert "ceiling" in r.output and "tiger" in r.output
    bad = CliRunner().invoke(app, ["bench", "train", str(prepared), "--synthetic", "8by1024"])
    assert bad.exit_code != 0 and "BxN" in bad.output


def test_no_attention_bound_drops_only_the_attention_and_restores_it() -> None:
    """The ``+noattn`` bound: while open, a block's self-attention is its values (out = V, shape kept, gradients
    reach the QKV projection); afterwards, and after an error inside, the backbone's attention is the model's."""
    from genrec.bench.train import no_attention
    from genrec.model import backbone

    saved = backbone.attention
    cfg = ModelConfig.from_name("tiny", sid_codebook_sizes=[3, 3, 3])
    torch.manual_seed(1)
    attn = backbone.SelfAttention(cfg)
    x = torch.randn(2, 6, cfg.d_model, requires_grad=True)
    b, s, d = x.shape
    v = attn.qkv(x).view(b, s, 3, attn.h, attn.dh)[:, :, 2]  # [B, S, H, Dh]
    with no_attention():
        out, _, _ = attn(x, mask=None)
        out.sum().backward()
    torch.testing.assert_close(out, attn.out(v.reshape(b, s, d)))
    assert x.grad is not None and attn.qkv.weight.grad is not None
    assert attn.qkv.weight.grad[: 2 * d].abs().sum() == 0  # the q and k rows get nothing: no attention read them
    assert attn.qkv.weight.grad[2 * d:].abs().sum() > 0
    assert backbone.attention is saved
    with pytest.raises(RuntimeError, match="inside"), no_attention():
        assert backbone.attention is not saved
        raise RuntimeError("inside")
    assert backbone.attention is saved


def test_cli_bench_train_attention_free_bound_row(prepared, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """`--variants pinger,tiger,pinger+noattn`: the bound row is marked, compared with the real TIGER row, and
    carries TIGER's FLOPs over none as its ceiling; the real rows keep theirs."""
    import json

    from typer.testing import CliRunner

    from genrec.bench.train import attention_free_ceiling, flop_ceiling
    from genrec.cli import app

    monkeypatch.setenv("OUT", str(tmp_path))
    r = CliRunner().invoke(app, ["bench", "train", str(prepared), "--preset", "cpu-tiny", "--synthetic", "2x12",
                                 "--steps", "1", "--warmup", "1", "--variants", "pinger,tiger,pinger+noattn",
                                 "model.d_model=48", "model.n_heads=2"])
    assert r.exit_code == 0, r.output
    rows = json.loads((tmp_path / "bench_train.json").read_text())
    assert [(x["variant"], x["layout"], x["attention"]) for x in rows] == [
        ("pinger", "pinger", "model"), ("tiger", "tiger", "model"), ("pinger+noattn", "pinger", "none (bound)")]
    pin, tig, bound = rows
    T, dff = pin["tokens_per_item"], pin["d_ff"]
    assert pin["flop_ceiling_vs_tiger"] == pytest.approx(flop_ceiling(12, T, 48, dff))
    assert bound["flop_ceiling_vs_tiger"] == pytest.approx(attention_free_ceiling(12, T, 48, dff))
    assert bound["flop_ceiling_vs_tiger"] > pin["flop_ceiling_vs_tiger"]
    assert bound["items_per_s_vs_tiger"] == pytest.approx(bound["items_per_s"] / tig["items_per_s"])
    assert "share_of_ceiling" not in bound and "a bound, not a model" in r.output
