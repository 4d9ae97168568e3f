"""bf16 autocast (``amp=bf16`` / ``--amp bf16``): off by default; on, every trainer's forward runs in
bf16 (measured on the CPU here: the loss it logs is a bf16 result and training still reduces it), the
weights and optimizer state stay float32, and a bad value is a one-line error."""
import pytest
import torch

from quadforge.training.loop import autocast
from quadforge.training.presets import preset

from imitation_data import learnable_arrays
from test_device_placement import SMALL, VLA_TINY

torch.set_num_threads(1)


def test_autocast_is_bf16_only_when_asked():
    x = torch.randn(4, 4)
    with autocast(torch.device("cpu"), "bf16"):
        assert (x @ x).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "off"):
        assert (x @ x).dtype == torch.float32
    with pytest.raises(ValueError, match="amp='fp8' unknown; allowed"):
        autocast(torch.device("cpu"), "fp8")


def _bf16_loss_seen(monkeypatch):
    """Record the output dtype of every ``nn.Linear`` run inside a training step's ``loss_terms`` (the
    forward the option puts under autocast; validation is not recorded)."""
    from torch import nn

    from quadforge.training import loop
    seen, inside = [], [False]
    linear, run = nn.Linear.forward, loop.TrainLoop.run

    def recording_linear(self, x):
        y = linear(self, x)
        if inside[0]:
            seen.append(y.dtype)
        return y

    def recording_run(self, start):
        terms_of = self.loss_terms

        def loss_terms(step):
            inside[0] = True
            try:
                return terms_of(step)
            finally:
                inside[0] = False
        self.loss_terms = loss_terms
        return run(self, start)
    monkeypatch.setattr(nn.Linear, "forward", recording_linear)
    monkeypatch.setattr(loop.TrainLoop, "run", recording_run)
    return seen


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_imitation_trains_under_bf16(amp, tmp_path, monkeypatch):
    from quadforge.training.imitation import train
    seen = _bf16_loss_seen(monkeypatch)
    cfg = preset("transformer", "cpu")
    cfg.batch_size, cfg.context, cfg.max_steps, cfg.val_every, cfg.log_every = 16, 8, 12, 12, 1
    cfg.model_config, cfg.amp, cfg.tensorboard = SMALL["transformer"], amp, False
    result = train(cfg, learnable_arrays(), tmp_path)
    assert set(seen) == {torch.bfloat16 if amp == "bf16" else torch.float32}
    assert all(p.dtype == torch.float32 for p in result.model.parameters())
    losses = [row["loss"] for row in result.history]
    assert losses[-1] < losses[0]


def test_germ_and_vla_train_under_bf16(tmp_path, monkeypatch):
    from quadforge.training import qlearning, vla
    from quadforge.training.vla_data import ColourChoiceTask
    seen = _bf16_loss_seen(monkeypatch)
    g = qlearning.default_config("germ")
    g.model.num_layers, g.model.d_model, g.model.num_heads, g.model.ffn_hidden = 1, 16, 2, 16
    g.model.num_bins, g.model.context, g.batch_size, g.max_steps, g.val_every, g.amp = 8, 3, 8, 3, 3, "bf16"
    g.tensorboard = False
    data = learnable_arrays()
    data.episode_info["terminated"] = ~data.episode_info["success"]
    qlearning.train(g, data, tmp_path / "germ")
    v = vla.default_config("germ")
    v.model.update(VLA_TINY, moe=True)
    v.batch_size, v.max_steps, v.val_every, v.amp, v.tensorboard = 8, 3, 3, "bf16", False
    summary = vla.train(v, ColourChoiceTask(image_size=16, history=2, seed=0, success_ratio=0.75), tmp_path / "vla")
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in summary["model"].parameters())


def test_cli_flag_and_bad_values(tmp_path, capsys):
    from quadforge.tools.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--model", "fcnet", "--store", str(tmp_path / "s"), "--out", str(tmp_path / "o"), "--amp", "fp8"])
    assert exit_.value.code == 2
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
    cfg = preset("fcnet", "cpu")
    cfg.amp = "fp16"
    with pytest.raises(ValueError, match="amp='fp16' unknown"):
        cfg.validate()
