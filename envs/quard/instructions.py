"""QUARD instructions: the templates of seed 003 Table I, the instruction table, and the parse back.

Every instruction is one family template followed by ", {speed} with a {gait} gait":

    go_to        "go to the {colour} {object}"
    go_avoid     "go to the {object} and avoid the obstacle"
    stop         "stop the {colour} ball"
    distinguish  "distinguish letter {letter}"
    go_through   "go through the {colour} {shape} tunnel"

The instruction table of a task is every string its families can produce, in a fixed order (family,
then the template's words in the order of the lists below, then speed, then gait); the ``instruction``
observation term is an index into it and the store keeps the same table. Held-out colours are in the
table too, so an evaluation on them needs no other table.
"""
from __future__ import annotations

import itertools
import re
from typing import Any

FAMILIES = ("go_to", "go_avoid", "stop", "distinguish", "go_through")
TRAIN_COLOURS = ("blue", "green", "red", "yellow")
HELD_OUT_COLOURS = ("gold", "orange", "pink", "purple")
COLOURS = TRAIN_COLOURS + HELD_OUT_COLOURS
# objects built from primitives in envs/quard/objects.py
OBJECTS = ("cube", "chair", "table", "trashcan", "sofa", "barrel")
LETTERS = ("a", "b", "c", "d", "e", "f")
TUNNEL_SHAPES = ("rectangle", "triangle")
SPEEDS = ("slowly", "normally", "quickly")
GAIT_WORDS = ("trotting", "bounding", "pacing", "pronking")
# gait word -> the gait controller's named gait (walk-these-ways phase, offset, bound)
GAIT_OF_WORD = {"trotting": "trot", "bounding": "bound", "pacing": "pace", "pronking": "pronk"}

TEMPLATES = {
    "go_to": "go to the {colour} {object}",
    "go_avoid": "go to the {object} and avoid the obstacle",
    "stop": "stop the {colour} ball",
    "distinguish": "distinguish letter {letter}",
    "go_through": "go through the {colour} {shape} tunnel",
}
SUFFIX = ", {speed} with a {gait} gait"
# the words each template takes, in table order
_SLOTS = {
    "go_to": (("colour", COLOURS), ("object", OBJECTS)),
    "go_avoid": (("object", OBJECTS),),
    "stop": (("colour", COLOURS),),
    "distinguish": (("letter", LETTERS),),
    "go_through": (("colour", COLOURS), ("shape", TUNNEL_SHAPES)),
}


def task_families(task: str) -> tuple[str, ...]:
    """The families of a task name: ``quard:<family>`` or ``quard:all``."""
    if not task.startswith("quard:"):
        raise ValueError(f"task {task!r} is not a QUARD task; allowed: quard:all, "
                         + ", ".join(f"quard:{f}" for f in FAMILIES))
    name = task.split(":", 1)[1]
    if name == "all":
        return FAMILIES
    if name not in FAMILIES:
        raise ValueError(f"unknown QUARD family {name!r} in task {task!r}; allowed: all, {', '.join(FAMILIES)}")
    return (name,)


def instruction(family: str, speed: str, gait: str, **words: str) -> str:
    """The instruction text of one task: ``instruction("go_to", "slowly", "trotting", colour="red",
    object="cube")`` -> "go to the red cube, slowly with a trotting gait"."""
    if family not in TEMPLATES:
        raise ValueError(f"unknown QUARD family {family!r}; allowed: {', '.join(FAMILIES)}")
    if speed not in SPEEDS:
        raise ValueError(f"unknown speed word {speed!r}; allowed: {', '.join(SPEEDS)}")
    if gait not in GAIT_WORDS:
        raise ValueError(f"unknown gait word {gait!r}; allowed: {', '.join(GAIT_WORDS)}")
    for slot, allowed in _SLOTS[family]:
        if words.get(slot) not in allowed:
            raise ValueError(f"{family}: {slot}={words.get(slot)!r}; allowed: {', '.join(allowed)}")
    return TEMPLATES[family].format(**words) + SUFFIX.format(speed=speed, gait=gait)


def instruction_table(families: tuple[str, ...] = FAMILIES) -> list[str]:
    """Every instruction of these families, in the fixed table order (see the module doc)."""
    table = []
    for family in families:
        slots = _SLOTS[family]
        for values in itertools.product(*(allowed for _, allowed in slots)):
            words = dict(zip((name for name, _ in slots), values))
            for speed, gait in itertools.product(SPEEDS, GAIT_WORDS):
                table.append(instruction(family, speed, gait, **words))
    return table


def _pattern(family: str) -> re.Pattern:
    body = re.escape(TEMPLATES[family])
    for slot, allowed in _SLOTS[family]:
        body = body.replace(re.escape("{" + slot + "}"), f"(?P<{slot}>{'|'.join(allowed)})")
    suffix = re.escape(", ").replace(r"\ ", " ") + f"(?P<speed>{'|'.join(SPEEDS)}) with a (?P<gait>{'|'.join(GAIT_WORDS)}) gait"
    return re.compile(f"^{body}{suffix}$")


_PATTERNS = {family: _pattern(family) for family in FAMILIES}


def parse_instruction(text: str) -> dict[str, Any]:
    """The task parameters an instruction names: ``{"family", "speed", "gait", <template words>}``;
    case and surrounding blanks are ignored; ValueError naming the text when it fits no template."""
    norm = " ".join(str(text).strip().lower().rstrip(".").split())
    for family, pat in _PATTERNS.items():
        m = pat.match(norm)
        if m:
            return {"family": family, **m.groupdict()}
    raise ValueError(f"instruction {text!r} fits no QUARD template; templates: "
                     + "; ".join(t + SUFFIX for t in TEMPLATES.values()))
