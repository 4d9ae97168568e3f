"""What a QUARD task family is: the one definition every part of QUARD reads (``Family``).

A family is one module under ``envs/quard/family/`` holding one ``Family``: its instruction template and
words, its scene (``sample``: what stands where, drawn from the episode's generator), its success and
failure rule beyond the shared one (``rule``), its time limit, what a swapped instruction changes
(``swap``) and the privileged expert's behaviour on it (``expert``: torch functions the expert in
``experts/quard_expert.py`` calls for the envs running this family). ``envs/quard/families.py`` registers
the families by name; instructions, the env, the rules, the expert, collection, evaluation and the
reports all list them from there.

Coordinates are relative to the robot's spawn point, x forward (the robot spawns facing +x), metres.
Shared facts (seed 003 Table I / the public QUARD task code): the target sits x = 3 +- 0.3 ahead in one
of two lateral slots y = +-0.75 (+- 0.1), a distractor in the other; success is the base within 1.0 m
(xy) of the target, unless the family's rule says otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch

from quadforge.envs.quard.words import COLOURS, GAIT_WORDS, SPEEDS, SUFFIX

TARGET_X, TARGET_X_JITTER = 3.0, 0.3
SLOT_Y, SLOT_Y_JITTER = 0.75, 0.1
SUCCESS_RADIUS = 1.0                      # m
# the privileged expert's steering, shared by every family's behaviour (rad/s per rad, rad/s)
YAW_GAIN, MAX_YAW_RATE = 1.5, 1.0


# --------------------------------------------------------------------------------------------- scenes
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
    distractor_vel: tuple[float, float] = (0.0, 0.0)
    obstacle: tuple[float, float] | None = None
    tunnel_named: tuple[float, float] | None = None   # centre of the named tunnel
    tunnel_other: tuple[float, float] | None = None
    moving: int = -1                  # index into placements of the rolling ball, -1 for none
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Draw:
    """What every family's scene shares, drawn before the family's own part (``families.sample_episode``):
    the generator, the colours allowed, the two jittered slots and the params so far (family, speed and
    gait words, slots). A family's ``sample`` adds its objects to ``params`` and returns the scene."""

    rng: np.random.Generator
    colours: tuple[str, ...]
    params: dict[str, Any]
    target: tuple[float, float]        # the named object's slot
    distractor: tuple[float, float]    # the other slot

    def pick(self, options, exclude=()) -> str:
        allowed = [o for o in options if o not in exclude]
        return str(allowed[int(self.rng.integers(len(allowed)))])


def draw_slots(rng: np.random.Generator) -> tuple[tuple[float, float], tuple[float, float]]:
    """Target and distractor xy: shuffled lateral slots, jittered."""
    side = 1.0 if rng.random() < 0.5 else -1.0
    out = []
    for s in (side, -side):
        x = TARGET_X + rng.uniform(-TARGET_X_JITTER, TARGET_X_JITTER)
        y = s * SLOT_Y + rng.uniform(-SLOT_Y_JITTER, SLOT_Y_JITTER)
        out.append((float(x), float(y)))
    return out[0], out[1]


# --------------------------------------------------------------------------------------------- rules
@dataclass
class RuleState:
    """One step of N envs, xy relative to each env's spawn point (m), yaw in rad."""

    family: np.ndarray          # (N,) int, the registry's family codes (``families.family_code``)
    base_xy: np.ndarray         # (N, 2)
    yaw: np.ndarray             # (N,)
    target_xy: np.ndarray       # (N, 2) the point to reach / face (the ball's current position for stop)
    distractor_xy: np.ndarray   # (N, 2)
    through_named: np.ndarray   # (N,) bool: the base has been inside the named tunnel (go_through)
    through_other: np.ndarray   # (N,) bool: ... inside the other tunnel
    obstacle_contact: np.ndarray  # (N,) bool: robot touching the obstacle this step
    time_s: np.ndarray          # (N,) episode time after this step


# (state, reached the target, reached the other object) by the shared rule (within SUCCESS_RADIUS) ->
# the family's (reached target, reached other, missed or None), over all N rows (``rules.judge`` keeps
# the family's rows)
Rule = Callable[[RuleState, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, "np.ndarray | None"]]


# --------------------------------------------------------------------------------------------- the expert
@dataclass
class ExpertStep:
    """One control step of the privileged expert, for the k envs that run one family: what its behaviour
    reads (world xy, rad, m/s) and its per-env ``memory`` (the family's flags, False at each episode's
    start; a behaviour replaces an entry to change it)."""

    xy: torch.Tensor            # (k, 2) base position
    yaw: torch.Tensor           # (k,)
    target: torch.Tensor        # (k, 2) the named object's point (the ball's current position for stop)
    distractor: torch.Tensor    # (k, 2)
    target_vel: torch.Tensor    # (k, 2)
    obstacle: torch.Tensor      # (k, 2) zero where the family has none
    tunnel_entry: torch.Tensor  # (k, 2) the named tunnel's entrance, zero where none
    band: torch.Tensor          # (k,) the ground speed the speed word asks for, m/s
    gait_word: torch.Tensor     # (k,) long, index into GAIT_WORDS
    memory: dict[str, torch.Tensor]
    goal_distance: torch.Tensor | None = None   # (k,) to this step's goal, set once the goal is chosen


def walk_to_target(s: ExpertStep) -> torch.Tensor:
    return s.target


def within_success_radius(s: ExpertStep) -> torch.Tensor:
    return (s.target - s.xy).norm(dim=1) < SUCCESS_RADIUS


@dataclass(frozen=True)
class ExpertBehaviour:
    """The privileged expert on one family. Every step it walks at ``goal`` (turning toward it, the
    speed falling with the bearing error); ``speed`` may reshape the commanded speed before that,
    ``command`` replace the (k, 2) ground velocity and (k,) yaw rate after it; ``done`` raises T."""

    memory: tuple[str, ...] = ()
    goal: Callable[[ExpertStep], torch.Tensor] = walk_to_target
    speed: Callable[[ExpertStep, torch.Tensor], torch.Tensor] | None = None
    command: Callable[[ExpertStep, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    done: Callable[[ExpertStep], torch.Tensor] = within_success_radius


def wrap_angle(a: torch.Tensor) -> torch.Tensor:
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


# --------------------------------------------------------------------------------------------- the family
@dataclass(frozen=True, eq=False)
class Family:
    """One QUARD task family (module doc). ``words`` are the template's words with the values each may
    take, in instruction-table order; ``word_keys`` maps each word to the key of the scene's
    ``target`` / ``distractor`` dict that holds it (a swapped instruction names the distractor's)."""

    name: str
    template: str
    words: tuple[tuple[str, tuple[str, ...]], ...]
    word_keys: Mapping[str, str]
    sample: Callable[[Draw], tuple[EpisodeScene, dict[str, str]]]   # -> the scene and the template's words
    time_limit_s: float = 20.0
    rule: Rule | None = None                       # None: the shared rule (reach within SUCCESS_RADIUS)
    swap: Callable[[EpisodeScene], None] | None = None   # the family's own params of a swapped scene
    expert: ExpertBehaviour = ExpertBehaviour()

    def validate(self) -> "Family":
        if not self.name.isidentifier():
            raise ValueError(f"QUARD family name {self.name!r}: use letters, digits and '_'")
        slots = {w for w, _ in self.words}
        for w in slots:
            if "{" + w + "}" not in self.template:
                raise ValueError(f"QUARD family {self.name}: word {w!r} is not in its template {self.template!r}")
        if set(self.word_keys) != slots:
            raise ValueError(f"QUARD family {self.name}: word_keys {sorted(self.word_keys)} must name its words "
                             f"{sorted(slots)}")
        if not self.time_limit_s > 0:
            raise ValueError(f"QUARD family {self.name}: time_limit_s={self.time_limit_s}; must be > 0")
        return self

    @property
    def names_colour(self) -> bool:
        """Whether the instruction names a colour (a word drawn from ``COLOURS``). Only then is an episode
        on the held-out colours a test of colour words the policy never read: distinguish (letters) and
        go_avoid (objects) are only re-tinted by them, the instruction the same."""
        return any(set(values) & set(COLOURS) for _, values in self.words)

    def instruction(self, speed: str, gait: str, **words: str) -> str:
        """The instruction text: ``GO_TO.instruction("slowly", "trotting", colour="red", object="cube")`` ->
        "go to the red cube, slowly with a trotting gait"."""
        if speed not in SPEEDS:
            raise ValueError(f"unknown speed word {speed!r}; allowed: {', '.join(SPEEDS)}")
        if gait not in GAIT_WORDS:
            raise ValueError(f"unknown gait word {gait!r}; allowed: {', '.join(GAIT_WORDS)}")
        for slot, allowed in self.words:
            if words.get(slot) not in allowed:
                raise ValueError(f"{self.name}: {slot}={words.get(slot)!r}; allowed: {', '.join(allowed)}")
        return self.template.format(**words) + SUFFIX.format(speed=speed, gait=gait)
