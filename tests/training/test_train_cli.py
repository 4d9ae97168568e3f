from dataclasses import dataclass, field

import pytest

from tools.cli import main
from training.cli import apply_overrides, parse_overrides


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


def test_bad_overrides_name_the_field():
    with pytest.raises(ValueError, match="not key=value"):
        parse_overrides(["oops"])
    with pytest.raises(ValueError, match="optim has no field 'lrr'.*allowed"):
        apply_overrides(_Cfg(), {"optim.lrr": 1})


def test_unknown_model_is_a_clean_cli_error(capsys):
    assert main(["train", "--model", "resnet", "--data", "x", "--out", "y"]) == 2
    assert "--model 'resnet' unknown" in capsys.readouterr().err
