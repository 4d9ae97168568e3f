"""Whether a value is of the kind it is given as, the one place such checks live. Plain Python + numpy;
each check is a one-line ValueError naming the argument (or field) and the value.

- A function's arguments (``count``, ``whole``, ``flag``, ...): a count of 2.5 is not silently 2, and a
  flag of ``"no"`` is not silently True (``bool("no")``); a float with no fraction (3.0) is taken as the
  count 3, since the argument is converted. The data layer's writers and samplers and the trainers'
  configs check their arguments with them.
- A dataclass config's fields (``check_field_types``), against their annotations: the hand-written
  ``validate()`` methods test ranges (``lo <= hi``, ``> 0``); a NaN passes every such comparison written
  as a negative test, an ``inf`` episode length overflows deep in the env, a bool passes
  ``isinstance(v, int)``, and a reward scale is never compared at all. Refused, naming the field: a
  ``float`` field that is not a finite real number; an ``int`` field that is not an integer (here 3.0 is
  refused too: a field keeps the value it is given, and the code reading it expects an int); a ``bool``
  field that is not True/False; a ``str`` field that is not a string; a ``tuple[...]``/``dict[...]``
  field whose shape or entries are not what the annotation says (``(0.5, 1)`` for ``tuple[int, int]``,
  a NaN scale in ``dict[str, float]``). Annotations it does not read (a class name, ``Any``,
  ``object``) are left to that field's own checks.
"""
from __future__ import annotations

import dataclasses
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


# --- a dataclass config's fields against their annotations ---------------------------------------------
_WORDS = {"bool": "True or False", "int": "an integer", "float": "a finite number", "str": "a string",
          "None": "None"}


def check_field_types(cfg: Any, where: str = "") -> None:
    """A one-line ValueError naming the first field of ``cfg`` (recursively) whose value does not fit its
    annotation; ``where`` prefixes the field names (e.g. ``"EnvConfig."``)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        name = f"{where}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_field_types(value, f"{name}.")
        elif isinstance(f.type, str):
            misfit = _misfit(value, f.type, name)
            if misfit is not None:
                at, bad, allowed = misfit
                raise ValueError(f"{at}={bad!r} is invalid; allowed: {allowed}")


def _misfit(value: Any, annotation: str, where: str) -> tuple[str, Any, str] | None:
    """None when ``value`` fits ``annotation``; else (the innermost place, its value, what is allowed)."""
    options = [_parse(alt) for alt in _split(annotation, "|")]
    inner = None
    for name, args in options:
        if _fits(value, name, args):
            return None
        if inner is None and args and isinstance(value, (tuple, list, dict)):
            inner = _misfit_inside(value, name, args, where)
    return inner or (where, value, " or ".join(_describe(n, a) for n, a in options))


def _fits(value: Any, name: str, args: list[str]) -> bool:
    if name == "None":
        return value is None
    if name == "bool":
        return isinstance(value, (bool, np.bool_))
    if isinstance(value, (bool, np.bool_)):
        return name not in ("int", "float", "str", "tuple", "dict")
    if name == "int":
        return isinstance(value, numbers.Integral)
    if name == "float":
        return isinstance(value, numbers.Real) and math.isfinite(value)
    if name == "str":
        return isinstance(value, str)
    if name == "tuple":
        if not isinstance(value, (tuple, list)):
            return False
        if not args:
            return True
        if len(args) == 2 and args[1] == "...":
            return all(_misfit(v, args[0], "") is None for v in value)
        return len(value) == len(args) and all(_misfit(v, a, "") is None for v, a in zip(value, args))
    if name == "dict":
        if not isinstance(value, dict):
            return False
        return not args or all(_misfit(k, args[0], "") is None and _misfit(v, args[1], "") is None
                               for k, v in value.items())
    return True   # a class, Any, object, a callable: the field's own validate() checks it


def _misfit_inside(value: Any, name: str, args: list[str], where: str) -> tuple[str, Any, str] | None:
    """The entry of a container that has the annotation's shape but holds a bad value."""
    if name == "dict" and isinstance(value, dict) and len(args) == 2:
        for k, v in value.items():
            found = _misfit(v, args[1], f"{where}[{k!r}]")
            if found:
                return found
    if name == "tuple" and isinstance(value, (tuple, list)):
        fixed = not (len(args) == 2 and args[1] == "...")
        if fixed and len(value) != len(args):
            return None
        for i, v in enumerate(value):
            found = _misfit(v, args[i] if fixed else args[0], f"{where}[{i}]")
            if found:
                return found
    return None


def _describe(name: str, args: list[str]) -> str:
    if name in _WORDS:
        return _WORDS[name]
    if name in ("tuple", "dict") and args:
        return f"{name}[{', '.join(args)}] (numbers finite)"
    return name


def _parse(text: str) -> tuple[str, list[str]]:
    """``"tuple[float, float]"`` -> ("tuple", ["float", "float"])."""
    head, _, rest = text.strip().partition("[")
    return head.strip().removeprefix("typing."), (_split(rest[:-1], ",") if rest else [])


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts
