"""go_avoid: "go to the {object} and avoid the obstacle" - walk to the named object around a fence panel.

Scene: two objects of different kinds (the instruction names no colour) and a fence panel (0.8 m wide)
standing across the line to the target at half its distance (~1.5 m ahead). Rule: the shared reach,
and any contact between the robot and the panel fails (``obstacle_collision``, judged in ``rules``).
Expert: to a waypoint 1.25 m beside the panel (on the side away from the distractor) 0.3 m short of
it, then to one 0.4 m past it, then to the target.
"""
from __future__ import annotations

import math

import torch

from quadforge.envs.quard.family.base import Draw, EpisodeScene, ExpertBehaviour, ExpertStep, Family, Placement
from quadforge.envs.quard.words import OBJECTS

OBSTACLE_FRACTION = 0.5   # of the way to the target (about 1.5 m ahead)
AVOID_OFFSET = 1.25       # m beside the obstacle centre: the straight path from the spawn clears the panel end (0.46 m) by ~0.45 m
AVOID_BEYOND = 0.4        # m past it along the line to the target
AVOID_BEFORE = 0.3        # m short of it: the first waypoint


def sample(d: Draw) -> tuple[EpisodeScene, dict[str, str]]:
    kind = d.pick(OBJECTS)
    colour, d_colour = d.pick(d.colours), d.pick(d.colours)   # the instruction names no colour
    d_kind = d.pick(OBJECTS, exclude=(kind,))
    placements = [Placement(("object", kind, 0), d.target, 0.0, colour),
                  Placement(("object", d_kind, 1), d.distractor, 0.0, d_colour)]
    d.params.update(target={"object": kind, "colour": colour}, distractor={"object": d_kind, "colour": d_colour})
    scene = EpisodeScene(d.params, placements, d.target, d.distractor)
    (tx, ty) = d.target
    ox, oy = OBSTACLE_FRACTION * tx, OBSTACLE_FRACTION * ty
    yaw = math.atan2(ty, tx)   # the panel stands across the line to the target
    placements.append(Placement(("obstacle", "", 0), (ox, oy), yaw, None))
    scene.obstacle = (ox, oy)
    d.params["obstacle"] = [ox, oy]
    return scene, {"object": kind}


def around_the_obstacle(s: ExpertStep) -> torch.Tensor:
    """First beside the panel short of it (however the robot drifted while turning, it gets clear
    sideways before it reaches the panel's line), then beside it and a little past it, then the target."""
    line = s.target - s.obstacle
    line = line / line.norm(dim=1, keepdim=True).clamp(min=1e-6)
    normal = torch.stack((-line[:, 1], line[:, 0]), dim=1)
    side = torch.sign(((s.target - s.distractor) * normal).sum(dim=1))       # away from the distractor
    side = torch.where(side == 0, torch.ones_like(side), side)
    beside = s.obstacle + normal * (AVOID_OFFSET * side)[:, None]
    before, past = beside - line * AVOID_BEFORE, beside + line * AVOID_BEYOND
    lateral = ((s.xy - s.obstacle) * normal).sum(dim=1) * side
    progress = ((s.xy - s.obstacle) * line).sum(dim=1)
    m = s.memory
    m["cleared_side"] = m["cleared_side"] | (lateral > AVOID_OFFSET - 0.3)
    m["passed_obstacle"] = m["passed_obstacle"] | (m["cleared_side"] & (progress > AVOID_BEYOND - 0.1))
    waypoint = torch.where(m["cleared_side"][:, None], past, before)
    return torch.where((~m["passed_obstacle"])[:, None], waypoint, s.target)


FAMILY = Family(name="go_avoid", template="go to the {object} and avoid the obstacle", words=(("object", OBJECTS),),
                word_keys={"object": "object"}, sample=sample,
                expert=ExpertBehaviour(memory=("cleared_side", "passed_obstacle"), goal=around_the_obstacle))
