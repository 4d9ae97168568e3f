from dataclasses import dataclass, field

import pytest

from quadforge.tools.cli import main
from quadforge.overrides import apply_overrides, parse_overrides


@dataclass
class _Optim:
    lr: float = 1e-3
    betas: tuple = (0.9, 0.99)


@dataclass
class _Cfg:
    batch_size: int = 8
    name: str = "a"
    optim: _Optim = field(default_factory=_Optim)
    model: dict = field(default_factory=dict)


def test_overrides_parse_and_apply():
    ov = parse_overrides(["batch_size=32", "optim.lr=1", "optim.betas=[0.8,0.9]", "name=hello", "model.hidden=64"])
    cfg = apply_overrides(_Cfg(), ov)
    assert cfg.batch_size == 32 and cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.betas == (0.8, 0.9) and cfg.name == "hello" and cfg.model == {"hidden": 64}


def test_model_keys_and_fields_are_set_in_one_place_for_python_callers_too():
    from quadforge.training.presets import apply_train_overrides, preset
    cfg = apply_train_overrides(preset("mlp", "cpu"), {"model.hidden": 8, "optim.lr": 0.01, "batch_size": 16})
    assert cfg.model_config["hidden"] == 8 and cfg.optim.lr == 0.01 and cfg.batch_size == 16
    with pytest.raises(ValueError, match="no field 'bogus'"):
        apply_train_overrides(preset("mlp", "cpu"), {"bogus": 1})


def test_bad_overrides_name_the_field():
    with pytest.raises(ValueError, match="not key=value"):
        parse_overrides(["oops"])
    with pytest.raises(ValueError, match="optim has no field 'lrr'.*allowed"):
        apply_overrides(_Cfg(), {"optim.lrr": 1})


def test_unknown_model_is_a_clean_cli_error(capsys):
    assert main(["train", "--model", "resnet", "--store", "x", "--out", "y"]) == 2
    assert "--model 'resnet' unknown" in capsys.readouterr().err


def _synthetic_store(path, successes):
    """A compacted store of 20-step synthetic episodes, one per entry of ``successes``."""
    import numpy as np

    from quadforge.data.compaction import compact
    from quadforge.data.synthetic import synthetic_episode, synthetic_info
    from quadforge.data.writer import StagingWriter

    rng = np.random.default_rng(0)
    writer = StagingWriter(path, "c0")
    for i, ok in enumerate(successes):
        writer.write_episode(synthetic_episode(rng, 20, success=ok), synthetic_info(i, success=ok))
    compact(path)
    return path


def test_train_command_on_a_real_store(tmp_path, capsys):
    from quadforge.models.checkpoint import load_checkpoint

    store = _synthetic_store(tmp_path / "store", [i != 0 for i in range(6)])
    out = tmp_path / "run"
    argv = ["train", "--model", "mlp", "--store", str(store), "--out", str(out), "--preset", "cpu",
            "--max-steps", "4", "--batch-size", "8", "--val-every", "2", "--success-only",
            "model.hidden=8", "optim.lr=0.01", "tensorboard=False"]
    assert main(argv) == 0
    ck = load_checkpoint(out / "last.pt")
    assert ck.step == 4 and ck.model_config["hidden"] == 8 and ck.train_config["optim"]["lr"] == 0.01
    assert ck.provenance["store"] == str(store.resolve()) and ck.provenance["generation"] >= 1
    assert ck.provenance["success_only"] is True
    assert "step 4" in capsys.readouterr().out
    assert main(argv + ["--resume", "--max-steps", "6"]) == 0 and load_checkpoint(out).step == 6
    assert main(["train", "--model", "mlp", "--store", str(tmp_path / "nope"), "--out", str(out), "--overwrite"]) == 2
    assert "no trajectory store" in capsys.readouterr().err
    assert main(["train", "--model", "mlp", "--store", str(store), "--out", str(out), "--layout", "bogus",
                 "--overwrite"]) == 2
    assert "unknown observation layout 'bogus'" in capsys.readouterr().err
    assert main(["train", "--model", "germ", "--store", str(store), "--out", str(out), "--layout", "proprio",
                 "--overwrite"]) == 2   # a flag the model's trainer has no use for: refused, not dropped
    assert "--layout proprio: the observation layout of the imitation models; germ" in capsys.readouterr().err
    assert main(["train", "--model", "mlp", "--store", str(store), "--out", str(out), "bogus=1", "--overwrite"]) == 2
    assert "has no field 'bogus'" in capsys.readouterr().err


def test_ctrl_c_says_which_checkpoint_was_kept_and_how_to_go_on(tmp_path, capsys, monkeypatch):
    """It printed 'interrupted' alone: which step survives, and whether --resume helps, went unsaid."""
    from quadforge.training import imitation
    store = _synthetic_store(tmp_path / "store", [i != 0 for i in range(6)])
    out = tmp_path / "run"
    argv = ["train", "--model", "mlp", "--store", str(store), "--out", str(out), "--preset", "cpu",
            "--max-steps", "8", "--batch-size", "8", "--val-every", "2", "model.hidden=8", "tensorboard=False"]
    original = imitation.ImitationRun.loss_terms

    def ctrl_c_at_step_5(self, step):
        if step == 4:
            raise KeyboardInterrupt
        return original(self, step)
    monkeypatch.setattr(imitation.ImitationRun, "loss_terms", ctrl_c_at_step_5)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert f"interrupted: train mlp stopped; {out / 'last.pt'} holds step 4 of 8: the same command with --resume " \
           "continues from it" in err
    monkeypatch.undo()
    assert main(argv + ["--resume"]) == 0


def test_germ_models_are_dispatched_to_qlearning(monkeypatch, tmp_path):
    import sys
    import types

    import torch
    from torch import nn

    from quadforge.layout import get_layout
    from quadforge.models.checkpoint import Checkpoint, save_checkpoint
    from quadforge.experts import registry
    from quadforge.experts.registry import load_policy

    from quadforge.models.registry import MODEL_SPECS, ModelSpec

    seen = {}
    fake = types.ModuleType("quadforge.training.qlearning")
    fake.run_from_args = lambda args: seen.setdefault("train", args.model) and 0
    monkeypatch.setitem(sys.modules, "quadforge.training.qlearning", fake)
    # one registration reaches the CLI's trainer and the policy loader; no name is spelled anywhere else
    monkeypatch.setitem(MODEL_SPECS, ("germ_small", "proprio"),
                        ModelSpec("germ_small", "proprio", "quadforge.models.germ:GeRM", reads="transitions",
                                  trainer="qlearning", policy="germ", objective="q"))
    # the one policy registry routes GeRM checkpoints to experts.germ_policy.load_germ
    monkeypatch.setitem(registry.MODEL_POLICIES, "germ", lambda path, num_envs, device: ("germ-policy", num_envs))
    assert main(["train", "--model", "germ_small", "--store", "x", "--out", str(tmp_path)]) == 0
    assert seen["train"] == "germ_small"
    ck = Checkpoint(model_name="germ_small", model_config={}, state_dict=nn.Linear(1, 1).state_dict(),
                    layout=get_layout("proprio").to_dict())
    path = save_checkpoint(tmp_path / "germ.pt", ck)
    assert load_policy(path, num_envs=3) == ("germ-policy", 3)


def test_num_threads_sets_torch_threads_and_rejects_zero(tmp_path, capsys):
    import torch

    store = _synthetic_store(tmp_path / "store", [True] * 3)
    base = ["train", "--model", "mlp", "--store", str(store), "--preset", "cpu", "--max-steps", "2",
            "--batch-size", "8", "model.hidden=8", "tensorboard=False"]
    before = torch.get_num_threads()
    try:
        assert main(base + ["--out", str(tmp_path / "run"), "--num-threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert main(base + ["--out", str(tmp_path / "run0"), "--num-threads", "0"]) == 2
    assert "--num-threads 0: must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "run0" / "last.pt").exists()


@pytest.fixture
def laststep():
    """An imitation model registered here, without presets of its own; unregistered afterwards."""
    from quadforge.models.registry import MODEL_SPECS, ModelSpec, register_model
    register_model(ModelSpec("laststep", "proprio", "laststep_model:LastStepNet", reads="windows",
                             trainer="imitation", policy="learned"))
    yield "laststep"
    MODEL_SPECS.pop(("laststep", "proprio"))


def test_a_registered_imitation_model_trains_from_the_cli_and_joins_every_model_list(laststep, tmp_path, capsys):
    """It was 'no presets for model laststep' (training/presets.py kept a second model list), and the sweep's
    and bench's lists were frozen when their modules were imported."""
    from quadforge.envs.builder import make_env
    from quadforge.experts.registry import policy_for_env
    from quadforge.models.checkpoint import load_checkpoint
    from quadforge.tools.bench.models import bench_models
    from quadforge.training.presets import GENERIC_PRESETS, preset
    from quadforge.training.sweep import SweepConfig, run_config, sweep_models
    store = _synthetic_store(tmp_path / "store", [True] * 4)
    out = tmp_path / "run"
    assert main(["train", "--model", laststep, "--store", str(store), "--out", str(out), "--max-steps", "2",
                 "--batch-size", "4", "--val-every", "2", "model.hidden=8", "tensorboard=False"]) == 0
    assert "train laststep: preset 'cpu'" in capsys.readouterr().out
    ck = load_checkpoint(out / "last.pt")
    assert ck.step == 2 and ck.train_config["context"] == GENERIC_PRESETS["cpu"]["context"]
    assert ck.model_config["hidden"] == 8
    env = make_env(num_envs=2)
    try:   # its checkpoint deploys through the learned wrapper, as any zoo model's
        assert policy_for_env(str(out / "last.pt"), env).act(env.terms).shape == (2, 12)
    finally:
        env.close()
    assert preset(laststep, "paper").optim.lr == GENERIC_PRESETS["paper"]["optim"]["lr"]
    assert laststep in sweep_models() and laststep in bench_models()
    cfg = SweepConfig(data=str(store), out=str(tmp_path / "sweep"), models=(laststep,), steps=3).validate()
    assert run_config(laststep, cfg, 1e-3, "adamw").model == laststep
