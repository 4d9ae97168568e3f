"""stop: "stop the {colour} ball" - meet the named ball (seed 003 Table I).

Scene: two balls (r 0.2 m) of different colours; one rolls toward the robot along -x at 0.2-0.4 m/s
(kinematic, turning as it rolls; the public code's torque about y sets it rolling) - the named one or
the other with equal probability (``params["rolling_ball"]``: "target" or "distractor"). Rule (ours
beyond seed 003): within 1.0 m of the named ball only while it is still ``STOP_MEET_X`` = 1 m ahead of
the spawn (the robot went to meet it); a named ball that rolls past that line un-met is ``missed``.
Without this a robot standing still succeeds, since the ball rolls by at |y| ~ 0.75 m < 1 m. The other
ball likewise counts as met only while it is ahead of that line (meeting it is a wrong target).
Expert: intercept - aim where the named ball will be when the robot can get there (constant ball
velocity, the robot at its speed band); a named ball that stands still it approaches from the side
away from the rolling one, so that it passes the rolling ball more than 1 m off.

Why either ball rolls (issue 24): seed 003 rolls the named ball, so the picture alone told which ball
was meant - the moving one - and a policy trained on it chased whatever rolled, ignoring the colour
word. Rolling either with equal probability leaves only the word to tell them apart; every episode still
has a ball rolling at the robot, and "stop the ball" stays meaningful both ways: meet the named ball
before it passes the line, and never meet the other one while it is ahead of it (a still named ball is
the swapped-instruction scene, which the rule and the expert already served).
"""
from __future__ import annotations

import numpy as np
import torch

from quadforge.envs.quard.family.base import (Draw, EpisodeScene, ExpertBehaviour, ExpertStep, Family, Placement,
                                              RuleState)
from quadforge.envs.quard.words import COLOURS

BALL_SPEED = (0.2, 0.4)   # m/s, the rolling ball toward the robot (along -x)
STOP_MEET_X = 1.0         # m ahead of the spawn
NAMED_ROLLS = 0.5         # the probability that the named ball is the rolling one
# m: a still named ball is approached at a point this far beside it, away from the rolling ball: walking
# straight at a ball 0.65 m off the axis, a slow gait crosses the rolling one (in the other slot) < 1 m off
AVOID_ROLLING = 0.5


def sample(d: Draw) -> tuple[EpisodeScene, dict[str, str]]:
    colour = d.pick(d.colours)
    d_colour = d.pick(d.colours, exclude=(colour,))
    v = float(d.rng.uniform(*BALL_SPEED))
    named_rolls = bool(d.rng.random() < NAMED_ROLLS)
    placements = [Placement(("ball", "", 0), d.target, 0.0, colour),
                  Placement(("ball", "", 1), d.distractor, 0.0, d_colour)]
    d.params.update(target={"ball": colour}, distractor={"ball": d_colour}, ball_speed=v,
                    rolling_ball="target" if named_rolls else "distractor")
    rolling = {"target_vel": (-v, 0.0), "moving": 0} if named_rolls else {"distractor_vel": (-v, 0.0), "moving": 1}
    return EpisodeScene(d.params, placements, d.target, d.distractor, **rolling), {"colour": colour}


def rule(s: RuleState, reach: np.ndarray, reach_other: np.ndarray):
    ahead = s.target_xy[:, 0] >= STOP_MEET_X
    reach = reach & ahead
    return reach, reach_other & (s.distractor_xy[:, 0] >= STOP_MEET_X), ~ahead & ~reach


def swap(scene: EpisodeScene) -> None:
    scene.params["rolling_ball"] = {"target": "distractor", "distractor": "target"}[scene.params["rolling_ball"]]


def intercept(s: ExpertStep) -> torch.Tensor:
    """Where the rolling named ball will be when the robot gets there; beside a still one (module doc)."""
    speed = s.target_vel.norm(dim=1)
    lead = (s.target - s.xy).norm(dim=1) / (s.band + speed).clamp(min=1e-3)
    away = torch.sign(s.target[:, 1] - s.distractor[:, 1])[:, None] * s.target.new_tensor([0.0, AVOID_ROLLING])
    return torch.where((speed > 0)[:, None], s.target + s.target_vel * lead[:, None], s.target + away)


FAMILY = Family(name="stop", template="stop the {colour} ball", words=(("colour", COLOURS),),
                word_keys={"colour": "ball"}, sample=sample, rule=rule, swap=swap,
                expert=ExpertBehaviour(goal=intercept))
