"""The PinGER claim on a TRAINED checkpoint (not only random weights): on real MovieLens
histories, next-SID logits and user vectors from the serving layout (history SID tokens
removed, one token per item, KV cache + beam-step decode) equal the training layout's,
float32, max abs diff <= 1e-5."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genrec import pipeline
from genrec.retrieve.recommender import Recommender, user_history
from genrec.train.run import RunConfig, train_run

TOL = dict(atol=1e-5, rtol=0.0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, datasets_root) -> Recommender:  # noqa: ANN001
    wd = tmp_path_factory.mktemp("trained")
    pipeline.prepare(wd, "movielens-100k", data_dir=datasets_root, n_buckets=4)
    pipeline.build_item_features(wd, content_dim=16, engagement_dim=16)
    pipeline.build_semantic_ids(wd, levels=2)
    train_run(wd, RunConfig.from_name("cpu-tiny", ["train.total_steps=8"]), resume=False)
    rec = Recommender.from_checkpoint(wd)
    rec.workdir = wd  # type: ignore[attr-defined]
    return rec


def test_trained_checkpoint_serving_layout_equals_training_layout(trained: Recommender) -> None:
    rec = trained
    model = rec.model.eval()
    cfg = model.config
    rng = np.random.default_rng(0)
    users = rng.choice(np.arange(1, 944), 6, replace=False)
    parsed = [rec.parse_history(user_history(rec.workdir, int(u))[-12:]) for u in users]  # type: ignore[attr-defined]
    batch = rec.model_batch(parsed)
    lengths = batch.lengths.tolist()
    assert cfg.layout == "pinger" and cfg.sid_levels >= 3
    with torch.no_grad():
        train = model(batch)
        serve = model(batch, serving_layout=True)
        valid = train.item_valid
        torch.testing.assert_close(serve.user_vecs[valid], train.user_vecs[valid], **TOL)
        checked = 0
        for m in range(1, max(lengths)):
            rows = [b for b, ln in enumerate(lengths) if ln > m]
            sub = type(batch)(**{f: (getattr(batch, f)[:, :m] if getattr(batch, f) is not None
                                     and getattr(batch, f).dim() >= 2 and getattr(batch, f).shape[1] == batch.n_items
                                     else getattr(batch, f)) for f in batch.__dataclass_fields__})
            sub.lengths = batch.lengths.clamp(max=m)
            cache, user, _ = model.encode_history(sub)
            assert cache.n_tokens == m  # one token per history item at serving
            torch.testing.assert_close(user[rows], train.user_vecs[rows, m - 1], **TOL)
            for d in range(cfg.sid_levels):
                prefix = batch.sid_codes[:, m, :d][:, None, :]  # [B, 1, d]: the true prefix of item m
                got = model.sid_logits_next(cache, prefix)[:, 0]
                torch.testing.assert_close(got[rows], train.sid_logits[d][rows, m], **TOL)
                checked += len(rows)
        assert checked > 20
