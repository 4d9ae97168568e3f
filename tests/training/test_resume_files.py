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


def test_val_curve_after_a_resume_has_each_validation_once(tmp_path, monkeypatch):
    """``OUT/val.jsonl`` (the loss curve reports read) of a killed and resumed run: one row per validation
    step, in order. A row written after the checkpoint the run resumes from (the run died between its
    validation and its save) is dropped and written again by the resumed run."""
    import json

    from quadforge.training.curves import read_val_curve

    real_train = imitation.train

    def train_then_tear(cfg, data, out, resume=False):
        if resume:   # the killed run validated step 8 and died before saving it
            with open(out / "val.jsonl", "a") as fh:
                fh.write(json.dumps({"step": 8, "loss": -1.0}) + "\n" + '{"step": 10, "lo')
        return real_train(cfg, data, out, resume=resume)
    monkeypatch.setattr(imitation, "train", train_then_tear)
    _killed_then_resumed(tmp_path, monkeypatch, _cfg())
    rows = read_val_curve(tmp_path)
    assert [r["step"] for r in rows] == [2, 4, 6, 8, 10, 12]
    assert all(r["loss"] >= 0 for r in rows)
    whole = read_val_curve(_whole_run(tmp_path / "whole"))
    assert [r["loss"] for r in whole] == pytest.approx([r["loss"] for r in rows])


def _whole_run(out):
    imitation.train(_cfg(), learnable_arrays(), out)
    return out


def test_train_from_python_refuses_a_folder_holding_a_run_unless_told(tmp_path):
    """A notebook's second ``train`` into the same folder would have replaced a finished run's checkpoints:
    refused before any work, as ``quadforge train`` refuses; ``overwrite=True`` replaces, ``resume=True``
    continues. The GeRM and VLA trainers check the same way, before they read their data."""
    from quadforge.training import qlearning, vla
    out = tmp_path / "run"
    first = imitation.train(_cfg(), learnable_arrays(), out)
    weights = (out / "last.pt").read_bytes()
    with pytest.raises(ValueError, match=r"out_dir .*already holds a training run.*resume=True.*overwrite=True"):
        imitation.train(_cfg(), learnable_arrays(), out)
    assert (out / "last.pt").read_bytes() == weights            # nothing lost
    again = imitation.train(_cfg(), learnable_arrays(), out, overwrite=True)
    assert again.step == first.step
    with pytest.raises(ValueError, match="contradict"):
        imitation.train(_cfg(), learnable_arrays(), out, resume=True, overwrite=True)
    for trainer, cfg in ((qlearning, qlearning.default_config("germ")), (vla, vla.default_config("rt1"))):
        with pytest.raises(ValueError, match=r"out_dir .*already holds a training run"):
            trainer.train(cfg, None, out)   # refused before the (missing) data is touched


def test_a_jobs_run_continues_from_its_last_checkpoint_and_a_finished_one_is_kept(tmp_path, monkeypatch):
    """``train_or_continue`` (reproduce's and dagger's runs): a run killed part-way continues from its last.pt
    to the uninterrupted run's weights (it was retrained from step 0); a finished one trains nothing and
    still names its checkpoint and last validation loss; an empty folder starts afresh."""
    whole = imitation.train_or_continue(_cfg(), learnable_arrays(), tmp_path / "whole")
    real = imitation.ImitationRun.loss_terms

    def dies(self, step):
        if step == KILL_AT:
            raise Killed
        return real(self, step)
    monkeypatch.setattr(imitation.ImitationRun, "loss_terms", dies)
    with pytest.raises(Killed):
        imitation.train_or_continue(_cfg(), learnable_arrays(), tmp_path / "cut")
    monkeypatch.setattr(imitation.ImitationRun, "loss_terms", real)
    continued = imitation.train_or_continue(_cfg(), learnable_arrays(), tmp_path / "cut")
    a, b = load_checkpoint(whole.checkpoint), load_checkpoint(continued.checkpoint)
    assert a.step == b.step == 12 and all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    again = imitation.train_or_continue(_cfg(), learnable_arrays(), tmp_path / "cut")   # nothing left to do
    assert again.checkpoint == tmp_path / "cut" / "last.pt" and again.history == []
    assert imitation.final_val_loss(again, tmp_path / "cut") == pytest.approx(imitation.final_val_loss(whole, tmp_path / "whole"))
