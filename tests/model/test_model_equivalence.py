"""PinGER serving equivalence and forward-vs-cached equality (float32, CPU, tiny models)."""

from __future__ import annotations

import pytest
import torch

from genrec.model import GenRecModel, ModelBatch, ModelConfig, build_layout
from genrec.model.backbone import Backbone

TOL = dict(atol=1e-5, rtol=0.0)


def make_model(seed: int, **over) -> GenRecModel:
    torch.manual_seed(seed)
    cfg = ModelConfig.from_name("tiny", dropout=0.0, **over)
    return GenRecModel(cfg).eval()


def make_batch(cfg: ModelConfig, lengths: list[int], n: int, k: int, seed: int, feats: bool = True) -> ModelBatch:
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    ri = lambda hi, *shape: torch.randint(0, hi, shape, generator=g)  # noqa: E731
    return ModelBatch(
        actions=ri(cfg.n_actions, b, n),
        surfaces=ri(cfg.n_surfaces, b, n),
        lengths=torch.tensor(lengths),
        sid_codes=torch.stack([ri(K, b, n) for K in cfg.sid_codebook_sizes], -1),
        item_feats=torch.randn(b, n, cfg.item_feat_dim, generator=g) if feats else None,
        item_vecs=None if feats else torch.nn.functional.normalize(torch.randn(b, n, cfg.item_dim, generator=g), dim=-1),
        action_mask=torch.rand(b, n, generator=g) < 0.3,
        target_actions=ri(cfg.n_actions + 1, b, n),
        request_surface=ri(cfg.n_surfaces, b),
        request_action=ri(cfg.n_actions, b),
        cand_feats=torch.randn(b, k, cfg.item_feat_dim, generator=g) if k else None,
        cand_sid_codes=torch.stack([ri(K, b, k) for K in cfg.sid_codebook_sizes], -1) if k else None,
        cand_surface=ri(cfg.n_surfaces, b) if k else None,
    )


def truncate(batch: ModelBatch, m: int) -> ModelBatch:
    """The first m items of each row (no candidates)."""
    sl = lambda t: None if t is None else t[:, :m]  # noqa: E731
    return ModelBatch(
        actions=batch.actions[:, :m], surfaces=batch.surfaces[:, :m], lengths=batch.lengths.clamp(max=m),
        sid_codes=sl(batch.sid_codes), item_feats=sl(batch.item_feats), item_vecs=sl(batch.item_vecs),
        action_mask=sl(batch.action_mask), target_actions=sl(batch.target_actions),
    )


CONFIGS = [
    dict(sid_fusion=True, target_condition=False),
    dict(sid_fusion=True, target_condition=True),
    dict(sid_fusion=False, target_condition=True, sid_levels=2, sid_codebook_sizes=[5, 7]),
    dict(sid_fusion=True, target_condition=True, sid_levels=4, sid_codebook_sizes=[6, 5, 4, 3], norm="layernorm"),
    # SASRec's recipe knobs: positions counted back from the next item, a linear or no user tower
    dict(sid_fusion=True, target_condition=False, positions="end", pos_init_std=0.02, user_head="linear"),
    dict(sid_fusion=True, target_condition=True, positions="end", user_head="identity", item_dim=32, input_dropout=0.5),
    dict(sid_fusion=True, target_condition=False, normalize=False),  # raw dot-product vectors
    # the item vector as the input token, small input tables, FFN dropout (off in eval)
    dict(sid_fusion=True, target_condition=True, positions="end", user_head="identity", item_dim=32, input_proj=False,
         normalize=False, embed_init_std=0.02, ffn_dropout=0.5),
]


@pytest.mark.parametrize("seed,over", list(enumerate(CONFIGS)))
def test_pinger_serving_layout_equals_training_layout(seed: int, over: dict) -> None:
    model = make_model(seed, **over)
    cfg = model.config
    n, lengths = 6, [6, 4, 1, 5]
    batch = make_batch(cfg, lengths, n, 0, seed)
    with torch.no_grad():
        train = model(batch)
        serve = model(batch, serving_layout=True)
        valid = train.item_valid
        # user vectors (and action logits) at every dense position: SID tokens removed changes nothing
        torch.testing.assert_close(serve.user_vecs[valid], train.user_vecs[valid], **TOL)
        torch.testing.assert_close(serve.action_logits[valid], train.action_logits[valid], **TOL)
        assert train.hidden.shape[1] == n * cfg.sid_levels and serve.hidden.shape[1] == n
        # next-SID logits through the serving path (KV cache of dense tokens only + beam decode); with
        # positions counted from the end a shorter history moves every position, so only the whole one is served
        checked = 0
        for m in (range(1, n) if cfg.positions == "start" else ()):
            rows = [b for b, ln in enumerate(lengths) if ln > m]
            if not rows:
                continue
            sub = truncate(batch, m)
            ts, ta = batch.surfaces[:, m], batch.target_actions[:, m]
            cache, user, _ = model.encode_history(sub, ts, ta)
            assert cache.n_tokens == m  # one token per item
            torch.testing.assert_close(user[rows], train.user_vecs[rows, m - 1], **TOL)
            for d in range(cfg.sid_levels):
                prefix = batch.sid_codes[:, m, :d][:, None, :]  # [B, 1, d] the true prefix
                got = model.sid_logits_next(cache, prefix, ts, ta)[:, 0]  # [B, K_{d+1}]
                torch.testing.assert_close(got[rows], train.sid_logits[d][rows, m], **TOL)
                checked += len(rows)
        assert checked > 0 or cfg.positions == "end"
        # the next item after the whole history (request target)
        cache, user, _ = model.encode_history(batch, batch.request_surface, batch.request_action)
        torch.testing.assert_close(user, train.next_user_vec, **TOL)
        lvl1 = model.sid_logits_next(cache, torch.zeros(len(lengths), 3, 0, dtype=torch.int64),
                                     batch.request_surface, batch.request_action)
        for w in range(3):
            torch.testing.assert_close(lvl1[:, w], train.next_sid_logits, **TOL)
        # deeper levels of the item after the whole history: the training layout with that item appended
        # (counting positions back from it, as a training row that ends on its target does)
        nxt = batch.sid_codes[:, 0, :]  # [B, L] any codes will do
        train2 = model(_append_item(batch, nxt))
        rows = torch.arange(len(lengths))
        for d in range(1, cfg.sid_levels):
            got = model.sid_logits_next(cache, nxt[:, None, :d], batch.request_surface, batch.request_action)[:, 0]
            torch.testing.assert_close(got, train2.sid_logits[d][rows, torch.tensor(lengths)], **TOL)


def _append_item(batch: ModelBatch, codes: torch.Tensor) -> ModelBatch:
    """``batch`` (no candidates) with one more item after each row's history, whose SID codes are ``codes``
    ``[B, L]`` and target the request's surface and action (its other inputs, copied from item 0, reach no
    SID logit of that item), and
    ``pos_lengths`` = the old lengths: the appended item sits where serving's next item does."""
    b, n = batch.actions.shape
    L = batch.lengths
    def put(t: torch.Tensor | None, v: torch.Tensor | None = None) -> torch.Tensor | None:
        if t is None:
            return None
        out = torch.cat([t, t[:, :1]], 1).clone()  # [B, n+1, ...]
        out[torch.arange(b), L] = t[:, 0] if v is None else v
        return out
    return ModelBatch(actions=put(batch.actions), surfaces=put(batch.surfaces, batch.request_surface),
                      lengths=L + 1, sid_codes=put(batch.sid_codes, codes), item_feats=put(batch.item_feats),
                      item_vecs=put(batch.item_vecs), action_mask=put(batch.action_mask),
                      target_actions=put(batch.target_actions, batch.request_action), pos_lengths=L)


def test_normalize_off_gives_raw_vectors() -> None:
    """normalize=False: the item and user vectors are not unit vectors (dot-product scoring), normalize=True they are."""
    for norm in (True, False):
        model = make_model(7, normalize=norm)
        batch = make_batch(model.config, [5, 3], 5, 0, 7)
        with torch.no_grad():
            out = model(batch)
            lens = torch.cat([out.item_vecs[out.item_valid].norm(dim=-1), out.user_vecs[out.item_valid].norm(dim=-1)])
        assert torch.allclose(lens, torch.ones_like(lens), atol=1e-5) == norm


def test_equivalence_check_is_sensitive() -> None:
    """The SID tokens do matter where they should: changing item m's level-1 code moves its level-2 logits."""
    model = make_model(0)
    batch = make_batch(model.config, [5], 5, 0, 0)
    with torch.no_grad():
        a = model(batch).sid_logits[1][0, 3]
        batch.sid_codes[0, 3, 0] = (batch.sid_codes[0, 3, 0] + 1) % model.config.sid_codebook_sizes[0]
        b = model(batch).sid_logits[1][0, 3]
    assert (a - b).abs().max() > 1e-4


def test_sid_beams_are_independent_rows() -> None:
    model = make_model(1)
    batch = make_batch(model.config, [4, 2], 4, 0, 1)
    with torch.no_grad():
        cache, _, _ = model.encode_history(batch)
        prefixes = torch.randint(0, 8, (2, 5, 2))
        all_w = model.sid_logits_next(cache, prefixes)
        one = model.sid_logits_next(cache, prefixes[:, 2:3])
    torch.testing.assert_close(all_w[:, 2], one[:, 0], **TOL)
    assert cache.n_tokens == 4  # beam steps never append to the shared cache


@pytest.mark.parametrize("layout", ["pinger", "dense", "hstu", "tiger"])
def test_prefill_plus_decode_equals_full_forward(layout: str) -> None:
    """Backbone level: prefill of items < m, append items >= m, then candidates == one full forward."""
    torch.manual_seed(3)
    cfg = ModelConfig.from_name("tiny", layout=layout)
    bb = Backbone(cfg).eval()
    lengths, n, k = torch.tensor([5, 3, 1]), 5, (0 if layout == "tiger" else 2)
    lay = build_layout(lengths, n, layout, cfg.sid_levels, k)
    x = torch.randn(3, lay.meta.shape[1], cfg.d_model)
    t = lay.tokens_per_item
    with torch.no_grad():
        full = bb(x, lay.meta, layout)
        for m in (1, 2, 4):
            cut = m * t
            sl = lambda a, b: type(lay.meta)(lay.meta.pos[:, a:b], lay.meta.kind[:, a:b], lay.meta.tok[:, a:b])  # noqa: E731
            cache, h1 = bb.prefill(x[:, :cut], sl(0, cut), layout)
            h2 = bb.decode(x[:, cut: n * t], sl(cut, n * t), cache, append=True)
            assert cache.n_tokens == n * t
            h3 = bb.decode(x[:, n * t:], sl(n * t, n * t + k), cache, append=False)
            assert cache.n_tokens == n * t
            got = torch.cat([h1, h2, h3], 1)
            real = lay.meta.kind != -2  # padding query rows are don't-care
            torch.testing.assert_close(got[real], full[real], **TOL)


@pytest.mark.parametrize("positions", ["start", "end"])
@pytest.mark.parametrize("layout", ["pinger", "dense", "hstu"])
def test_rank_and_user_vector_from_cache_equal_forward(layout: str, positions: str) -> None:
    model = make_model(4, layout=layout, target_condition=True, sid_fusion=layout != "hstu", positions=positions)
    batch = make_batch(model.config, [6, 3, 1], 6, 4, 4)
    with torch.no_grad():
        out = model(batch)
        cache, user, _ = model.encode_history(batch, batch.request_surface, batch.request_action)
        ranked = model.rank(cache, out.cand_vecs, batch.cand_sid_codes, batch.cand_surface)
        # candidates given as precomputed item vectors (the ANN index's stored vectors)
        vecs = model.item_vectors(batch.cand_feats)
        ranked2 = model.rank(cache, vecs, batch.cand_sid_codes, batch.cand_surface)
    torch.testing.assert_close(ranked, out.cand_action_logits, **TOL)
    torch.testing.assert_close(ranked2, out.cand_action_logits, **TOL)
    torch.testing.assert_close(user, out.next_user_vec, **TOL)


def test_tiger_cached_sid_decode_equals_forward() -> None:
    model = make_model(5, layout="tiger", sid_fusion=False)
    batch = make_batch(model.config, [4, 2, 3], 4, 0, 5)
    lengths = [4, 2, 3]
    with torch.no_grad():
        train = model(batch)
        for m in (1, 2, 3):
            rows = [b for b, ln in enumerate(lengths) if ln > m]
            cache, user, _ = model.encode_history(truncate(batch, m))
            assert user is None
            for d in range(3):
                got = model.sid_logits_next(cache, batch.sid_codes[:, m, :d][:, None])[:, 0]
                torch.testing.assert_close(got[rows], train.sid_logits[d][rows, m], **TOL)


def test_flex_model_forward_equals_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    monkeypatch.delenv("GENREC_ATTN", raising=False)
    model = make_model(6, attn_impl="reference")
    batch = make_batch(model.config, [4, 2], 4, 2, 6)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = model(batch)
        model.config.attn_impl = "flex"
        model.backbone.cfg.attn_impl = "flex"
        fx = model(batch)
    real = ref.layout.meta.kind != -2
    torch.testing.assert_close(fx.hidden[real], ref.hidden[real], atol=1e-5, rtol=1e-5)


def test_time_gap_inputs_cached_rank_equals_forward() -> None:
    model = make_model(7, time_buckets=8, target_condition=True)
    batch = make_batch(model.config, [5, 2, 3], 5, 3, 7)
    g = torch.Generator().manual_seed(7)
    batch.timestamps = torch.randint(0, 1000, (3, 5), generator=g).cumsum(1)
    batch.request_ts = batch.timestamps[:, -1] + 2  # bucket 1
    with torch.no_grad():
        out = model(batch)
        cache, _, _ = model.encode_history(batch)
        ranked = model.rank(cache, out.cand_vecs, batch.cand_sid_codes, batch.cand_surface, batch.request_ts)
        torch.testing.assert_close(ranked, out.cand_action_logits, **TOL)
        later = model.rank(cache, out.cand_vecs, batch.cand_sid_codes, batch.cand_surface, batch.request_ts + 100)  # bucket 6
    assert (later - ranked).abs().max() > 1e-5  # the candidates' time gap is an input
    with pytest.raises(ValueError, match="request_ts"):
        model.rank(cache, out.cand_vecs, batch.cand_sid_codes, batch.cand_surface)
    batch.timestamps = None
    with pytest.raises(ValueError, match="timestamps"):
        model(batch)


def test_kv_cache_expand_and_reset() -> None:
    model = make_model(8)
    batch = make_batch(model.config, [3, 2], 3, 0, 8)
    with torch.no_grad():
        cache, _, last = model.encode_history(batch)
    big = cache.expand(3)
    assert big.batch_size == 6 and big.n_tokens == cache.n_tokens
    torch.testing.assert_close(big.k[1][3:6], cache.k[1][1:2].expand(3, -1, -1, -1))
    torch.testing.assert_close(big.last_hidden[5], last[1])
    cache.reset()
    assert cache.n_tokens == 0 and cache.n_layers == 0
    with pytest.raises(ValueError, match="empty"):
        cache.expand(2)
    with pytest.raises(ValueError, match="encode_history"):
        model.sid_logits_next(cache, torch.zeros(2, 1, 1, dtype=torch.int64))


@pytest.mark.gpu
def test_compiled_flex_model_forward_equals_reference_on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENREC_ATTN", raising=False)
    model = make_model(9, attn_impl="reference").cuda()
    batch = make_batch(model.config, [6, 3, 1, 4], 6, 5, 9)
    for f in ("actions", "surfaces", "lengths", "sid_codes", "item_feats", "action_mask", "target_actions",
              "request_surface", "request_action", "cand_feats", "cand_sid_codes", "cand_surface"):
        setattr(batch, f, getattr(batch, f).cuda())
    with torch.no_grad():
        ref = model(batch)
        model.backbone.cfg.attn_impl = "flex"
        fx = model(batch)
        cache, user, _ = model.encode_history(batch, batch.request_surface, batch.request_action)
        ranked = model.rank(cache, fx.cand_vecs, batch.cand_sid_codes, batch.cand_surface)
    real = ref.layout.meta.kind != -2
    torch.testing.assert_close(fx.hidden[real], ref.hidden[real], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ranked, ref.cand_action_logits, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(user, ref.next_user_vec, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", ["tiger", "dense", "hstu"])
def test_gpu_fast_path_model_equals_reference(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole model of a token-causal layout with its attention on SDPA is_causal (the CUDA fast
    path, forced on here on the CPU) equals the explicit-mask reference: hidden states of every
    valid token and every parameter's gradient of a loss over them. With candidates after the
    history the explicit mask stays (a candidate is not causal)."""
    import genrec.model.backbone as backbone_mod
    from genrec.kernels.attention import CausalMask

    monkeypatch.delenv("GENREC_ATTN", raising=False)
    model = make_model(6, layout=layout, sid_fusion=layout != "hstu")
    batch = make_batch(model.config, [5, 2, 4], 5, 0, 6)
    seen: list[str] = []
    real_mask = Backbone._mask

    def spy(self, *a, **kw):
        m = real_mask(self, *a, **kw)
        seen.append(type(m).__name__)
        return m

    monkeypatch.setattr(Backbone, "_mask", spy)
    results = []
    for fast in (False, True):
        monkeypatch.setattr(backbone_mod, "gpu_fast_path", lambda impl, device, fast=fast: fast)
        model.zero_grad()
        out = model(batch)
        real = out.layout.meta.kind != -2  # padding query rows are don't-care
        w = torch.randn(out.hidden.shape, generator=torch.Generator().manual_seed(1))
        (out.hidden * w)[real].sum().backward()
        results.append((out.hidden.detach()[real], {n: p.grad.clone() for n, p in model.named_parameters()
                                                    if p.grad is not None}))
    assert seen == ["Tensor", "CausalMask"]
    (h_ref, g_ref), (h_fast, g_fast) = results
    torch.testing.assert_close(h_fast, h_ref, **TOL)
    assert g_ref.keys() == g_fast.keys() and g_ref
    for n in g_ref:
        torch.testing.assert_close(g_fast[n], g_ref[n], atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")
    if layout != "tiger":  # candidates: the explicit mask, fast path or not
        seen.clear()
        with torch.no_grad():
            model(make_batch(model.config, [5, 2, 4], 5, 3, 6))
        assert seen == ["Tensor"] and CausalMask.__name__ not in seen


@pytest.mark.parametrize("layout", ["pinger", "tiger", "dense", "hstu"])
def test_forward_and_encode_tell_the_mask_how_many_candidates(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attention switch counts candidates with a host sync when it is not told (n_cand None), and a
    sync cannot be captured in a CUDA graph (the serving encode is). The training forward and
    encode_history always tell it."""
    calls: list[int | None] = []
    real_mask = Backbone._mask

    def spy(self, q_meta, k_meta, lay, device, n_cand=None):
        if q_meta is k_meta:  # full forwards and prefills (decode steps never count)
            calls.append(n_cand)
        return real_mask(self, q_meta, k_meta, lay, device, n_cand)

    monkeypatch.setattr(Backbone, "_mask", spy)
    model = make_model(7, layout=layout, sid_fusion=layout != "hstu")
    k = 0 if layout == "tiger" else 2
    batch = make_batch(model.config, [4, 2], 4, k, 7)
    with torch.no_grad():
        model(batch)
        model.encode_history(truncate(batch, 4))
    assert calls == [k, 0]
