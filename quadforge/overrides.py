"""`key=value` command-line overrides: the one parser and the one typed setter, shared by every CLI.

``parse_overrides(["lr=3e-4", "env.commands.ranges.lin_vel_x=(0.0, 1.0)"])`` reads each value as a
Python literal (a bare word stays a string); ``apply_overrides(cfg, overrides)`` sets (dotted) fields of a
dataclass config, checking each value against the field it replaces: an int field takes an integer
(``batch_size=64.5`` is an error), a float field a number (``lr=fast`` is an error), a bool field
``True``/``False`` (``tensorboard=maybe`` is refused), a tuple field a list/tuple, bare words split at
commas (``families=go_to,stop``) or one value, a str field any word. Unknown fields are errors naming the allowed ones, so a typo never silently does nothing.
A frozen dataclass is not changed in place: the result is a new instance.
"""
from __future__ import annotations

import ast
import dataclasses
import typing
from typing import Any


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["lr=3e-4", "env.commands.ranges.lin_vel_x=(0.0, 1.0)"]`` -> {key: python value}.

    Values are Python literals; a bare word (``activation=relu``) stays a string."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} is not key=value (e.g. lr=3e-4 or env.<path>=<value>)")
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip()
        out[key.strip()] = value
    return out


def _kind_of(current: Any, annotation: Any) -> str | None:
    """bool | int | float | str | tuple | dict | None (anything goes) for the field's current value/type."""
    if dataclasses.is_dataclass(current):
        return None                      # a whole sub-config (e.g. RandomizationConfig.off()) replaces it
    for t, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (tuple, "tuple"), (dict, "dict")):
        if isinstance(current, t):
            return name
    if current is not None or annotation is None:
        return None
    text = annotation if isinstance(annotation, str) else str(annotation)
    words = set(text.replace("|", " ").replace("[", " ").replace("]", " ").replace(",", " ").split())
    for name in ("bool", "float", "int", "str", "tuple", "dict"):  # float before int: "float | int"
        if name in words or f"typing.{name.title()}" in words or f"<class '{name}'>" in text:
            return name
    return None


def coerce(key: str, value: Any, current: Any, annotation: Any = None) -> Any:
    """``value`` as the type of the field it replaces; a one-line ValueError when it is not one."""
    optional = current is None or "None" in str(annotation) or "Optional" in str(annotation)
    if value is None:
        if optional:
            return None
        raise ValueError(f"override {key}=None is invalid; the field is not optional (now {current!r})")
    kind = _kind_of(current, annotation)

    def bad(what: str) -> ValueError:
        return ValueError(f"override {key}={value!r} is invalid; allowed: {what} (the field is now {current!r})")

    if kind == "bool":
        if not isinstance(value, bool):
            raise bad("True or False")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if kind == "str":
        if isinstance(value, (list, tuple, dict)):
            raise bad("a word")
        return str(value)
    if kind == "tuple":
        if isinstance(value, str) and "," in value:   # bare words: families=go_to,stop
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if _is_number_pair_or_more(current) and not isinstance(value, (list, tuple)) and "..." not in str(annotation):
            # a (min, max) range given one number would become (x,): refused, not unpacked later (a
            # tuple[int, ...] such as a network's layer sizes may take one number: one layer)
            raise bad(f"a tuple of {len(current)} numbers like the current one")
        return tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if kind == "dict" and not isinstance(value, dict):
        raise bad("a dict literal, or set its entries with key.<name>=value")
    return tuple(value) if isinstance(value, list) else value


def _is_number_pair_or_more(current: Any) -> bool:
    return (isinstance(current, tuple) and len(current) >= 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in current))


def _fields(obj: Any) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}


def _hints(obj: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(type(obj))
    except Exception:  # unresolved forward references: fall back to the annotation strings
        return {}


def _set(obj: Any, parts: list[str], value: Any, key: str, done: list[str]) -> Any:
    """Set ``parts`` below ``obj``; returns obj (or a replaced copy of a frozen dataclass)."""
    part, last = parts[0], len(parts) == 1
    where = ".".join(done)
    if isinstance(obj, dict):
        if last:
            obj[part] = coerce(key, value, obj[part]) if part in obj else (
                tuple(value) if isinstance(value, list) else value)
        else:
            child = obj.setdefault(part, {})
            obj[part] = _set(child, parts[1:], value, key, done + [part])
        return obj
    if obj is None and done:   # e.g. terrain.num_levels on a flat env, whose terrain is None
        raise ValueError(f"override {key!r} sets a field of {where}, which is None in this config (nothing to set "
                         f"a field of: give {where} a value first, e.g. a terrain for a flat env's terrain)")
    fields = _fields(obj)
    if part not in fields:
        allowed = sorted(fields)
        if not done:
            raise ValueError(f"override {key!r} is unknown; allowed: {allowed} (the config has no field {part!r})")
        raise ValueError(f"override {key!r} is unknown: no field {where}.{part} ({done[-1]} has no field "
                         f"{part!r}); allowed: {allowed}")
    current = getattr(obj, part)
    new = (coerce(key, value, current, _hints(obj).get(part, fields[part].type)) if last
           else _set(current, parts[1:], value, key, done + [part]))
    if getattr(type(obj), "__dataclass_params__").frozen:
        return dataclasses.replace(obj, **{part: new})
    setattr(obj, part, new)
    return obj


def apply_overrides(cfg: Any, overrides: dict[str, Any], root: str | None = None) -> Any:
    """Set (dotted) fields of a dataclass config; returns it (a new instance if it is frozen).

    With ``root`` only the keys ``<root>.<path>`` apply (``root="env"``: the ``env.*`` overrides of a
    trainer whose other keys address its own config); without, every key applies."""
    for key, value in overrides.items():
        parts = key.split(".")
        if root is not None:
            if parts[0] != root:
                continue
            cfg = _set(cfg, parts[1:], value, key, [root])
        else:
            cfg = _set(cfg, parts, value, key, [])
    return cfg
