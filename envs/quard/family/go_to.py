"""go_to: "go to the {colour} {object}" - walk to the named object (seed 003 Table I).

Scene: the named object and a distractor; half the time the distractor is the same kind in another
colour, so the colour word matters, else another kind. Rule and expert: the shared ones (reach within
1.0 m; walk at the target).
"""
from __future__ import annotations

from quadforge.envs.quard.family.base import Draw, EpisodeScene, Family, Placement
from quadforge.envs.quard.words import COLOURS, OBJECTS


def sample(d: Draw) -> tuple[EpisodeScene, dict[str, str]]:
    kind = d.pick(OBJECTS)
    colour = d.pick(d.colours)
    d_colour = d.pick(d.colours, exclude=(colour,))
    d_kind = kind if d.rng.random() < 0.5 else d.pick(OBJECTS, exclude=(kind,))
    placements = [Placement(("object", kind, 0), d.target, 0.0, colour),
                  Placement(("object", d_kind, 1), d.distractor, 0.0, d_colour)]
    d.params.update(target={"object": kind, "colour": colour}, distractor={"object": d_kind, "colour": d_colour})
    return EpisodeScene(d.params, placements, d.target, d.distractor), {"colour": colour, "object": kind}


FAMILY = Family(name="go_to", template="go to the {colour} {object}",
                words=(("colour", COLOURS), ("object", OBJECTS)), word_keys={"colour": "colour", "object": "object"},
                sample=sample)
