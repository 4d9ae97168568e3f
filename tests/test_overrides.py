"""The one key=value setter: typed by the field it replaces, unknown fields named, frozen configs copied."""
from dataclasses import dataclass, field

import pytest

from quadforge.overrides import apply_overrides, parse_overrides


@dataclass
class _Optim:
    lr: float = 1e-3


@dataclass
class _Cfg:
    batch_size: int = 8
    tensorboard: bool = True
    layout: str | None = None
    dims: tuple = (64, 32)
    optim: _Optim = field(default_factory=_Optim)


@dataclass(frozen=True)
class _Frozen:
    gamma: float = 0.99


@pytest.mark.parametrize("item, message", [
    ("batch_size=64.5", "batch_size=64.5 is invalid; allowed: an integer"),
    ("optim.lr=fast", "optim.lr='fast' is invalid; allowed: a number"),
    ("tensorboard=maybe", "tensorboard='maybe' is invalid; allowed: True or False"),
    ("batch_size=True", "an integer"),
    ("optim.lrr=1", "no field optim.lrr"),
])
def test_bad_values_are_one_line_errors(item, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        apply_overrides(_Cfg(), parse_overrides([item]))
    assert "\n" not in str(err.value)


def test_a_range_given_one_number_is_refused_and_a_flat_envs_terrain_is_named():
    from quadforge.envs.builder import make_env
    with pytest.raises(ValueError, match=r"lin_vel_x=1.0 is invalid; allowed: a tuple of 2 numbers"):
        make_env(overrides={"commands.ranges.lin_vel_x": 1.0})   # was stored as (1.0,), then failed to unpack
    with pytest.raises(ValueError, match="sets a field of terrain, which is None in this config"):
        make_env(overrides={"terrain.num_levels": 3})
    from quadforge.training.ppo import PPOPreset
    cfg = apply_overrides(PPOPreset(), {"actor_hidden_dims": [64, 32], "critic_hidden_dims": 64})
    assert cfg.actor_hidden_dims == (64, 32) and cfg.critic_hidden_dims == (64,)   # layer sizes: any count


def test_values_take_the_field_type():
    cfg = apply_overrides(_Cfg(), parse_overrides(["optim.lr=1", "dims=[8, 4]", "layout=fcnet", "tensorboard=False"]))
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.dims == (8, 4) and cfg.layout == "fcnet" and cfg.tensorboard is False
    frozen = _Frozen()
    assert apply_overrides(frozen, {"gamma": 1}).gamma == 1.0 and frozen.gamma == 0.99


def test_env_overrides_apply_only_under_their_root():
    from quadforge.envs.config import EnvConfig
    cfg = apply_overrides(EnvConfig.flat(), parse_overrides(["env.commands.resample=False", "lr=3"]), root="env")
    assert cfg.commands.resample is False


def test_a_tuple_field_takes_bare_words_split_at_commas():
    from quadforge.training.vla import default_config
    cfg = default_config("rt1", "cpu")
    apply_overrides(cfg, parse_overrides(["families=go_to,stop"]))
    assert cfg.families == ("go_to", "stop")
    apply_overrides(cfg, parse_overrides(["families=go_avoid"]))
    assert cfg.families == ("go_avoid",)
    apply_overrides(cfg, parse_overrides(["families=('go_to', 'distinguish')"]))
    assert cfg.families == ("go_to", "distinguish")
