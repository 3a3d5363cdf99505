"""`genrec sid build --source model --from-run RUN`: SIDs quantised from a trained model's item vectors (those its
ANN index holds, learned ID vectors included); a run trained on other items is refused naming both runs; `sid
assign` codes new items with the model's content tower (no trained ID vector), and refuses a tower without one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from genrec.cli import app
from genrec.errors import ConfigError
from genrec.features.store import ItemVectors
from genrec.infer.load import find_checkpoint, load_model
from genrec.infer.recommender import Recommender
from genrec.model.config import ModelConfig
from genrec.model.genrec_model import GenRecModel
from genrec.recipes import pipeline as P
from genrec.recipes.model_sids import content_item_vectors
from genrec.recipes.training import train_run
from genrec.sid.build import build_sids, open_current
from genrec.sid.source import new_item_vectors, sid_input_vectors
from genrec.train.run import RunConfig
from genrec.workdir import WorkDir, read_json
from tests.tiny_run import write_string_id_log


@pytest.fixture(scope="module")
def id_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny trained run whose item tower adds learned ID vectors to the content MLP (~10 s)."""
    root = tmp_path_factory.mktemp("modelsid") / "run"
    src = root.parent / "run.csv"
    write_string_id_log(src)
    P.prepare(root, "generic", source=src)
    ids = np.asarray(P.open_store(root).read_items().column("item_id").to_numpy(), dtype=np.int64)
    rng = np.random.default_rng(1)
    ItemVectors(ids, rng.normal(size=(len(ids), 12)).astype(np.float32),
                rng.normal(size=(len(ids), 12)).astype(np.float32)).save(WorkDir(root).features)
    P.build_semantic_ids(root, levels=2, codebook_size=8)
    train_run(root, RunConfig.from_name("cpu-tiny", ["train.total_steps=4", "train.ckpt_every=4", "data.valid_cases=8",
                                                     "data.context_len=12", "model.id_embedding=true"]))
    return root


def _linked(run: Path, dest: Path) -> Path:
    """A run directory holding ``run``'s tables and features (links), no SIDs yet."""
    dest.mkdir(parents=True)
    for part in ("tables", "features"):
        (dest / part).symlink_to(run / part)
    return dest


def _json(output: str) -> dict:
    return json.loads(output[output.index("{"):output.rindex("}") + 1])


def _build(wd: Path, run: Path, *extra: str) -> object:
    return CliRunner().invoke(app, ["sid", "build", str(wd), "--source", "model", "--from-run", str(run),
                                    "--levels", "2", "--codebook-size", "4", *extra])


def test_model_source_quantises_the_ann_paths_item_vectors(id_run: Path, tmp_path: Path) -> None:
    wd = _linked(id_run, tmp_path / "wd")
    r = _build(wd, id_run)
    assert r.exit_code == 0, r.output
    assert _json(r.output)["source"] == "model"
    sb = open_current(wd / "sid")
    ckpt = find_checkpoint(id_run).resolve()
    inputs = read_json(sb.path / "manifest.json")["inputs"]
    assert inputs["source"] == "model" and inputs["run"] == str(id_run.resolve())
    assert inputs["checkpoint"] == str(ckpt) and sb.stats["source"]["used"] == "model"
    assert sb.stats["source"]["checkpoint"] == str(ckpt)

    # the ANN path's vectors, by the served model; and independently, the item tower on the features
    rec = Recommender.from_checkpoint(id_run)
    vecs = ItemVectors.load(wd / "features")
    ids = np.array(vecs.item_ids, dtype=np.int64)
    cat = {int(i): k for k, i in enumerate(np.asarray(rec.catalog.item_ids))}
    ann = rec.item_vecs.numpy()[[cat[int(i)] for i in ids]]
    with torch.no_grad():
        by_hand = rec.model.item_vectors(torch.from_numpy(vecs.concat()), torch.from_numpy(ids)).numpy()
        content_only = rec.model.item_vectors(torch.from_numpy(vecs.concat())).numpy()
    np.testing.assert_allclose(ann, by_hand, atol=1e-6)
    assert not np.allclose(ann, content_only, atol=1e-3)  # the learned ID vectors are part of them
    assert sb.quantizer.dim == rec.model.config.item_dim != vecs.content.shape[1]
    # the same quantiser on those vectors gives the same codes: they are what the build quantised
    store = P.open_store(wd)
    ref = build_sids(ann, ids, tmp_path / "ref", levels=2, codebook_size=4,
                     popularity=P.train_item_counts(store, P.default_split(store), ids))  # sid build's default
    np.testing.assert_array_equal(np.asarray(sb.item_ids), np.asarray(ref.item_ids))
    np.testing.assert_array_equal(np.asarray(sb.codes), np.asarray(ref.codes))


def test_a_run_trained_on_other_items_is_refused_naming_both(id_run: Path, tmp_path: Path) -> None:
    wd = tmp_path / "other"
    v = ItemVectors.load(id_run / "features")
    rng = np.random.default_rng(2)
    ids = np.append(np.asarray(v.item_ids), 987654)
    ItemVectors(ids, rng.normal(size=(len(ids), 12)).astype(np.float32),
                rng.normal(size=(len(ids), 12)).astype(np.float32)).save(WorkDir(wd).features)
    r = _build(wd, id_run)
    assert r.exit_code == 2, r.output
    msg = " ".join(r.output.split())
    assert "item 987654" in msg and str(wd) in msg and f"catalogue of {id_run}" in msg, msg
    assert not (wd / "sid" / "CURRENT").exists()
    for args, says in ((["--source", "model"], "needs --from-run"),
                       (["--source", "content", "--from-run", str(id_run)], "only with --source model")):
        r = CliRunner().invoke(app, ["sid", "build", str(wd), *args])
        assert r.exit_code == 2 and says in r.output, r.output


def test_sid_assign_codes_new_items_with_the_models_content_tower(id_run: Path, tmp_path: Path) -> None:
    wd = _linked(id_run, tmp_path / "wd")
    assert _build(wd, id_run).exit_code == 0
    v0 = open_current(wd / "sid")
    model, _ = load_model(find_checkpoint(id_run))
    assert model.item_encoder.mlp is not None
    rng = np.random.default_rng(3)
    new = tmp_path / "new"
    new.mkdir()
    for round_, new_ids in enumerate((np.array([10_001, 10_002, 10_003]), np.array([10_004]))):
        content = rng.normal(size=(len(new_ids), 12)).astype(np.float32)
        np.save(new / "vectors.npy", content)
        np.save(new / "item_ids.npy", new_ids)
        r = CliRunner().invoke(app, ["sid", "assign", str(wd), "--vectors", str(new / "vectors.npy")])
        assert r.exit_code == 0, r.output  # (round 2: the version made by round 1 keeps the model recipe)
        assert _json(r.output)["new_items"] == len(new_ids)
        sb = open_current(wd / "sid")
        # by hand: the content MLP on [content ‖ 0 engagement], normalised as the tower does; no ID vector
        with torch.no_grad():
            x = model.item_encoder.mlp(torch.from_numpy(np.concatenate([content, np.zeros_like(content)], 1)))
            x = F.normalize(x, dim=-1) if model.item_encoder.normalize else x
        want = v0.quantizer.encode(x.numpy())
        np.testing.assert_array_equal(np.asarray(sb.index.codes_of(new_ids))[:, :-1], want)
        assert read_json(sb.path / "manifest.json")["inputs"]["source"] == "model", round_
    with pytest.raises(ConfigError, match="trained run"):
        new_item_vectors(sb.path, content, v0.quantizer.dim)  # the sid layer alone cannot make them


def test_a_tower_without_content_cannot_code_new_items() -> None:
    model = GenRecModel(ModelConfig(item_content=False, item_id_vocab=8, item_feat_dim=6))
    with pytest.raises(ConfigError, match="no content MLP"):
        content_item_vectors(model, np.ones((2, 3), np.float32), np.array([1, 2]))
    with pytest.raises(ConfigError, match="trained run's item vectors"):
        sid_input_vectors(np.ones((2, 3), np.float32), None, "model")


def test_sid_build_help_lists_the_model_source() -> None:
    r = CliRunner().invoke(app, ["sid", "build", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "model" in r.output and "--from-run" in r.output and "--checkpoint" in r.output
