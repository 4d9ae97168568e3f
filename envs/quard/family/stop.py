"""stop: "stop the {colour} ball" - meet the named ball (seed 003 Table I).

Scene: two balls (r 0.2 m) of different colours; the named one rolls toward the robot along -x at
0.2-0.4 m/s (kinematic, turning as it rolls; the public code's torque about y sets it rolling). Rule
(ours beyond seed 003): within 1.0 m of the ball only while it is still ``STOP_MEET_X`` = 1 m ahead of
the spawn (the robot went to meet it); a named ball that rolls past that line un-met is ``missed``.
Without this a robot standing still succeeds, since the ball rolls by at |y| ~ 0.75 m < 1 m. The other
ball likewise counts as met only while it is ahead of that line. Expert: intercept - aim where the ball
will be when the robot can get there (constant ball velocity, the robot at its speed band).
"""
from __future__ import annotations

import numpy as np
import torch

from quadforge.envs.quard.family.base import (Draw, EpisodeScene, ExpertBehaviour, ExpertStep, Family, Placement,
                                              RuleState)
from quadforge.envs.quard.words import COLOURS

BALL_SPEED = (0.2, 0.4)   # m/s, the rolling ball toward the robot (along -x)
STOP_MEET_X = 1.0         # m ahead of the spawn


def sample(d: Draw) -> tuple[EpisodeScene, dict[str, str]]:
    colour = d.pick(d.colours)
    d_colour = d.pick(d.colours, exclude=(colour,))
    v = float(d.rng.uniform(*BALL_SPEED))
    placements = [Placement(("ball", "", 0), d.target, 0.0, colour),
                  Placement(("ball", "", 1), d.distractor, 0.0, d_colour)]
    d.params.update(target={"ball": colour}, distractor={"ball": d_colour}, ball_speed=v)
    scene = EpisodeScene(d.params, placements, d.target, d.distractor, target_vel=(-v, 0.0), moving=0)
    return scene, {"colour": colour}


def rule(s: RuleState, reach: np.ndarray, reach_other: np.ndarray):
    ahead = s.target_xy[:, 0] >= STOP_MEET_X
    reach = reach & ahead
    return reach, reach_other & (s.distractor_xy[:, 0] >= STOP_MEET_X), ~ahead & ~reach


def swap(scene: EpisodeScene) -> None:
    scene.params["rolling_ball"] = "distractor"


def intercept(s: ExpertStep) -> torch.Tensor:
    lead = (s.target - s.xy).norm(dim=1) / (s.band + s.target_vel.norm(dim=1)).clamp(min=1e-3)
    return s.target + s.target_vel * lead[:, None]


FAMILY = Family(name="stop", template="stop the {colour} ball", words=(("colour", COLOURS),),
                word_keys={"colour": "ball"}, sample=sample, rule=rule, swap=swap,
                expert=ExpertBehaviour(goal=intercept))
