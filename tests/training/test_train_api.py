"""The trainers' Python entry points take the same data and out arguments (docs/training.md): a store
path, an open store or in-memory episodes, and out_dir=None for a run that writes no files."""
from __future__ import annotations

import pytest
import torch

from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic_store import write_synthetic_store
from quadforge.models.checkpoint import load_checkpoint
from quadforge.training import imitation, qlearning, vla
from quadforge.training.presets import preset
from quadforge.training.vla_data import ColourChoiceTask

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("api") / "store"
    write_synthetic_store(root, 400, episode_length=50)
    return root


def _germ_cfg():
    cfg = qlearning.default_config("germ")
    cfg.model.d_model, cfg.model.num_layers, cfg.model.num_heads, cfg.model.ffn_hidden = 16, 1, 2, 16
    cfg.model.num_experts, cfg.model.context = 4, 2
    cfg.max_steps, cfg.batch_size, cfg.val_every, cfg.log_every, cfg.tensorboard = 2, 8, 2, 1, False
    return cfg


def test_germ_trains_on_a_store_path_as_imitation_does(store, tmp_path):
    """qlearning.train(cfg, "path", out) was 'sampler source must be EpisodeArrays or a TrajectoryStore, got str'."""
    summary = qlearning.train(_germ_cfg(), str(store), tmp_path / "run")
    ckpt = load_checkpoint(summary["checkpoint"])
    assert ckpt.provenance["data"] == str(store.resolve()) and ckpt.provenance["robot"] == "go1"
    with pytest.raises(FileNotFoundError, match="--store .*nowhere: no trajectory store there"):
        qlearning.train(_germ_cfg(), tmp_path / "nowhere", tmp_path / "run2")


def test_germ_runs_without_an_out_dir(store, tmp_path):
    """out=None was a pathlib TypeError; now no files, as imitation.train(cfg, data, None)."""
    summary = qlearning.train(_germ_cfg(), TrajectoryStore.open(store), None)
    assert summary["checkpoint"] is None and len(summary["history"]) == 2
    with pytest.raises(ValueError, match="resume=True needs out_dir"):
        qlearning.train(_germ_cfg(), str(store), None, resume=True)


def test_vla_runs_without_an_out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = vla.default_config("rt1")
    cfg.model.update(history=2, d_model=16, tokens_per_frame=4, token_hidden=8, num_layers=1, num_heads=2,
                     ffn_hidden=16, word_dim=16, image=dict(stem_channels=8, stages=((8, 2, 1),), expand_ratio=2))
    cfg.max_steps, cfg.batch_size, cfg.log_every, cfg.val_every, cfg.tensorboard = 2, 4, 1, 2, False
    summary = vla.train(cfg, ColourChoiceTask(image_size=16, history=2, seed=0), None)
    assert summary["checkpoint"] is None and len(summary["history"]) == 2
    assert list(tmp_path.iterdir()) == []


def test_imitation_takes_the_same_arguments(store):
    cfg = preset("mlp", "cpu")
    cfg.max_steps, cfg.batch_size, cfg.val_every, cfg.tensorboard = 2, 8, 2, False
    result = imitation.train(cfg, str(store), None)
    assert isinstance(result, imitation.TrainResult) and result.checkpoint is None and result.step == 2
