"""go_through: "go through the {colour} {shape} tunnel" - walk through the named tunnel to the ball behind it.

Scene: a rectangle and a triangle tunnel (different colours) in the two slots, a ball 1 m behind each
tunnel's exit; the point to reach is the named tunnel's ball. Rule (ours beyond seed 003): within 1.0 m
of that point only after the base was inside the named tunnel's footprint; through the other tunnel, or
at its point first, is a wrong target. Limit 15 s. Expert: to a point on the named tunnel's axis 0.9 m
before its entrance (slowing down on the last 0.8 m), turn to the axis there, then along the axis
through the tunnel (the lateral error is steered out with vy) at most 0.6 m/s.
"""
from __future__ import annotations

import numpy as np
import torch

from quadforge.envs.quard.family.base import (Draw, EpisodeScene, ExpertBehaviour, ExpertStep, Family, Placement,
                                              RuleState, within_success_radius, wrap_angle)
from quadforge.envs.quard.objects import TUNNEL_LENGTH
from quadforge.envs.quard.words import COLOURS, GAIT_WORDS, TUNNEL_SHAPES

MARKER_BEHIND = 1.0       # m behind a tunnel's exit: the marker ball and the goal point
TUNNEL_APPROACH = 0.9     # m before the tunnel entrance
APPROACH_SLOWDOWN = 0.8   # m: closer than this to the approach point the speed falls with the distance
TUNNEL_SPEED = 0.6        # m/s commanded at most inside a tunnel
TUNNEL_LOOKAHEAD = 0.5    # m: the goal point on the tunnel axis ahead of the robot
TUNNEL_MAX_YAW = 0.35     # rad: short of the entrance the speed falls to 0 at this heading error
# trot and pace coast ~0.4 m past a goal and sideways: they slow into the approach point (bound and
# pronk never get fast enough to coast, and need every second of the 15 s limit)
_COASTING_GAITS = (GAIT_WORDS.index("trotting"), GAIT_WORDS.index("pacing"))


def sample(d: Draw) -> tuple[EpisodeScene, dict[str, str]]:
    colour = d.pick(d.colours)
    d_colour = d.pick(d.colours, exclude=(colour,))
    shape = d.pick(TUNNEL_SHAPES)
    d_shape = d.pick(TUNNEL_SHAPES, exclude=(shape,))
    behind = TUNNEL_LENGTH / 2 + MARKER_BEHIND
    (tx, ty), (dx, dy) = d.target, d.distractor
    goal, d_goal = (tx + behind, ty), (dx + behind, dy)
    placements = [Placement(("tunnel", shape, 0), d.target, 0.0, colour),
                  Placement(("tunnel", d_shape, 0), d.distractor, 0.0, d_colour),
                  Placement(("ball", "", 0), goal), Placement(("ball", "", 1), d_goal)]
    d.params.update(target={"tunnel": shape, "colour": colour}, distractor={"tunnel": d_shape, "colour": d_colour},
                    goal=list(goal))
    scene = EpisodeScene(d.params, placements, goal, d_goal, tunnel_named=d.target, tunnel_other=d.distractor)
    return scene, {"colour": colour, "shape": shape}


def rule(s: RuleState, reach: np.ndarray, reach_other: np.ndarray):
    named = s.through_named
    return reach & named, (reach_other & ~named) | (s.through_other & ~named), None


def swap(scene: EpisodeScene) -> None:
    scene.params["goal"] = list(scene.target)


def along_the_axis(s: ExpertStep) -> torch.Tensor:
    """The approach point before the entrance until the robot is there (or already on the axis), then a
    point on the axis ``TUNNEL_LOOKAHEAD`` ahead of it, at most the goal."""
    entry = s.tunnel_entry
    approach = entry - torch.tensor([TUNNEL_APPROACH, 0.0], device=entry.device)
    lateral = (s.xy[:, 1] - entry[:, 1]).abs()
    s.memory["in_tunnel_phase"] = s.memory["in_tunnel_phase"] | ((s.xy - approach).norm(dim=1) < 0.2) | \
        ((lateral < 0.1) & (s.xy[:, 0] > approach[:, 0] - 0.1))
    along = torch.stack((torch.maximum(s.xy[:, 0] + TUNNEL_LOOKAHEAD, entry[:, 0]), entry[:, 1]), dim=1)
    along = torch.where((along[:, 0] > s.target[:, 0])[:, None], s.target, along)
    return torch.where(s.memory["in_tunnel_phase"][:, None], along, approach)


def tunnel_speed(s: ExpertStep, command_speed: torch.Tensor) -> torch.Tensor:
    """Inside a tunnel no faster than TUNNEL_SPEED (a fast pace sways the base into the walls), and short
    of the entrance only once the body points along the axis (a robot arriving at the approach point at
    an angle turns there instead of walking in crooked); trot and pace arrive at the approach point slowly."""
    inside = s.memory["in_tunnel_phase"]
    aligned = torch.clamp(1.0 - wrap_angle(s.yaw).abs() / TUNNEL_MAX_YAW, min=0.0)
    before_entry = s.xy[:, 0] < s.tunnel_entry[:, 0]
    in_tunnel = torch.clamp(command_speed, max=TUNNEL_SPEED) * torch.where(before_entry, aligned, 1.0)
    command_speed = torch.where(inside, in_tunnel, command_speed)
    slow = torch.clamp(s.goal_distance / APPROACH_SLOWDOWN, min=0.25, max=1.0)
    coasting = (s.gait_word == _COASTING_GAITS[0]) | (s.gait_word == _COASTING_GAITS[1])
    return torch.where(~inside & coasting, command_speed * slow, command_speed)


def through_and_past(s: ExpertStep) -> torch.Tensor:
    return within_success_radius(s) & s.memory["in_tunnel_phase"] & (s.xy[:, 0] > s.tunnel_entry[:, 0] + 0.5)


FAMILY = Family(name="go_through", template="go through the {colour} {shape} tunnel",
                words=(("colour", COLOURS), ("shape", TUNNEL_SHAPES)), word_keys={"colour": "colour", "shape": "tunnel"},
                sample=sample, time_limit_s=15.0, rule=rule, swap=swap,
                expert=ExpertBehaviour(memory=("in_tunnel_phase",), goal=along_the_axis, speed=tunnel_speed,
                                       done=through_and_past))
