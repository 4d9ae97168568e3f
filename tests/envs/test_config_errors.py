"""EnvConfig.validate(): every bad input is a one-line ValueError naming the field and what is allowed."""
import dataclasses

import pytest

from quadforge.envs.config import EnvConfig, RandomizationConfig


def _flat(**kw):
    return EnvConfig.flat(num_envs=2, **kw)


def _raises(cfg, *fragments):
    with pytest.raises(ValueError) as err:
        cfg.validate()
    msg = str(err.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, msg
    return msg


def test_defaults_validate():
    assert EnvConfig().validate() is not None
    cfg = _flat()
    assert cfg.validate() is cfg
    assert cfg.dt == pytest.approx(0.02)


def test_num_envs_and_robot():
    _raises(_flat().__class__.flat(num_envs=0), "backend.num_envs", ">= 1")
    _raises(EnvConfig.flat(robot="spot"), "backend.robot", "go1", "aliengo")


def test_unknown_reward_term_lists_known_terms():
    cfg = _flat()
    cfg.rewards.scales["trackin_lin_vel"] = 1.0
    _raises(cfg, "rewards.scales", "trackin_lin_vel", "tracking_lin_vel", "feet_air_time")


@pytest.mark.parametrize("name, rng, fragment", [
    ("lin_vel_x", (1.0, -1.0), "min <= max"),
    ("lin_vel_x", (-4.0, 1.0), "within [-3, 3]"),
    ("lin_vel_y", (0.0, 3.5), "within [-3, 3]"),
    ("gait_frequency", (0.0, 3.0), "gait_frequency"),
    ("gait_frequency", (-1.0, 3.0), "gait_frequency"),
    ("gait_phase", (0.0, 1.5), "gait_phase"),
])
def test_command_ranges(name, rng, fragment):
    cfg = _flat()
    cfg.commands.ranges[name] = rng
    _raises(cfg, f"commands.ranges[{name!r}]", fragment)


def test_command_misc():
    cfg = _flat()
    cfg.commands.ranges["lin_vel_z"] = (0.0, 1.0)
    _raises(cfg, "commands.ranges", "lin_vel_z", "lin_vel_x")
    cfg = _flat()
    cfg.commands.mode = "walk"
    _raises(cfg, "commands.mode", "joystick", "gait")
    cfg = _flat()
    cfg.commands.gaits = ("gallop",)
    _raises(cfg, "commands.gaits", "trot")
    cfg = _flat()
    cfg.commands.resampling_time = 0
    _raises(cfg, "commands.resampling_time")


def test_layouts_noise_and_terminations():
    cfg = _flat()
    cfg.observations.policy_layout = "legged_gym_49"
    _raises(cfg, "observations.policy_layout", "legged_gym_48")
    cfg = _flat()
    cfg.observations.noise["lin_vel"] = 0.1
    _raises(cfg, "observations.noise", "lin_vel", "base_lin_vel")
    cfg = _flat()
    cfg.terminations.max_gravity_z = 0.5
    _raises(cfg, "terminations.max_gravity_z")


def test_randomization():
    cfg = _flat(randomization=RandomizationConfig(action_latency_steps=(0, 3)))
    _raises(cfg, "randomization.action_latency_steps", "0 <= min <= max <= 1")
    cfg = _flat()
    cfg.randomization.physics = dataclasses.replace(cfg.randomization.physics, friction_range=(1.5, 0.5))
    _raises(cfg, "randomization.physics.friction_range", "min <= max")


def test_episode_length_and_backend_terrain():
    _raises(_flat(episode_length_s=0.0), "episode_length_s")
    cfg = _flat()
    cfg.backend.terrain = object()
    _raises(cfg, "backend.terrain", "EnvConfig.terrain")


def test_terrain_errors():
    terrain = pytest.importorskip("quadforge.envs.terrain")
    cfg = _flat()
    cfg.terrain = terrain.TerrainConfig.of_types(["flat"])
    cfg.terrain.proportions = {"lava": 1.0}
    _raises(cfg, "terrain.proportions", "lava", "stairs_up")
    cfg.terrain.proportions = {"stairs_up": 0.5, "gaps": 0.2}
    _raises(cfg, "terrain.proportions", "summing to 1")


@pytest.mark.parametrize("change, fragments", [
    # every one of these passed validate() and ran: NaN fails every comparison written as a negative test
    (lambda c: c.rewards.scales.__setitem__("tracking_lin_vel", float("nan")),
     ("rewards.scales['tracking_lin_vel']=nan", "a finite number")),
    (lambda c: c.commands.ranges.__setitem__("lin_vel_x", (float("nan"), float("nan"))),
     ("commands.ranges['lin_vel_x'][0]=nan",)),
    (lambda c: setattr(c.commands, "heading_gain", float("nan")), ("commands.heading_gain=nan",)),
    (lambda c: setattr(c.observations, "noise_level", float("nan")), ("observations.noise_level=nan",)),
    (lambda c: setattr(c.init, "root_vel", float("nan")), ("init.root_vel=nan",)),
    (lambda c: setattr(c, "episode_length_s", float("inf")), ("episode_length_s=inf",)),
    (lambda c: setattr(c.backend, "num_envs", True), ("backend.num_envs=True", "an integer")),
    (lambda c: setattr(c.backend, "seed", 1.5), ("backend.seed=1.5", "an integer")),
    (lambda c: setattr(c.backend, "seed", "abc"), ("backend.seed='abc'",)),
    (lambda c: setattr(c.randomization, "action_latency_steps", (0.5, 1)),
     ("randomization.action_latency_steps[0]=0.5", "an integer")),
    (lambda c: setattr(c.commands, "heading_range", (0.0,)), ("commands.heading_range=(0.0,)", "tuple[float, float]")),
    (lambda c: setattr(c.commands, "gaits", ("trot", 3)), ("commands.gaits[1]=3", "a string")),
    (lambda c: setattr(c.backend.warp, "nconmax", 2.5), ("backend.warp.nconmax=2.5", "an integer or None")),
])
def test_values_are_checked_against_their_annotations(change, fragments):
    cfg = _flat()
    change(cfg)
    _raises(cfg, *fragments)


def test_a_terrain_and_a_quard_config_are_checked_too():
    import math

    from quadforge.envs.quard.env import QuardConfig
    from quadforge.envs.terrain import TerrainConfig
    cfg = EnvConfig.rough(num_envs=2, terrain=TerrainConfig.mixed())
    cfg.terrain.border = math.nan   # the terrain's own check (>= 0) lets a NaN through
    _raises(cfg, "terrain.border=nan")
    q = QuardConfig.make("quard:go_to", num_envs=2)
    q.validate()
    q.image_every = 2.0
    with pytest.raises(ValueError, match=r"QuardConfig.image_every=2.0 is invalid; allowed: an integer"):
        q.validate()
    for defaults in (EnvConfig(), EnvConfig.rough(), EnvConfig.flat(randomization=RandomizationConfig.off()),
                     QuardConfig.make("quard:all")):
        defaults.validate()
