"""Variants by configuration, same code: every variant trains a few steps on real data, and
the frozen-item-encoder fine-tune really leaves the item encoder (= the deployed ANN vectors)
untouched while the rest of the model moves."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from genrec.errors import ConfigError
from genrec.recipes.training import train_run
from genrec.train.checkpoint import resolve_checkpoint
from genrec.train.run import RunConfig


def _weights(run_dir):  # noqa: ANN001, ANN202
    ck = resolve_checkpoint(run_dir / "checkpoints")
    return dict(load_file(str(ck / "model.safetensors")))


@pytest.mark.parametrize("variant", ["tiger", "sasrec", "dense", "no-fusion", "ranking-only", "hstu"])
def test_every_variant_trains(fork, variant):  # noqa: ANN001
    wd = fork(variant)
    res = train_run(wd, RunConfig.from_name("cpu-tiny", [f"variant={variant}", "train.total_steps=3",
                                                         "data.valid_cases=16"]), resume=False)
    assert res["step"] == 3 and res["last_loss"]["loss"] == res["last_loss"]["loss"]  # finite
    if variant in ("tiger", "dense"):  # the library's defaults serve every stage the model has (audit: a TIGER
        from genrec.infer.recommender import Recommender  # model refused recommend() without sources)

        rec = Recommender.from_checkpoint(wd)
        got = rec.recommend([1, 50, 172], k=4)
        assert len(got) == 4
        assert {s for r in got for s in r.sources} <= ({"sid"} if variant == "tiger" else {"ann"})


def test_dense_model_trains_without_sids_and_with_neighbour_negatives(prepared):  # noqa: ANN001
    """A run directory with no SIDs at all trains the dense variant (SID fusion has nothing to fuse: off, where it
    used to fail mid-step on the batch's missing codes), here with the ranking rows' negatives drawn from the
    engagement neighbours."""
    wd = prepared.parent / f"{prepared.name}-nosid"
    wd.mkdir(exist_ok=True)
    for part in ("tables", "features"):
        if not (wd / part).exists():
            (wd / part).symlink_to(prepared / part)
    res = train_run(wd, RunConfig.from_name("cpu-tiny", ["variant=dense", "train.total_steps=3", "data.valid_cases=16",
                                                         "data.neg_sampling=neighbours", "data.p_rank=1.0"]),
                    resume=False)
    assert res["step"] == 3 and math.isfinite(res["last_loss"]["loss"]) and res["last_loss"].get("action", 0) > 0
    with pytest.raises(ConfigError, match="neg_sampling"):
        train_run(wd, RunConfig.from_name("cpu-tiny", ["variant=dense", "data.neg_sampling=nearby"]), resume=False)


def test_frozen_finetune_keeps_the_item_encoder(fork):  # noqa: ANN001
    base = fork("retrieval")
    train_run(base, RunConfig.from_name("cpu-tiny", ["variant=dense", "objective.w_action=0",
                                                     "train.total_steps=4", "data.valid_cases=16"]), resume=False)
    with pytest.raises(ConfigError, match="init_from"):
        train_run(fork("ft-bad"), RunConfig.from_name("cpu-tiny", ["variant=frozen-ft"]), resume=False)
    ft = fork("ft")
    train_run(ft, RunConfig.from_name("cpu-tiny", ["variant=frozen-ft", f"init_from={base / 'checkpoints'}",
                                                   "train.total_steps=4",
                                                   "data.valid_cases=16"]), resume=False)
    w0, w1 = _weights(base), _weights(ft)
    enc = [k for k in w0 if ".item_encoder." in k or k.startswith("item_encoder.")]
    assert enc
    for k in enc:
        assert torch.equal(w0[k], w1[k]), k
    moved = [k for k in w0 if k not in enc and k in w1 and w0[k].shape == w1[k].shape and not torch.equal(w0[k], w1[k])]
    assert moved  # the backbone and heads did train


def test_real_model_resume_reproduces_the_uninterrupted_run(fork):  # noqa: ANN001
    """genrec's own model + objective (sketch state, MAM masks, sampled negatives, dropout):
    4 steps, stop, resume to 8 == 8 steps straight, to float tolerance."""
    # constant LR after warm-up: the schedule follows total_steps, which the "crashed" run sets to 4
    over = ["train.total_steps=8", "train.ckpt_every=4", "data.valid_cases=16", "train.decay=constant"]
    straight = train_run(fork("straight"), RunConfig.from_name("cpu-tiny", over), resume=False)
    wd = fork("resumed")
    train_run(wd, RunConfig.from_name("cpu-tiny", ["train.total_steps=4", "train.ckpt_every=4",
                                                   "data.valid_cases=16", "train.decay=constant"]), resume=False)
    resumed = train_run(wd, RunConfig.from_name("cpu-tiny", over), resume=True)
    a, b = straight["last_loss"], resumed["last_loss"]
    assert a["step"] == b["step"] == 8
    for key in ("loss", "sid", "item", "action"):
        assert abs(a[key] - b[key]) <= 1e-6 * max(1.0, abs(a[key])), (key, a[key], b[key])


def test_id_embedding_run_serves_the_trained_vectors(fork):  # noqa: ANN001
    """``model.id_embedding=true``: the checkpoint carries the id keys (the items the training
    split shows); serving rebuilds the same catalogue vectors, and items the training split never
    showed have their content vector only."""
    import numpy as np
    import torch.nn.functional as F

    from genrec.infer.recommender import Recommender

    wd = fork("ids")
    train_run(wd, RunConfig.from_name("cpu-tiny", ["variant=sasrec", "model.id_embedding=true",
                                                   "train.total_steps=4", "data.valid_cases=16"]), resume=False)
    rec = Recommender.from_checkpoint(wd, "LATEST")
    enc = rec.model.item_encoder
    assert enc.id_emb is not None
    keys = enc.id_keys[enc.id_keys < torch.iinfo(torch.int64).max].numpy()
    ids = rec.catalog.item_ids
    known = np.isin(ids, keys)
    assert 0.5 * len(ids) < known.sum() <= len(ids)
    w = _weights(wd)
    assert torch.equal(w["model.item_encoder.id_keys"], enc.id_keys)
    with torch.no_grad():
        content = F.normalize(enc.mlp(rec.catalog_model.feats), dim=-1)
        assert torch.allclose(rec.item_vecs[~torch.from_numpy(known)], content[~torch.from_numpy(known)], atol=1e-6)
        assert not torch.allclose(rec.item_vecs[torch.from_numpy(known)], content[torch.from_numpy(known)], atol=1e-3)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_training_run_checkpoints_plain_weights(fork, monkeypatch, capsys, mode):  # noqa: ANN001
    """``train.compile=true`` through ``train_run``: the compiled model trains, evaluates and
    checkpoints; the weights load into a plain (uncompiled) model with the same keys; ``train.compile_mode``
    reaches torch.compile. Dynamo + AOTAutograd without code generation (``aot_eager``) keeps it fast on a
    CPU; the GPU tests (here and in tests/train/test_compile.py) run inductor and its CUDA graphs."""
    from genrec.model.genrec_model import GenRecModel

    calls = []
    plain_compile = GenRecModel.compile

    def spy(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(k)
        return plain_compile(self, backend="aot_eager")

    monkeypatch.setattr(GenRecModel, "compile", spy)
    torch._dynamo.reset()
    wd = fork(f"compiled-{mode}")
    res = train_run(wd, RunConfig.from_name("cpu-tiny", ["variant=pinger", "train.compile=true", "train.total_steps=3",
                                                        "data.valid_cases=16", f"train.compile_mode={mode}"]),
                    resume=False)
    from torch._inductor import list_mode_options

    assert len(calls) == 1 and calls[0].get("options", {}).items() >= list_mode_options(mode).items(), calls
    assert res["step"] == 3 and res["last_loss"]["loss"] == res["last_loss"]["loss"]
    assert f"train.compile=true (mode {mode})" in capsys.readouterr().err  # the user is told why the first steps are slow
    keys = set(_weights(wd))
    assert keys and not any("_orig_mod" in k for k in keys)


def test_unknown_compile_mode_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="compile_mode"):
        RunConfig.from_name("cpu-tiny", ["train.compile=true", "train.compile_mode=fastest"])
    assert RunConfig.from_name("gpu-base", ["train.compile_mode=default"]).train.compile_mode == "default"


def test_gpu_base_records_cuda_graphs_and_compile_false_still_turns_compiling_off(fork, monkeypatch, capsys):  # noqa: ANN001
    """gpu-base compiles with CUDA graphs by default; ``train.compile=false`` alone runs it eager (its
    mode then has nothing to apply to, and the run says so) -- no second override needed."""
    from genrec.model.genrec_model import GenRecModel

    assert RunConfig.from_name("gpu-base").train.compile_mode == "reduce-overhead"
    cfg = RunConfig.from_name("cpu-tiny", ["train.compile_mode=reduce-overhead", "train.total_steps=2", "data.valid_cases=8"])
    assert cfg.train.compile is False
    calls = []
    monkeypatch.setattr(GenRecModel, "compile", lambda self, *a, **k: calls.append(k))
    res = train_run(fork("idle-mode"), cfg, resume=False)
    assert res["step"] == 2 and calls == []
    assert "train.compile_mode=reduce-overhead is not used: train.compile=false" in capsys.readouterr().err


@pytest.mark.gpu
def test_cuda_graph_compile_mode_trains_like_the_default_mode(fork):  # noqa: ANN001
    """``train.compile_mode=reduce-overhead`` on the GPU: the trainer marks each step for the recorded CUDA graphs
    and copies its logged scalars out of graph memory. The run must log the same losses, step by step, as the
    same run compiled without graphs (same kernels, same seed), and finish its evaluation and checkpoint."""
    import json

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    logs = {}
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        wd = fork(f"gpu-{mode}")
        res = train_run(wd, RunConfig.from_name("cpu-tiny", [
            "variant=pinger", "train.device=cuda", "train.bf16=true", "train.compile=true", f"train.compile_mode={mode}",
            "train.total_steps=8", "train.log_every=1", "data.valid_cases=16"]), resume=False)
        assert res["step"] == 8
        logs[mode] = [json.loads(x)["loss"] for x in (wd / "train_log.jsonl").read_text().splitlines()]
        assert (wd / "checkpoints").exists()
    assert len(logs["default"]) == len(logs["reduce-overhead"]) == 8
    for a, b in zip(logs["default"], logs["reduce-overhead"]):
        assert abs(a - b) <= 2e-3 * max(1.0, abs(a)), logs
    assert logs["default"][0] != logs["default"][-1]  # it trained


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_missing_cuda_fails_before_reading_data(tmp_path):  # noqa: ANN001
    with pytest.raises(ConfigError, match="no CUDA device"):  # the workdir does not exist: never opened
        train_run(tmp_path / "absent", RunConfig.from_name("cpu-tiny", ["train.device=cuda"]))


def test_weight_average_is_what_the_run_evaluates_and_serves(fork):  # noqa: ANN001
    """train.ema_decay: the run's final validation is of the averaged weights (the ones the checkpoint
    serves), the same numbers as the trainer's own last evaluation, and the live weights sit beside them."""
    import json

    wd = fork("ema")
    res = train_run(wd, RunConfig.from_name("cpu-tiny", ["train.total_steps=6", "train.ema_decay=0.9",
                                                         "data.valid_cases=64"]), resume=False)
    last = json.loads((wd / "eval_log.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 6
    assert res["valid"] == {k: v for k, v in last.items() if k.startswith("valid/")}
    ck = resolve_checkpoint(wd / "checkpoints")
    served, live = load_file(str(ck / "model.safetensors")), load_file(str(ck / "train_model.safetensors"))
    assert served.keys() == live.keys()
    assert any(not torch.equal(served[k], live[k]) for k in served)


@pytest.mark.gpu
def test_gpu_base_trains_compiled_on_amazon_beauty(tmp_path, datasets_root):  # noqa: ANN001
    """The gpu-base preset as a user runs it on Amazon Beauty: histories of 1-50 items, so the batches change
    shape and dynamo recompiles with a dynamic length. On torch 2.11 inductor's compiled backward failed there
    (the twenty-sixth session: "shape '[1728, 256]' is invalid", pytorch/pytorch#178080) until genrec's compile
    options turned mixed-order reduction off; MovieLens 100K's near-full batches never reached it."""
    import json

    from genrec.recipes import pipeline

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pipeline.prepare(tmp_path, "amazon-beauty-2014", data_dir=datasets_root, n_buckets=4)
    pipeline.build_item_features(tmp_path)
    pipeline.build_semantic_ids(tmp_path)
    torch._dynamo.reset()
    res = train_run(tmp_path, RunConfig.from_name("gpu-base", [
        "train.total_steps=60", "train.log_every=10", "train.eval_every=0", "train.ckpt_every=0",
        "train.progress=off", "train.tensorboard=false", "data.valid_cases=200"]), resume=False)
    assert res["step"] == 60
    losses = [json.loads(x)["loss"] for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses), losses


def test_training_evaluates_the_served_sid_stage_and_can_stop_on_it(fork):  # noqa: ANN001
    """The SID stage served by default is the dense leaf ("sid-dense"): the training evaluation reports it beside the
    SID head's own leaf, and early stopping can pick the BEST checkpoint on it."""
    import json

    wd = fork("stop-sid-dense")
    res = train_run(wd, RunConfig.from_name("cpu-tiny", ["train.total_steps=6", "train.eval_every=2",
                                                         "data.valid_cases=32", "train.early_stopping.patience=0",
                                                         "train.early_stopping.metric=valid/sid-dense/recall@10"]),
                    resume=False)
    rows = [json.loads(ln) for ln in (wd / "eval_log.jsonl").read_text().splitlines() if ln.strip()]
    rows = [r for r in rows if "valid/sid-dense/recall@10" in r]
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert all("valid/sid/recall@10" in r and "valid/ann/recall@10" in r for r in rows)
    vals = [r["valid/sid-dense/recall@10"] for r in rows]
    assert res["best_step"] == rows[vals.index(max(vals))]["step"]
