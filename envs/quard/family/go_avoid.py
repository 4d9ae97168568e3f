"""go_avoid: "go to the {object} and avoid the obstacle" - walk to the named object without touching a fence panel.

Scene: two objects of different kinds (the instruction names no colour) and a fence panel (0.8 m wide,
0.45 m high) standing across the line to one of them at half its distance (~1.5 m ahead): the named
object or the other with equal probability (``params["obstacle_on"]``: "target" or "distractor"). Rule:
the shared reach, and any contact between the robot and the panel fails (``obstacle_collision``, judged
in ``rules``). Expert: to a waypoint 1.25 m beside the panel (on the named object's side, away from the
distractor) 0.3 m short of it, then to one 0.4 m past it, then to the target - around the panel when it
blocks the way, and on a path clear of its end when it stands before the other object.

Why either object (issue 24): seed 003 puts the panel on the line to the named object, so the picture
alone told which object was meant - the one behind the panel - and a policy trained on it walked to
whichever object stood behind the panel, ignoring the words. Before either object with equal
probability, the panel says nothing about the name; the task stays "reach the named object without
touching the panel" - going around it when it blocks the way, passing it (the line to the named object
runs 0.2-0.5 m off its end) when it does not. A panel midway between the two objects would hide the name
too, but from the spawn it hides both objects (the camera looks over it only above ~0.6 m at 3 m: a
cube is not seen at all), so a policy could not see where the named object is before it must choose
its side; here one object is always in full view.
"""
from __future__ import annotations

import math

import torch

from quadforge.envs.quard.family.base import Draw, EpisodeScene, ExpertBehaviour, ExpertStep, Family, Placement
from quadforge.envs.quard.words import OBJECTS

OBSTACLE_FRACTION = 0.5   # of the way to the object it stands before (about 1.5 m ahead)
BEFORE_NAMED = 0.5        # the probability that the panel stands before the named object
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
    before_named = bool(d.rng.random() < BEFORE_NAMED)
    bx, by = d.target if before_named else d.distractor
    ox, oy = OBSTACLE_FRACTION * bx, OBSTACLE_FRACTION * by
    yaw = math.atan2(by, bx)   # the panel stands across the line to that object
    placements.append(Placement(("obstacle", "", 0), (ox, oy), yaw, None))
    scene.obstacle = (ox, oy)
    d.params.update(obstacle=[ox, oy], obstacle_on="target" if before_named else "distractor")
    return scene, {"object": kind}


def swap(scene: EpisodeScene) -> None:
    scene.params["obstacle_on"] = {"target": "distractor", "distractor": "target"}[scene.params["obstacle_on"]]


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
                word_keys={"object": "object"}, sample=sample, swap=swap,
                expert=ExpertBehaviour(memory=("cleared_side", "passed_obstacle"), goal=around_the_obstacle))
