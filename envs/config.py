"""Typed configuration of the locomotion env (``LeggedEnv(EnvConfig)``).

Defaults follow legged_gym (dt 0.005 x 4, 20 s episodes, its reward scales, noise scales, pushes and
friction range) and walk-these-ways for the gait-conditioned command ranges. ``validate()`` turns every
bad value into a one-line ``ValueError`` naming the field and what is allowed (every value first against
its annotation: ``quadforge.typed_values``); ``LeggedEnv`` calls it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from quadforge.typed_values import check_field_types
from quadforge.envs.backends.base import BackendConfig
from quadforge.envs.backends.base import RandomizationConfig as PhysicsRandomizationConfig
from quadforge.layout import COMMAND_NAMES, LAYOUTS, TERM_DIMS

COMMAND_MODES = ("joystick", "gait")
# The one definition of the named gaits: (phase, offset, bound) of walk-these-ways' four, plus a walk.
GAITS: dict[str, tuple[float, float, float]] = {
    "trot": (0.5, 0.0, 0.0),
    "pronk": (0.0, 0.0, 0.0),
    "pace": (0.0, 0.0, 0.5),
    "bound": (0.0, 0.5, 0.0),
    # lateral-sequence walk: RL, FL, RR, FR touch down a quarter cycle apart (with duty 0.75, three
    # feet stand at any time)
    "walk": (0.5, 0.25, 0.0),
}

# The first three are legged_gym's joystick ranges; the rest walk-these-ways' Go1 ranges.
DEFAULT_COMMAND_RANGES: dict[str, tuple[float, float]] = {
    "lin_vel_x": (-1.0, 1.0), "lin_vel_y": (-1.0, 1.0), "ang_vel_yaw": (-1.0, 1.0),
    "body_height": (-0.25, 0.15), "gait_frequency": (2.0, 4.0),
    "gait_phase": (0.0, 1.0), "gait_offset": (0.0, 1.0), "gait_bound": (0.0, 1.0),
    "gait_duration": (0.5, 0.5), "foot_swing_height": (0.03, 0.35),
    "body_pitch": (-0.4, 0.4), "body_roll": (0.0, 0.0),
    "stance_width": (0.10, 0.45), "stance_length": (0.35, 0.45), "aux": (0.0, 0.0),
}
# Physically sensible bounds a range must lie in (a typo like vx=30 is an error, not a flying robot).
COMMAND_LIMITS: dict[str, tuple[float, float]] = {
    "lin_vel_x": (-3.0, 3.0), "lin_vel_y": (-3.0, 3.0), "ang_vel_yaw": (-2 * math.pi, 2 * math.pi),
    "body_height": (-0.3, 0.3), "gait_frequency": (1e-6, 10.0),
    "gait_phase": (0.0, 1.0), "gait_offset": (0.0, 1.0), "gait_bound": (0.0, 1.0),
    "gait_duration": (1e-6, 1.0 - 1e-6), "foot_swing_height": (0.0, 0.5),
    "body_pitch": (-0.8, 0.8), "body_roll": (-0.8, 0.8),
    "stance_width": (0.05, 0.6), "stance_length": (0.2, 0.7), "aux": (-1.0, 1.0),
}


def command_outside_limits(name: str, value: float) -> str | None:
    """Why ``value`` is no command ``name`` can take (outside ``COMMAND_LIMITS``, or NaN); None when it is."""
    lo, hi = COMMAND_LIMITS[name]
    if lo <= value <= hi:
        return None
    return f"{name} = {value:g} lies outside its limits [{lo:g}, {hi:g}] (quadforge.envs.config.COMMAND_LIMITS)"


# The default trot that fills entries 3.. of the command in joystick mode.
DEFAULT_GAIT_COMMAND: dict[str, float] = {
    "body_height": 0.0, "gait_frequency": 3.0, "gait_phase": 0.5, "gait_offset": 0.0, "gait_bound": 0.0,
    "gait_duration": 0.5, "foot_swing_height": 0.08, "body_pitch": 0.0, "body_roll": 0.0,
    "stance_width": 0.25, "stance_length": 0.40, "aux": 0.0,
}

# legged_gym's noise_scales (noise_level 1) in raw SI units of our terms.
DEFAULT_NOISE: dict[str, float] = {
    "base_lin_vel": 0.1, "base_ang_vel": 0.2, "projected_gravity": 0.05,
    "dof_pos": 0.01, "dof_vel": 1.5, "height_scan": 0.1,
}

# legged_gym LeggedRobotCfg.rewards.scales (zero-scale terms are accepted and skipped), plus A1's
# dof_pos_limits penalty since Go1/Aliengo are A1-class robots.
DEFAULT_REWARD_SCALES: dict[str, float] = {
    "termination": -0.0, "tracking_lin_vel": 1.0, "tracking_ang_vel": 0.5, "lin_vel_z": -2.0,
    "ang_vel_xy": -0.05, "orientation": -0.0, "torques": -1e-5, "dof_vel": -0.0, "dof_acc": -2.5e-7,
    "base_height": -0.0, "feet_air_time": 1.0, "collision": -1.0, "feet_stumble": -0.0,
    "action_rate": -0.01, "stand_still": -0.0, "dof_pos_limits": -10.0,
}


def _err(field_name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{field_name}={value!r} is invalid; allowed: {allowed}")


@dataclass
class CommandsConfig:
    mode: str = "joystick"            # "joystick": vx, vy, yaw (+ default trot); "gait": all 15 drawn
    heading_command: bool = True      # joystick: draw a heading, turn its error into a yaw command
    heading_range: tuple[float, float] = (-math.pi, math.pi)
    heading_gain: float = 0.5         # yaw = clip(gain * wrap(heading - yaw), yaw range)
    resampling_time: float = 10.0     # s
    resample: bool = True             # False: commands are drawn only at reset
    small_xy_threshold: float = 0.2   # |cmd_xy| below this is zeroed (legged_gym)
    ranges: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_COMMAND_RANGES))
    gaits: tuple[str, ...] = ("trot", "pronk", "pace", "bound")  # gait mode: drawn (phase, offset, bound)
    default_gait: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_GAIT_COMMAND))

    def validate(self) -> None:
        if self.mode not in COMMAND_MODES:
            raise _err("commands.mode", self.mode, str(COMMAND_MODES))
        if not self.resampling_time > 0:
            raise _err("commands.resampling_time", self.resampling_time, "> 0 seconds")
        unknown = sorted(set(self.ranges) - set(COMMAND_NAMES))
        if unknown:
            raise _err("commands.ranges", unknown, f"keys from {COMMAND_NAMES}")
        for name, (lo_lim, hi_lim) in COMMAND_LIMITS.items():
            lo, hi = self.ranges.get(name, DEFAULT_COMMAND_RANGES[name])
            if lo > hi:
                raise _err(f"commands.ranges[{name!r}]", (lo, hi), "min <= max")
            if lo < lo_lim or hi > hi_lim:
                raise _err(f"commands.ranges[{name!r}]", (lo, hi), f"within [{lo_lim:g}, {hi_lim:g}]")
        lo, hi = self.heading_range
        if lo > hi or lo < -math.pi - 1e-9 or hi > math.pi + 1e-9:
            raise _err("commands.heading_range", self.heading_range, "min <= max within [-pi, pi]")
        bad = [g for g in self.gaits if g not in GAITS]
        if bad or (self.mode == "gait" and not self.gaits):
            raise _err("commands.gaits", self.gaits, f"a non-empty subset of {tuple(GAITS)}")
        unknown = sorted(set(self.default_gait) - set(COMMAND_NAMES[3:]))
        if unknown:
            raise _err("commands.default_gait", unknown, f"keys from {COMMAND_NAMES[3:]}")
        if self.default_gait.get("gait_frequency", 1.0) <= 0:
            raise _err("commands.default_gait['gait_frequency']", self.default_gait["gait_frequency"], "> 0 Hz")

    def range(self, name: str) -> tuple[float, float]:
        return self.ranges.get(name, DEFAULT_COMMAND_RANGES[name])


@dataclass
class ObservationsConfig:
    policy_layout: str = "legged_gym_48"
    critic_layout: str = "legged_gym_235"
    add_noise: bool = True
    noise_level: float = 1.0
    noise: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_NOISE))  # uniform +-scale per term
    clip_actions: float = 100.0

    def validate(self) -> None:
        for f in ("policy_layout", "critic_layout"):
            if getattr(self, f) not in LAYOUTS:
                raise _err(f"observations.{f}", getattr(self, f), str(sorted(LAYOUTS)))
        unknown = sorted(set(self.noise) - set(TERM_DIMS))
        if unknown:
            raise _err("observations.noise", unknown, f"keys from {sorted(TERM_DIMS)}")
        if any(v < 0 for v in self.noise.values()) or self.noise_level < 0:
            raise _err("observations.noise", self.noise, "non-negative scales")
        if not self.clip_actions > 0:
            raise _err("observations.clip_actions", self.clip_actions, "> 0")


@dataclass
class RewardsConfig:
    scales: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_REWARD_SCALES))
    only_positive_rewards: bool = True
    tracking_sigma: float = 0.25
    soft_dof_pos_limit: float = 0.9   # fraction of the joint range before dof_pos_limits bites (A1)
    soft_dof_vel_limit: float = 1.0
    soft_torque_limit: float = 1.0
    base_height_target: float | None = None  # None -> the robot's nominal base height
    max_contact_force: float = 100.0
    feet_air_time_target: float = 0.5
    penalized_contact_bodies: tuple[str, ...] = ("thigh", "calf")  # body suffixes the collision term counts

    def validate(self) -> None:
        from quadforge.envs.rewards import REWARD_TERMS  # the registry lives with the reward functions
        unknown = sorted(set(self.scales) - set(REWARD_TERMS))
        if unknown:
            raise _err("rewards.scales", unknown, f"terms from {sorted(REWARD_TERMS)}")
        if not self.tracking_sigma > 0:
            raise _err("rewards.tracking_sigma", self.tracking_sigma, "> 0")
        if not 0 < self.soft_dof_pos_limit <= 1:
            raise _err("rewards.soft_dof_pos_limit", self.soft_dof_pos_limit, "in (0, 1]")


@dataclass
class TerminationsConfig:
    contact_bodies: tuple[str, ...] = ("base",)  # contact on these bodies -> "base_collision"
    contact_force: float = 1.0        # N
    max_gravity_z: float = -0.5       # projected gravity z above this (tilted > 60 deg) -> "fall"
    min_base_height: float = 0.4      # fraction of the nominal base height; below it -> "fall"

    def validate(self) -> None:
        if not -1.0 <= self.max_gravity_z <= 0.0:
            raise _err("terminations.max_gravity_z", self.max_gravity_z, "in [-1, 0]")
        if not 0.0 <= self.min_base_height < 1.0:
            raise _err("terminations.min_base_height", self.min_base_height, "a fraction in [0, 1)")
        if not self.contact_force > 0:
            raise _err("terminations.contact_force", self.contact_force, "> 0 N")


@dataclass
class RandomizationConfig:
    """Task-level randomization; ``physics`` is handed to the backend (friction, mass, motor strength)."""

    physics: PhysicsRandomizationConfig | None = field(default_factory=PhysicsRandomizationConfig)
    push_robots: bool = True
    push_interval_s: float = 15.0
    max_push_vel_xy: float = 1.0
    action_latency_steps: tuple[int, int] = (0, 1)  # per-env delay drawn at reset from this range

    @classmethod
    def off(cls) -> "RandomizationConfig":
        return cls(physics=None, push_robots=False, action_latency_steps=(0, 0))

    def validate(self) -> None:
        lo, hi = self.action_latency_steps
        if not (0 <= lo <= hi <= 1):
            raise _err("randomization.action_latency_steps", self.action_latency_steps,
                       "(min, max) with 0 <= min <= max <= 1 control steps")
        if self.push_robots and not self.push_interval_s > 0:
            raise _err("randomization.push_interval_s", self.push_interval_s, "> 0 seconds")
        if self.max_push_vel_xy < 0:
            raise _err("randomization.max_push_vel_xy", self.max_push_vel_xy, ">= 0 m/s")
        p = self.physics
        if p is not None:
            for name in ("friction_range", "added_mass_range", "motor_strength_range"):
                r = getattr(p, name)
                if r is not None and r[0] > r[1]:
                    raise _err(f"randomization.physics.{name}", r, "min <= max")
            if p.num_variants < 1:
                raise _err("randomization.physics.num_variants", p.num_variants, ">= 1")


@dataclass
class InitConfig:
    """Reset state, legged_gym style."""

    joint_pos_scale: tuple[float, float] = (0.5, 1.5)  # default pose scaled by U(lo, hi) per joint
    root_vel: float = 0.5            # base lin/ang velocities drawn from U(-v, v)
    spawn_xy: float = 1.0            # on terrain: U(-d, d) around the tile origin
    spawn_height: float = 0.05       # m above the nominal base height over the ground

    def validate(self) -> None:
        lo, hi = self.joint_pos_scale
        if not 0 <= lo <= hi:
            raise _err("init.joint_pos_scale", self.joint_pos_scale, "0 <= min <= max")
        if self.root_vel < 0 or self.spawn_xy < 0:
            raise _err("init", (self.root_vel, self.spawn_xy), "non-negative root_vel and spawn_xy")


@dataclass
class EnvConfig:
    backend: BackendConfig = field(default_factory=BackendConfig)
    terrain: Any | None = None        # envs.terrain.TerrainConfig, or None for a flat plane
    commands: CommandsConfig = field(default_factory=CommandsConfig)
    observations: ObservationsConfig = field(default_factory=ObservationsConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    terminations: TerminationsConfig = field(default_factory=TerminationsConfig)
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    init: InitConfig = field(default_factory=InitConfig)
    episode_length_s: float = 20.0
    curriculum: bool = True           # only with a terrain
    max_init_terrain_level: int = 5   # legged_gym: start levels drawn in [0, this]
    backend_name: str = "mujoco_cpu"
    # torch intra-op threads, set process-wide when the env is built on the CPU: the env's torch math is
    # many small batched ops that threads only slow down, and they would fight the physics thread pool
    # for the cores. None leaves torch's setting alone (e.g. a trainer that wants threads for itself).
    torch_threads: int | None = 1
    # The task's per-step scoring (rewards, terminations, episode statistics, gait clock) through
    # torch.compile: a few fused kernels instead of ~60 small ops (the default rewards). Equal to the
    # eager step within float rounding, not bit for bit, so off by default (every documented number is
    # the eager step's); the first step compiles (~15 s on 2 CPU cores from an empty cache, a C++
    # compiler needed on the CPU). docs/scale.md.
    compile_task: bool = False

    @classmethod
    def flat(cls, robot: str = "go1", num_envs: int = 16, seed: int = 0, **kw: Any) -> "EnvConfig":
        return cls(backend=BackendConfig(robot=robot, num_envs=num_envs, seed=seed), terrain=None, **kw)

    @classmethod
    def rough(cls, robot: str = "go1", num_envs: int = 16, seed: int = 0, terrain: Any | None = None,
              **kw: Any) -> "EnvConfig":
        """On a terrain grid: ``terrain`` (a TerrainConfig) or legged_gym's mix ``TerrainConfig.mixed()``."""
        from quadforge.envs.terrain import TerrainConfig
        return cls(backend=BackendConfig(robot=robot, num_envs=num_envs, seed=seed),
                   terrain=terrain if terrain is not None else TerrainConfig.mixed(), **kw)

    @property
    def num_envs(self) -> int:
        return self.backend.num_envs

    @property
    def seed(self) -> int:
        return self.backend.seed

    @property
    def dt(self) -> float:
        return self.backend.sim_dt * self.backend.decimation

    def backend_config(self) -> BackendConfig:
        """The backend's config with this env's terrain and physics randomization filled in."""
        return replace(self.backend, terrain=self.terrain, randomization=self.randomization.physics)

    def validate(self) -> "EnvConfig":
        check_field_types(self)   # NaN, inf, a bool or a string where a number belongs: before the comparisons below
        b = self.backend
        if not isinstance(b.num_envs, int) or b.num_envs < 1:
            raise _err("backend.num_envs", b.num_envs, "an integer >= 1")
        from quadforge.envs.robots import ROBOTS
        if b.robot not in ROBOTS:
            raise _err("backend.robot", b.robot, str(tuple(ROBOTS)))
        if not b.sim_dt > 0:
            raise _err("backend.sim_dt", b.sim_dt, "> 0 seconds")
        if not isinstance(b.decimation, int) or b.decimation < 1:
            raise _err("backend.decimation", b.decimation, "an integer >= 1")
        if b.num_threads is not None and b.num_threads < 1:
            raise _err("backend.num_threads", b.num_threads, "None or >= 1")
        if b.terrain is not None and b.terrain is not self.terrain:
            raise _err("backend.terrain", b.terrain, "None (set EnvConfig.terrain instead)")
        from quadforge.envs.backends import BACKENDS, PLANNED
        if self.backend_name in PLANNED:  # designed for, not written: refused here, before anything is built
            raise NotImplementedError(f"EnvConfig.backend_name={self.backend_name!r} is planned, not implemented "
                                      f"yet ({PLANNED[self.backend_name]}); available: {', '.join(BACKENDS)}")
        if self.backend_name not in BACKENDS:
            raise _err("backend_name", self.backend_name, str(tuple(BACKENDS)))
        if not self.episode_length_s >= self.dt:
            raise _err("episode_length_s", self.episode_length_s, f">= the control dt {self.dt:g} s")
        if self.torch_threads is not None and (not isinstance(self.torch_threads, int) or self.torch_threads < 1):
            raise _err("torch_threads", self.torch_threads, "None or an integer >= 1")
        if not isinstance(self.compile_task, bool):
            raise _err("compile_task", self.compile_task, "True or False")
        if self.max_init_terrain_level < 0:
            raise _err("max_init_terrain_level", self.max_init_terrain_level, ">= 0")
        if self.terrain is not None:
            _validate_terrain(self.terrain)
        for part in (self.commands, self.observations, self.rewards, self.terminations,
                     self.randomization, self.init):
            part.validate()
        return self


def _validate_terrain(t: Any) -> None:
    from quadforge.envs.terrain import TERRAIN_TYPES
    props = getattr(t, "proportions", None)
    if not isinstance(props, dict) or not props:
        raise _err("terrain.proportions", props, f"a non-empty dict over {TERRAIN_TYPES}")
    unknown = sorted(set(props) - set(TERRAIN_TYPES))
    if unknown:
        raise _err("terrain.proportions", unknown, f"terrain types from {TERRAIN_TYPES}")
    if any(v < 0 for v in props.values()) or abs(sum(props.values()) - 1.0) > 1e-6:
        raise _err("terrain.proportions", props, "non-negative values summing to 1")
    for name in ("num_levels", "num_cols"):
        v = getattr(t, name, 1)
        if not isinstance(v, int) or v < 1:
            raise _err(f"terrain.{name}", v, "an integer >= 1")
