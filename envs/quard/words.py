"""The QUARD vocabulary: every word an instruction can hold (seed 003 Table I) and the colour sets.

Held-out colours are words of the vocabulary too, so one instruction table covers an evaluation on them.
"""
from __future__ import annotations

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
# every instruction is one family template followed by this
SUFFIX = ", {speed} with a {gait} gait"
