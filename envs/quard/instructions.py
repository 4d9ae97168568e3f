"""QUARD instructions: the text of a task, the instruction table, and the parse back.

Every instruction is one family's template (``Family.template``, registered in ``envs.quard.families``)
followed by ", {speed} with a {gait} gait"; seed 003 Table I's five:

    go_to        "go to the {colour} {object}"
    go_avoid     "go to the {object} and avoid the obstacle"
    stop         "stop the {colour} ball"
    distinguish  "distinguish letter {letter}"
    go_through   "go through the {colour} {shape} tunnel"

The instruction table of a task is every string its families can produce, in a fixed order (family in
registry order, then the template's words in the order of their value lists, then speed, then gait);
the ``instruction`` observation term is an index into it and the store keeps the same table. Held-out
colours are in the table too, so an evaluation on them needs no other table.
"""
from __future__ import annotations

import functools
import itertools
import re
from typing import Any

from quadforge.envs.quard.families import Family, family_names, get_family
from quadforge.envs.quard.words import (COLOURS, GAIT_OF_WORD, GAIT_WORDS, HELD_OUT_COLOURS, LETTERS,  # noqa: F401
                                        OBJECTS, SPEEDS, SUFFIX, TRAIN_COLOURS, TUNNEL_SHAPES)


def task_families(task: str) -> tuple[str, ...]:
    """The families of a task name: ``quard:<family>`` or ``quard:all`` (every registered family)."""
    names = family_names()
    if not task.startswith("quard:"):
        raise ValueError(f"task {task!r} is not a QUARD task; allowed: quard:all, "
                         + ", ".join(f"quard:{f}" for f in names))
    name = task.split(":", 1)[1]
    if name == "all":
        return names
    if name not in names:
        raise ValueError(f"unknown QUARD family {name!r} in task {task!r}; allowed: all, {', '.join(names)}")
    return (name,)


def quard_tasks() -> tuple[str, ...]:
    """Every QUARD task name: ``quard:<family>`` per registered family, then ``quard:all``."""
    return tuple(f"quard:{f}" for f in family_names()) + ("quard:all",)


def instruction(family: str, speed: str, gait: str, **words: str) -> str:
    """The instruction text of one task: ``instruction("go_to", "slowly", "trotting", colour="red",
    object="cube")`` -> "go to the red cube, slowly with a trotting gait"."""
    return get_family(family).instruction(speed, gait, **words)


def instruction_table(families: tuple[str, ...] | None = None) -> list[str]:
    """Every instruction of these families (default: every registered one), in the fixed table order
    (see the module doc)."""
    table = []
    for name in family_names() if families is None else families:
        fam = get_family(name)
        for values in itertools.product(*(allowed for _, allowed in fam.words)):
            words = dict(zip((slot for slot, _ in fam.words), values))
            for speed, gait in itertools.product(SPEEDS, GAIT_WORDS):
                table.append(fam.instruction(speed, gait, **words))
    return table


@functools.lru_cache(maxsize=None)
def _pattern(fam: Family) -> re.Pattern:
    body = re.escape(fam.template)
    for slot, allowed in fam.words:
        body = body.replace(re.escape("{" + slot + "}"), f"(?P<{slot}>{'|'.join(allowed)})")
    suffix = f", (?P<speed>{'|'.join(SPEEDS)}) with a (?P<gait>{'|'.join(GAIT_WORDS)}) gait"
    return re.compile(f"^{body}{suffix}$")


def parse_instruction(text: str) -> dict[str, Any]:
    """The task parameters an instruction names: ``{"family", "speed", "gait", <template words>}``;
    case and surrounding blanks are ignored; ValueError naming the text when it fits no template."""
    norm = " ".join(str(text).strip().lower().rstrip(".").split())
    for name in family_names():
        m = _pattern(get_family(name)).match(norm)
        if m:
            return {"family": name, **m.groupdict()}
    raise ValueError(f"instruction {text!r} fits no QUARD template; templates: "
                     + "; ".join(get_family(f).template + SUFFIX for f in family_names()))
