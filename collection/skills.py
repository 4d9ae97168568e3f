"""Skill mixes after FCNet's dataset recipe (seed 000, sec. 4.2 and appendix C.2).

FCNet's legged dataset covers remote-control "skills" - standing, walking/rushing, running, crawling,
squeezing, tilting, turning - on rough terrain, stairs, slopes and obstacles. Here a skill is a
distribution over the 15-D gait-conditioned command (``quadforge.layout.COMMAND_NAMES``): each entry is
either fixed or drawn uniformly from a range once per episode (commands stay fixed for the episode,
which keeps an episode one skill). Terrain is not a skill: ``--terrain`` picks it.

Ranges stay inside walk-these-ways' command ranges (REFERENCE.md): vx +-1 (running goes beyond to
2 m/s, as walk-these-ways' curriculum does), vy +-0.6, yaw +-1, body height -0.25..0.15, gait frequency
2-4 Hz, swing height 0.03-0.35 m, pitch +-0.4 rad, stance width 0.10-0.45 m.

``SkillMix`` is a weighted mix; ``SkillCommandSampler`` draws a skill and its command for every env
at reset (the env's ``command_sampler`` hook) and remembers which skill each env is running, so the
rollout can write the skill name into the episode table (``task``). ``tasks_table`` gives the store's
name -> description table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import torch

from quadforge.envs.config import DEFAULT_GAIT_COMMAND
from quadforge.layout import COMMAND_NAMES
from quadforge.seeding import numpy_rng

_INDEX = {name: i for i, name in enumerate(COMMAND_NAMES)}

# What every entry a skill does not set holds: zero velocities and the env's default trot.
DEFAULT_COMMAND: dict[str, float] = {"lin_vel_x": 0.0, "lin_vel_y": 0.0, "ang_vel_yaw": 0.0, **DEFAULT_GAIT_COMMAND}

Range = tuple[float, float]


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    # command entry -> fixed value or (low, high) uniform range; unset entries hold DEFAULT_COMMAND
    command: Mapping[str, float | Range] = field(default_factory=dict)
    # entries whose sign is flipped with probability 1/2 (turn left or right, tilt up or down)
    symmetric: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [k for k in list(self.command) + list(self.symmetric) if k not in _INDEX]
        if unknown:
            raise ValueError(f"skill {self.name!r}: unknown command entries {unknown}; allowed: {list(COMMAND_NAMES)}")
        for key, value in self.command.items():
            if isinstance(value, tuple) and not (len(value) == 2 and value[0] <= value[1]):
                raise ValueError(f"skill {self.name!r}: range for {key!r} must be (low, high), got {value}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, 15) float32 commands."""
        out = np.tile(np.asarray([DEFAULT_COMMAND[k] for k in COMMAND_NAMES], dtype=np.float64), (n, 1))
        for key, value in self.command.items():
            j = _INDEX[key]
            out[:, j] = rng.uniform(value[0], value[1], size=n) if isinstance(value, tuple) else value
        for key in self.symmetric:
            out[:, _INDEX[key]] *= rng.choice((-1.0, 1.0), size=n)
        return out.astype(np.float32)


SKILLS: dict[str, Skill] = {s.name: s for s in (
    Skill("standing", "stand still at the nominal height (all velocities zero)",
          {"lin_vel_x": 0.0, "lin_vel_y": 0.0, "ang_vel_yaw": 0.0}),
    Skill("walking", "walk at moderate speed in any direction with a trot, slight turning",
          {"lin_vel_x": (-0.6, 0.8), "lin_vel_y": (-0.3, 0.3), "ang_vel_yaw": (-0.4, 0.4),
           "gait_frequency": (2.0, 3.0)}),
    Skill("running", "run forward fast with a high-frequency trot",
          {"lin_vel_x": (1.0, 2.0), "lin_vel_y": (-0.2, 0.2), "ang_vel_yaw": (-0.3, 0.3),
           "gait_frequency": (3.0, 4.0), "foot_swing_height": (0.08, 0.12)}),
    Skill("crawling", "walk slowly with the body lowered (crouched)",
          {"lin_vel_x": (0.0, 0.5), "ang_vel_yaw": (-0.3, 0.3), "body_height": (-0.15, -0.08),
           "foot_swing_height": (0.04, 0.07), "gait_frequency": (2.5, 3.5)}),
    Skill("squeezing", "walk forward with a narrow stance, as through a narrow gap",
          {"lin_vel_x": (0.0, 0.5), "ang_vel_yaw": (-0.2, 0.2), "stance_width": (0.12, 0.18)}),
    Skill("tilting", "hold a pitched body (nose up or down) while standing or walking slowly",
          {"lin_vel_x": (0.0, 0.3), "body_pitch": (0.15, 0.35)}, symmetric=("body_pitch",)),
    Skill("turning", "turn in place or along a tight arc",
          {"lin_vel_x": (0.0, 0.3), "ang_vel_yaw": (0.5, 1.0)}, symmetric=("ang_vel_yaw",)),
)}


@dataclass(frozen=True)
class SkillMix:
    weights: Mapping[str, float]  # skill name -> probability (normalised at construction)

    def __post_init__(self) -> None:
        unknown = [k for k in self.weights if k not in SKILLS]
        if unknown:
            raise ValueError(f"unknown skills {unknown}; allowed: {sorted(SKILLS)} or 'all'")
        bad = {k: v for k, v in self.weights.items() if not (v >= 0 and np.isfinite(v))}
        if bad or not self.weights or sum(self.weights.values()) <= 0:
            raise ValueError(f"skill weights must be >= 0 with a positive sum, got {dict(self.weights)}")
        total = float(sum(self.weights.values()))
        object.__setattr__(self, "weights", {k: float(v) / total for k, v in self.weights.items() if v > 0})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.weights)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
        """Skill names (n) and their commands (n, 15)."""
        names = list(self.names)
        picks = rng.choice(len(names), size=n, p=[self.weights[k] for k in names])
        commands = np.empty((n, len(COMMAND_NAMES)), dtype=np.float32)
        for i, name in enumerate(names):
            rows = np.flatnonzero(picks == i)
            if rows.size:
                commands[rows] = SKILLS[name].sample(rows.size, rng)
        return [names[i] for i in picks], commands

    def to_string(self) -> str:
        return ",".join(f"{k}={v:.6g}" for k, v in self.weights.items())


def parse_skills(text: str) -> SkillMix:
    """``all`` (uniform), ``walking`` (one skill) or ``walking=0.5,running=0.2,...`` (weights)."""
    text = text.strip()
    if text == "all":
        return SkillMix({k: 1.0 for k in SKILLS})
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip()
        if name in weights:
            raise ValueError(f"--skills: {name!r} given twice in {text!r}")
        try:
            weights[name] = float(value) if value else 1.0
        except ValueError:
            raise ValueError(f"--skills: weight of {name!r} is {value!r}, not a number") from None
    if not weights:
        raise ValueError(f"--skills: empty mix {text!r}; give 'all' or e.g. 'walking=0.5,running=0.5' "
                         f"(skills: {', '.join(SKILLS)})")
    return SkillMix(weights)


def tasks_table(mix: SkillMix | None = None) -> dict[str, str]:
    """name -> description of the skills in ``mix`` (all skills when None), for the store."""
    names = mix.names if mix is not None else tuple(SKILLS)
    return {k: SKILLS[k].description for k in names}


class SkillCommandSampler:
    """The env's ``command_sampler``: draws a skill and its command for each env at reset.

    ``current[i]`` is the skill env i was last given. The rollout reads it right after a reset and
    keeps it with the episode, so the name stays right whatever the env does later.
    """

    def __init__(self, mix: SkillMix, num_envs: int, seed: int, name: str = "skills") -> None:
        self.mix = mix
        self.rng = numpy_rng(seed, name)
        self.current: list[str] = [""] * num_envs

    def __call__(self, env_ids: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        # The env passes its own generator; skills draw from their own named stream instead, so the
        # env's randomness (and a skill mix change) never shift each other.
        ids = env_ids.detach().cpu().reshape(-1).tolist()
        names, commands = self.mix.sample(len(ids), self.rng)
        for i, name in zip(ids, names):
            self.current[i] = name
        return torch.from_numpy(commands).to(env_ids.device)
