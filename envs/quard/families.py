"""Per-episode QUARD scenes: what each family places where, drawn from a seeded generator.

Coordinates are relative to the robot's spawn point, x forward (the robot spawns facing +x), metres.
Facts (seed 003 Table I / the public QUARD task code): the target sits x = 3 +- 0.3 ahead in one of two
lateral slots y = +-0.75 (+- 0.1), a distractor in the other; go_avoid adds an obstacle about 1.5 m
ahead on the line to the target; stop's target ball rolls toward the robot; go_through has a ball 1 m
behind each tunnel.

``sample_episode(family, rng, colours)`` returns an ``EpisodeScene``: the JSON-able task parameters
(carried with the episode into the store) and the placements the env applies. The same generator state
gives the same scene (``tools.seeding.numpy_rng(seed, name)`` per env and episode).

``swap_instruction(scene)`` is the same scene (kinds, colours, slots, obstacle, ball speed: every
placement) with the instruction naming the other object - go_to / go_avoid the distractor object, stop
the other ball, distinguish the other letter box, go_through the other tunnel - and the target and
distractor exchanged, so the rules judge the object the new instruction names (the instruction-following
measurement of issue 15). In a swapped stop scene the named ball stands still and the other one rolls;
in a swapped go_avoid scene the obstacle stands on the line to the other object.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quadforge.envs.quard.instructions import (FAMILIES, GAIT_WORDS, LETTERS, OBJECTS, SPEEDS, TUNNEL_SHAPES,
                                               instruction)
from quadforge.envs.quard.objects import TUNNEL_LENGTH

TARGET_X, TARGET_X_JITTER = 3.0, 0.3
SLOT_Y, SLOT_Y_JITTER = 0.75, 0.1
OBSTACLE_FRACTION = 0.5          # of the way to the target (about 1.5 m ahead)
BALL_SPEED = (0.2, 0.4)          # m/s, the stop ball rolling toward the robot (along -x, as the
                                 # public code's torque about y sets it rolling)
MARKER_BEHIND = 1.0              # m behind a tunnel's exit: the marker ball and go_through's goal point


@dataclass
class Placement:
    instance: tuple[str, str, int]   # ObjectLibrary key (kind, variant, copy)
    pos: tuple[float, float]          # xy relative to the spawn
    yaw: float = 0.0
    colour: str | None = None         # None: the instance's neutral colour


@dataclass
class EpisodeScene:
    params: dict[str, Any]
    placements: list[Placement]
    target: tuple[float, float]               # the point to reach / face
    distractor: tuple[float, float]
    target_vel: tuple[float, float] = (0.0, 0.0)
    distractor_vel: tuple[float, float] = (0.0, 0.0)   # the rolling ball of a swapped stop scene
    obstacle: tuple[float, float] | None = None
    tunnel_named: tuple[float, float] | None = None   # centre of the named tunnel
    tunnel_other: tuple[float, float] | None = None
    moving: int = -1                  # index into placements of the rolling ball, -1 for none
    extra: dict[str, Any] = field(default_factory=dict)


def _slots(rng: np.random.Generator) -> tuple[tuple[float, float], tuple[float, float]]:
    """Target and distractor xy: shuffled lateral slots, jittered."""
    side = 1.0 if rng.random() < 0.5 else -1.0
    out = []
    for s in (side, -side):
        x = TARGET_X + rng.uniform(-TARGET_X_JITTER, TARGET_X_JITTER)
        y = s * SLOT_Y + rng.uniform(-SLOT_Y_JITTER, SLOT_Y_JITTER)
        out.append((float(x), float(y)))
    return out[0], out[1]


def _pick(rng: np.random.Generator, options, exclude=()) -> str:
    allowed = [o for o in options if o not in exclude]
    return str(allowed[int(rng.integers(len(allowed)))])


def sample_episode(family: str, rng: np.random.Generator, colours: tuple[str, ...]) -> EpisodeScene:
    """One episode's scene of ``family``, colours drawn from ``colours`` (at least two)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown QUARD family {family!r}; allowed: {', '.join(FAMILIES)}")
    if len(set(colours)) < 2:
        raise ValueError(f"QUARD scenes need at least two colours, got {colours}")
    speed, gait = _pick(rng, SPEEDS), _pick(rng, GAIT_WORDS)
    (tx, ty), (dx, dy) = _slots(rng)
    p: dict[str, Any] = {"family": family, "speed": speed, "gait": gait,
                         "target_slot": [tx, ty], "distractor_slot": [dx, dy]}
    if family in ("go_to", "go_avoid"):
        kind = _pick(rng, OBJECTS)
        if family == "go_to":
            colour = _pick(rng, colours)
            d_colour = _pick(rng, colours, exclude=(colour,))
            # half the time the distractor is the same kind in another colour: the colour word matters
            d_kind = kind if rng.random() < 0.5 else _pick(rng, OBJECTS, exclude=(kind,))
            words = {"colour": colour, "object": kind}
        else:  # the instruction names no colour: the distractor is another kind
            colour, d_colour = _pick(rng, colours), _pick(rng, colours)
            d_kind = _pick(rng, OBJECTS, exclude=(kind,))
            words = {"object": kind}
        placements = [Placement(("object", kind, 0), (tx, ty), 0.0, colour),
                      Placement(("object", d_kind, 1), (dx, dy), 0.0, d_colour)]
        p.update(target={"object": kind, "colour": colour}, distractor={"object": d_kind, "colour": d_colour})
        scene = EpisodeScene(p, placements, (tx, ty), (dx, dy))
        if family == "go_avoid":
            ox, oy = OBSTACLE_FRACTION * tx, OBSTACLE_FRACTION * ty
            yaw = math.atan2(ty, tx)   # the panel stands across the line to the target
            placements.append(Placement(("obstacle", "", 0), (ox, oy), yaw, None))
            scene.obstacle = (ox, oy)
            p["obstacle"] = [ox, oy]
    elif family == "stop":
        colour = _pick(rng, colours)
        d_colour = _pick(rng, colours, exclude=(colour,))
        v = float(rng.uniform(*BALL_SPEED))
        placements = [Placement(("ball", "", 0), (tx, ty), 0.0, colour),
                      Placement(("ball", "", 1), (dx, dy), 0.0, d_colour)]
        words = {"colour": colour}
        p.update(target={"ball": colour}, distractor={"ball": d_colour}, ball_speed=v)
        scene = EpisodeScene(p, placements, (tx, ty), (dx, dy), target_vel=(-v, 0.0), moving=0)
    elif family == "distinguish":
        letter = _pick(rng, LETTERS)
        d_letter = _pick(rng, LETTERS, exclude=(letter,))
        placements = [Placement(("letter", letter, 0), (tx, ty)), Placement(("letter", d_letter, 0), (dx, dy))]
        words = {"letter": letter}
        p.update(target={"letter": letter}, distractor={"letter": d_letter})
        scene = EpisodeScene(p, placements, (tx, ty), (dx, dy))
    else:  # go_through
        colour = _pick(rng, colours)
        d_colour = _pick(rng, colours, exclude=(colour,))
        shape = _pick(rng, TUNNEL_SHAPES)
        d_shape = _pick(rng, TUNNEL_SHAPES, exclude=(shape,))
        behind = TUNNEL_LENGTH / 2 + MARKER_BEHIND
        goal, d_goal = (tx + behind, ty), (dx + behind, dy)
        placements = [Placement(("tunnel", shape, 0), (tx, ty), 0.0, colour),
                      Placement(("tunnel", d_shape, 0), (dx, dy), 0.0, d_colour),
                      Placement(("ball", "", 0), goal), Placement(("ball", "", 1), d_goal)]
        words = {"colour": colour, "shape": shape}
        p.update(target={"tunnel": shape, "colour": colour}, distractor={"tunnel": d_shape, "colour": d_colour},
                 goal=list(goal))
        scene = EpisodeScene(p, placements, goal, d_goal, tunnel_named=(tx, ty), tunnel_other=(dx, dy))
    p["instruction"] = instruction(family, speed, gait, **words)
    return scene


# the template's words of each family -> the key of the target / distractor dict that holds them
_WORD_KEYS = {"go_to": {"colour": "colour", "object": "object"}, "go_avoid": {"object": "object"},
              "stop": {"colour": "ball"}, "distinguish": {"letter": "letter"},
              "go_through": {"colour": "colour", "shape": "tunnel"}}


def swap_instruction(scene: EpisodeScene) -> EpisodeScene:
    """The same placements with the instruction naming the other object (module doc); the returned
    scene's params keep the original instruction under ``original_instruction``."""
    p = dict(scene.params)
    family = p["family"]
    if p.get("instruction_swapped"):
        raise ValueError(f"scene of {family} is already swapped (instruction {p['instruction']!r})")
    named, other = p["distractor"], p["target"]
    words = {slot: named[key] for slot, key in _WORD_KEYS[family].items()}
    p.update(target=named, distractor=other, target_slot=p["distractor_slot"], distractor_slot=p["target_slot"],
             original_instruction=p["instruction"], instruction=instruction(family, p["speed"], p["gait"], **words),
             instruction_swapped=True)
    if family == "go_through":
        p["goal"] = list(scene.distractor)
    if family == "stop":
        p["rolling_ball"] = "distractor"
    return EpisodeScene(p, list(scene.placements), target=scene.distractor, distractor=scene.target,
                        target_vel=scene.distractor_vel, distractor_vel=scene.target_vel, obstacle=scene.obstacle,
                        tunnel_named=scene.tunnel_other, tunnel_other=scene.tunnel_named, moving=scene.moving,
                        extra=dict(scene.extra))
