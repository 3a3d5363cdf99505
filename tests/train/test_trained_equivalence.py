"""The PinGER claim on a TRAINED checkpoint (not only random weights): on real MovieLens
histories, next-SID logits and user vectors from the serving layout (history SID tokens
removed, one token per item, KV cache + beam-step decode) equal the training layout's,
float32, max abs diff <= 1e-5."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genrec.infer.cases import user_history
from genrec.infer.recommender import Recommender
from genrec.recipes import pipeline
from genrec.recipes.training import train_run
from genrec.train.run import RunConfig

TOL = dict(atol=1e-5, rtol=0.0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_root) -> Recommender:  # noqa: ANN001
    wd = tmp_path_factory.mktemp("trained")
    pipeline.prepare(wd, "movielens-100k", data_dir=data_root, n_buckets=4)
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


def test_coarse_prefix_sid_retrieval_equals_an_index_lookup_twin(trained: Recommender) -> None:
    """Prefix-expansion SID retrieval (beams over levels 1..L-1, then every item under each prefix)
    equals a plain twin built from beam search + SidIndex.lookup(prefix) + sorting by logits."""
    import torch.nn.functional as F

    from genrec.data.join import BucketJoinReader
    from genrec.data.splits import SplitSpec
    from genrec.decode.beam import beam_search
    from genrec.decode.rows import leaf_rows as sid_leaf_rows
    from genrec.decode.trie_torch import TorchTrie
    from genrec.eval.metrics import rank_in_list
    from genrec.eval.retrieval import _batches, evaluate_retrieval, make_eval_set
    from genrec.sid.build import open_current

    rec = trained
    wd = rec.workdir  # type: ignore[attr-defined]
    store = pipeline.open_store(wd)
    es = make_eval_set(list(BucketJoinReader(store, split=SplitSpec("loo"), role="valid", context_len=20)),
                       rec.catalog, max_cases=300)
    sb = open_current(wd / "sid")
    sizes = [int(k) for k in sb.codebook_sizes]
    L = len(sizes)
    trie = TorchTrie.from_sid_trie(sb.trie)
    leaf_rows = sid_leaf_rows(sb.trie, rec.catalog, strict=True)
    got = evaluate_retrieval(rec.catalog_model, es, paths=("sid",), ks=(20,), beam_width=8, context_len=20,
                             trie=trie, leaf_rows=leaf_rows, sid_mode="prefix")["sid"]
    model = rec.model.eval()
    ptrie = TorchTrie.from_arrays(sb.trie.offsets[: L - 1], sb.trie.codes[: L - 1], sb.trie.children[: L - 1],
                                  sizes[: L - 1])
    ranks = []
    with torch.no_grad():
        for lo, tb in _batches(es, 16, 20, model.config.n_actions):
            mb, _ = rec.catalog_model.model_batch(tb, mask_actions=False)
            cache, _, _ = model.encode_history(mb)
            step = lambda p: F.log_softmax(model.sid_logits_next(cache, p).float(), -1)  # noqa: E731
            res = beam_search(step, tb.batch_size, L - 1, sizes[: L - 1], 8, trie=ptrie)
            last = F.log_softmax(model.sid_logits_next(cache, res.codes.clamp_min(0)).float(), -1)  # [B, W, K_L]
            for i in range(tb.batch_size):
                items: list[int] = []
                for w in range(8):
                    if not bool(res.valid[i, w]):
                        continue
                    prefix = res.codes[i, w].tolist()
                    cand = np.asarray(sb.index.lookup(prefix))  # items under the prefix (index, not trie)
                    full = np.asarray(sb.index.codes_of(cand))[:, L - 1]
                    order = np.argsort(-last[i, w, full].numpy(), kind="stable")
                    items.extend(rec.catalog.rows(cand[order]).tolist())
                ranks.append(rank_in_list(np.array([(items + [-1] * 20)[:20]]), es.target_rows[lo + i:lo + i + 1])[0])
    want = float(np.mean([0 <= r < 20 for r in ranks]))
    assert got["recall@20"] == pytest.approx(want)
    assert sum(r >= 0 for r in ranks) >= 1, "the twin should find some targets (else the comparison is vacuous)"
