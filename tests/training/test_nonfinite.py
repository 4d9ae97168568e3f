"""A NaN in the data or the loss stops a training with a one-line error naming it, and never overwrites the
last good checkpoint with NaN weights (one NaN in dof_pos used to 'train' to NaN weights, no error)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from quadforge.data.episodes import EpisodeArrays
from quadforge.models.checkpoint import load_checkpoint
from quadforge.training import imitation, qlearning
from quadforge.training.loop import NonFiniteLoss
from quadforge.training.presets import preset

from imitation_data import learnable_arrays

torch.set_num_threads(1)


def _germ_arrays() -> EpisodeArrays:
    data = learnable_arrays()
    data.features["terminated"] = np.zeros(data.num_steps, bool)
    return data


def _with_nan(feature: str = "dof_pos", episode: int = 3) -> EpisodeArrays:
    data = _germ_arrays()
    data.episode_info["episode_id"] = np.array([f"c0-{i:08d}" for i in range(data.num_episodes)])
    data.features[feature][data.episode_starts[episode] + 2, 5] = np.nan
    return data


def _imitation_cfg(**kw):
    cfg = preset("mlp", "cpu")
    cfg.max_steps, cfg.batch_size, cfg.val_every, cfg.log_every, cfg.val_fraction, cfg.tensorboard = 6, 16, 2, 1, 0.0, False
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


@pytest.mark.parametrize("feature,kind", [("dof_pos", "observation"), ("actions", "action")])
def test_imitation_refuses_non_finite_stats_naming_feature_and_episode(tmp_path, feature, kind):
    with pytest.raises(ValueError, match=rf"WindowSampler: the {kind} statistics are not finite: feature\(s\) "
                                         rf"\['{feature}'\] hold NaN or inf in episode\(s\) \['c0-00000003'\]"):
        imitation.train(_imitation_cfg(), _with_nan(feature), tmp_path / "run")
    assert not (tmp_path / "run" / "last.pt").exists()


def test_germ_refuses_non_finite_stats(tmp_path):
    cfg = qlearning.default_config("germ")
    cfg.max_steps, cfg.batch_size, cfg.tensorboard = 2, 8, False
    with pytest.raises(ValueError, match=r"TransitionSampler: the observation statistics are not finite: "
                                         r"feature\(s\) \['dof_pos'\].*\['c0-00000003'\]"):
        qlearning.train(cfg, _with_nan(), tmp_path / "run")


def _nan_from(step_bad: int, original):
    def loss_terms(self, step):
        terms = original(self, step)
        return {**terms, "loss": terms["loss"] * float("nan")} if step + 1 >= step_bad else terms
    return loss_terms


def test_imitation_stops_at_the_first_nan_loss_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    """Validation (and last.pt) every 2 steps; the loss turns NaN at step 5: the run stops there, last.pt is
    step 4's with finite weights, and the run lock is free for the rerun."""
    monkeypatch.setattr(imitation.ImitationRun, "loss_terms", _nan_from(5, imitation.ImitationRun.loss_terms))
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLoss, match=rf"train mlp: the training loss is not finite from step 5 on \(at step 5: "
                                            rf"loss=nan\); stopped before saving: the last good checkpoint, "
                                            rf".*last.pt \(step 4\), is kept"):
        imitation.train(_imitation_cfg(), learnable_arrays(), out)
    ckpt = load_checkpoint(out / "last.pt")
    assert ckpt.step == 4 and all(torch.isfinite(v).all() for v in ckpt.state_dict.values())
    monkeypatch.undo()
    assert imitation.train(_imitation_cfg(), learnable_arrays(), out, resume=True).step == 6
    # a resumed run that turns NaN before its first save names the checkpoint it resumed from, kept
    monkeypatch.setattr(imitation.ImitationRun, "loss_terms", _nan_from(7, imitation.ImitationRun.loss_terms))
    with pytest.raises(NonFiniteLoss, match=r"not finite from step 7 on .*: the checkpoint it resumed from \(step 6\) "
                                            r"is kept"):
        imitation.train(_imitation_cfg(max_steps=8), learnable_arrays(), out, resume=True)
    assert load_checkpoint(out / "last.pt").step == 6


def test_germ_stops_at_the_first_nan_loss(tmp_path, monkeypatch):
    monkeypatch.setattr(qlearning.GeRMRun, "loss_terms", _nan_from(3, qlearning.GeRMRun.loss_terms))
    cfg = qlearning.default_config("germ")
    cfg.max_steps, cfg.batch_size, cfg.val_every, cfg.log_every, cfg.tensorboard = 4, 8, 2, 1, False
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLoss, match=r"train germ: the training loss is not finite from step 3 on .*\(step 2\), is kept"):
        qlearning.train(cfg, _germ_arrays(), out)
    ckpt = load_checkpoint(out / "last.pt")
    assert ckpt.step == 2 and all(torch.isfinite(v).all() for v in ckpt.state_dict.values() if v.is_floating_point())


def test_the_loss_is_read_only_at_log_rows_and_the_first_bad_step_is_still_named(tmp_path, monkeypatch):
    """No host read of the loss each step (a GPU's queue keeps going): a NaN from step 3 is found at the
    step-4 log row, named as step 3, and stops the run before step 4's last.pt (step 2's is kept)."""
    monkeypatch.setattr(imitation.ImitationRun, "loss_terms", _nan_from(3, imitation.ImitationRun.loss_terms))
    out = tmp_path / "run"
    with pytest.raises(NonFiniteLoss, match=r"not finite from step 3 on \(at step 4: loss=nan\); stopped before "
                                            r"saving: .*\(step 2\), is kept"):
        imitation.train(_imitation_cfg(max_steps=8, log_every=2, val_every=2), learnable_arrays(), out)
    assert load_checkpoint(out / "last.pt").step == 2
