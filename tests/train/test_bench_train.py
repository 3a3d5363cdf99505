"""benchmarks/bench_train.py's SID fusion switch: each path computes the model's function while a
variant runs, and the class is restored afterwards (an A/B alternates paths in one process)."""

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
