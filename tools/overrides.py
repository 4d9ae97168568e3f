"""`key=value` command-line overrides, shared by every trainer's CLI."""
from __future__ import annotations

import ast
from typing import Any


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["lr=3e-4", "env.commands.ranges.lin_vel_x=(0.0, 1.0)"]`` -> {key: python value}.

    Values are Python literals; a bare word (``activation=relu``) stays a string."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not key=value (e.g. lr=3e-4 or env.<path>=<value>)")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        out[key.strip()] = value
    return out
