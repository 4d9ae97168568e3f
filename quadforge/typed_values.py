"""Whether a value given as a count, an index or a flag is one: a count of 2.5 is not silently 2, and a flag
of ``"no"`` is not silently True (``bool("no")``). Plain Python + numpy (the data layer's writers and
samplers and the trainers' configs check their arguments with it); each check is a one-line ValueError
naming the argument and the value.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def is_whole(value: Any) -> bool:
    """An int (Python or numpy) or a finite float with no fraction; never a bool (True is no count)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, numbers.Integral):
        return True
    return isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer()


def whole(value: Any, what: str) -> int:
    """``value`` as an int, or a ValueError naming ``what`` (a count, an index)."""
    if not is_whole(value):
        raise ValueError(f"{what}={value!r}: must be a whole number, got {type(value).__name__}")
    return int(value)


def count(value: Any, what: str, minimum: int = 1) -> int:
    """A whole number ``>= minimum`` (a batch size, a step count), as an int; else a ValueError naming ``what``."""
    n = whole(value, what)
    if n < minimum:
        raise ValueError(f"{what}={value!r}: must be >= {minimum}")
    return n


def whole_array(values: Any, what: str) -> np.ndarray:
    """``values`` as int64 when every entry is a whole number (integer dtype, or floats with no fraction);
    else a ValueError naming ``what`` and the first entry that is not."""
    arr = np.asarray(values)
    if np.issubdtype(arr.dtype, np.integer):
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if not bad.any():
            return arr.astype(np.int64)
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        raise ValueError(f"{what}: entry {i} is {arr.reshape(-1)[i].item()!r}, not a whole number")
    raise ValueError(f"{what}: must be whole numbers, got dtype {arr.dtype}")


def is_flag(value: Any) -> bool:
    """True/False (Python or numpy), or the integers 0 and 1 (a flag column read back as numbers)."""
    if isinstance(value, (bool, np.bool_)):
        return True
    return isinstance(value, numbers.Integral) and int(value) in (0, 1)


def flag(value: Any, what: str) -> bool:
    """``value`` as a bool, or a ValueError naming ``what``: a string such as ``"no"`` is no flag."""
    if not is_flag(value):
        raise ValueError(f"{what}={value!r}: must be True or False (or 0/1), got {type(value).__name__}")
    return bool(value)
