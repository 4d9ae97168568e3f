"""distinguish: "distinguish letter {letter}" - face the box printed with the named letter.

Scene: two 0.5 m letter boxes, letters a-f on every face. Rule (seed 003): the named box within +-5
degrees of the heading, or lined up (|dy| < 0.2 m); meeting that rule for the other box first is a
wrong target. Expert: turn on the spot until the named box is straight ahead.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from quadforge.envs.quard.family.base import (MAX_YAW_RATE, YAW_GAIN, Draw, EpisodeScene, ExpertBehaviour,
                                              ExpertStep, Family, Placement, RuleState, wrap_angle)
from quadforge.envs.quard.words import LETTERS

HEADING_TOLERANCE = math.radians(5.0)
LINEUP_TOLERANCE = 0.2                    # m, |dy|
EXPERT_DONE_ERROR = math.radians(4.0)     # the expert raises T inside the rule's 5 degrees
MIN_TURN_RATE = 0.25                      # rad/s: the expert's slowest turn, so it never stalls short


def sample(d: Draw) -> tuple[EpisodeScene, dict[str, str]]:
    letter = d.pick(LETTERS)
    d_letter = d.pick(LETTERS, exclude=(letter,))
    placements = [Placement(("letter", letter, 0), d.target), Placement(("letter", d_letter, 0), d.distractor)]
    d.params.update(target={"letter": letter}, distractor={"letter": d_letter})
    return EpisodeScene(d.params, placements, d.target, d.distractor), {"letter": letter}


def _faces(base_xy: np.ndarray, yaw: np.ndarray, point: np.ndarray) -> np.ndarray:
    """The rule for one box: within +-5 deg of the heading, or lined up (|dy| < 0.2 m)."""
    rel = point - base_xy
    bearing = np.arctan2(rel[:, 1], rel[:, 0])
    error = (bearing - yaw + np.pi) % (2 * np.pi) - np.pi
    return (np.abs(error) <= HEADING_TOLERANCE) | (np.abs(rel[:, 1]) < LINEUP_TOLERANCE)


def rule(s: RuleState, reach: np.ndarray, reach_other: np.ndarray):
    return _faces(s.base_xy, s.yaw, s.target_xy), _faces(s.base_xy, s.yaw, s.distractor_xy), None


def _heading_error(s: ExpertStep) -> torch.Tensor:
    rel = s.target - s.xy
    return wrap_angle(torch.atan2(rel[:, 1], rel[:, 0]) - s.yaw)


def turn_on_the_spot(s: ExpertStep, v: torch.Tensor, wz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    err = _heading_error(s)
    turn = torch.sign(err) * torch.clamp((YAW_GAIN * err).abs(), min=MIN_TURN_RATE, max=MAX_YAW_RATE)
    return torch.zeros_like(v), turn


def facing(s: ExpertStep) -> torch.Tensor:
    return _heading_error(s).abs() < EXPERT_DONE_ERROR


FAMILY = Family(name="distinguish", template="distinguish letter {letter}", words=(("letter", LETTERS),),
                word_keys={"letter": "letter"}, sample=sample, rule=rule,
                expert=ExpertBehaviour(command=turn_on_the_spot, done=facing))
