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
    the hand-worked figures in BENCHMARKS.md (d 768, d_ff 3,072; 1.30x / 1.92x / 2.41x at 1,024 / 4,096 /
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
