"""A resumed run writes what the uninterrupted run writes (issue 27): ``best.pt`` keeps the best
validation step from before the kill, and TensorBoard shows every logged step once."""
import pytest
import torch

from quadforge.models.checkpoint import load_checkpoint
from quadforge.training import imitation
from quadforge.training.presets import preset

from imitation_data import learnable_arrays

torch.set_num_threads(1)
KILL_AT = 7   # the run dies drawing the batch of its 8th step (index 7): its last.pt is step 6's (val_every 2)


class Killed(Exception):
    pass


def _cfg(tensorboard=False):
    cfg = preset("mlp", "cpu")
    cfg.batch_size, cfg.context, cfg.max_steps, cfg.val_every, cfg.log_every = 8, 8, 12, 2, 1
    cfg.model_config, cfg.tensorboard, cfg.checkpoint_every_s = dict(hidden=16, decoder_hidden=16), tensorboard, 0
    return cfg


def _killed_then_resumed(out, monkeypatch, cfg):
    real = imitation.ImitationRun.loss_terms

    def dies(self, step):
        if step == KILL_AT:
            self.log.close()   # what had reached the disk when the process died
            raise Killed
        return real(self, step)
    monkeypatch.setattr(imitation.ImitationRun, "loss_terms", dies)
    with pytest.raises(Killed):
        imitation.train(cfg, learnable_arrays(), out)
    assert load_checkpoint(out / "last.pt").step == 6
    monkeypatch.setattr(imitation.ImitationRun, "loss_terms", real)
    return imitation.train(cfg, learnable_arrays(), out, resume=True)


def test_best_checkpoint_of_a_resumed_run_is_the_uninterrupted_runs(tmp_path, monkeypatch):
    # validation losses by validation (steps 2, 4, ..., 12): the best is step 4's, and step 8's (the
    # first after the resume) beats nothing the run had seen - a resume that forgot the best would take it
    scripted = [0.5, 0.3, 0.4, 0.35, 0.6, 0.7]
    for name in ("whole", "resumed"):
        calls = iter(scripted)
        monkeypatch.setattr(imitation, "_validate", lambda objective, batches, to_inputs: next(calls))
        if name == "whole":
            imitation.train(_cfg(), learnable_arrays(), tmp_path / name)
        else:
            _killed_then_resumed(tmp_path / name, monkeypatch, _cfg())
    whole, resumed = load_checkpoint(tmp_path / "whole" / "best.pt"), load_checkpoint(tmp_path / "resumed" / "best.pt")
    assert whole.step == resumed.step == 4
    assert all(torch.equal(whole.state_dict[k], resumed.state_dict[k]) for k in whole.state_dict)
    assert load_checkpoint(tmp_path / "resumed" / "last.pt").extra["best_val"] == 0.3


def test_tensorboard_after_a_resume_has_each_step_once(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    _killed_then_resumed(tmp_path, monkeypatch, _cfg(tensorboard=True))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    steps = [e.step for e in events.Scalars("train/loss")]
    assert steps == list(range(1, 13))
