"""The QUARD family registry, and the per-episode scene drawn through it.

``FAMILIES`` is the one list of QUARD task families: name -> ``family.base.Family`` (one module each under
``envs/quard/family/``: template and words, scene, rule, time limit, the expert's behaviour). Every other
list derives from it - the instruction table (``instructions``), the rules (``rules.judge``), the
``quard:<family>`` tasks of the env builder (``tasks``), the privileged expert, ``collect --task``,
``eval --task`` and the reports. A family's code (the ``task_info`` term, ``quard_family``) is its
position here, so the registered families keep their codes when one is added. Adding a family is one
module and one ``register_family(FAMILY)``.

``sample_episode(family, rng, colours)`` returns an ``EpisodeScene``: the JSON-able task parameters
(carried with the episode into the store) and the placements the env applies. The same generator state
gives the same scene (``quadforge.seeding.numpy_rng(seed, name)`` per env and episode).

``swap_instruction(scene)`` is the same scene (kinds, colours, slots, obstacle, ball speed: every
placement) with the instruction naming the other object - go_to / go_avoid the distractor object, stop
the other ball, distinguish the other letter box, go_through the other tunnel - and the target and
distractor exchanged, so the rules judge the object the new instruction names (the instruction-following
measurement of issue 15).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from quadforge.envs.quard.family import distinguish, go_avoid, go_through, go_to, stop
from quadforge.envs.quard.family.base import Draw, EpisodeScene, Family, Placement, draw_slots
from quadforge.envs.quard.words import GAIT_WORDS, SPEEDS

__all__ = ["FAMILIES", "EpisodeScene", "Family", "Placement", "all_families", "family_code", "family_names",
           "family_of_code", "get_family", "register_family", "sample_episode", "swap_instruction"]

FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> None:
    """Make ``family`` a QUARD family everywhere (module doc); its code is the next free one."""
    family.validate()
    if family.name in FAMILIES or family.name == "all":
        raise ValueError(f"QUARD family {family.name!r} is already registered (or reserved: 'all')")
    FAMILIES[family.name] = family


for _module in (go_to, go_avoid, stop, distinguish, go_through):   # seed 003 Table I's order: codes 0-4
    register_family(_module.FAMILY)


def family_names() -> tuple[str, ...]:
    return tuple(FAMILIES)


def all_families() -> tuple[Family, ...]:
    """Every registered family, in code order."""
    return tuple(FAMILIES.values())


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown QUARD family {name!r}; allowed: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_code(name: str) -> int:
    """The family's code in the ``task_info`` term and ``quard_family``: its registry position."""
    get_family(name)
    return list(FAMILIES).index(name)


def family_of_code(code: int) -> Family:
    return all_families()[int(code)]


def sample_episode(family: str, rng: np.random.Generator, colours: tuple[str, ...]) -> EpisodeScene:
    """One episode's scene of ``family``, colours drawn from ``colours`` (at least two)."""
    fam = get_family(family)
    if len(set(colours)) < 2:
        raise ValueError(f"QUARD scenes need at least two colours, got {colours}")
    d = Draw(rng, tuple(colours), {}, (0.0, 0.0), (0.0, 0.0))
    speed, gait = d.pick(SPEEDS), d.pick(GAIT_WORDS)
    d.target, d.distractor = draw_slots(rng)
    d.params.update(family=family, speed=speed, gait=gait, target_slot=list(d.target),
                    distractor_slot=list(d.distractor))
    scene, words = fam.sample(d)
    scene.params["instruction"] = fam.instruction(speed, gait, **words)
    return scene


def swap_instruction(scene: EpisodeScene) -> EpisodeScene:
    """The same placements with the instruction naming the other object (module doc); the returned
    scene's params keep the original instruction under ``original_instruction``."""
    p: dict[str, Any] = dict(scene.params)
    fam = get_family(p["family"])
    if p.get("instruction_swapped"):
        raise ValueError(f"scene of {fam.name} is already swapped (instruction {p['instruction']!r})")
    named, other = p["distractor"], p["target"]
    words = {slot: named[key] for slot, key in fam.word_keys.items()}
    p.update(target=named, distractor=other, target_slot=p["distractor_slot"], distractor_slot=p["target_slot"],
             original_instruction=p["instruction"], instruction=fam.instruction(p["speed"], p["gait"], **words),
             instruction_swapped=True)
    out = EpisodeScene(p, list(scene.placements), target=scene.distractor, distractor=scene.target,
                       target_vel=scene.distractor_vel, distractor_vel=scene.target_vel, obstacle=scene.obstacle,
                       tunnel_named=scene.tunnel_other, tunnel_other=scene.tunnel_named, moving=scene.moving,
                       extra=dict(scene.extra))
    if fam.swap is not None:
        fam.swap(out)
    return out
