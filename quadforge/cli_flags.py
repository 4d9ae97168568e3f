"""The flags every subcommand shares, defined once (the convention of docs/cli.md).

Each ``add_*`` adds one flag with its one name, meaning and help; old spellings are kept as hidden
deprecated aliases that print a one-line warning on stderr and set the same value.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Iterator, TextIO

# where ``--json -`` writes while ``json_alone_on_stdout`` holds stdout for it (None: sys.stdout)
_json_stream: TextIO | None = None


class _Deprecated(argparse.Action):
    """A hidden old spelling: warns, then stores into the new flag's dest."""

    def __init__(self, option_strings, dest, new: str = "", **kw: Any):
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"quadforge: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def deprecated(p: argparse.ArgumentParser, old: str, new: str, dest: str, **kw: Any) -> None:
    p.add_argument(old, dest=dest, action=_Deprecated, new=new, help=argparse.SUPPRESS, default=argparse.SUPPRESS,
                   **kw)


def field_flag(name: str, renames: dict[str, str] | None = None) -> str:
    """The command-line flag of a config field, for error messages: its rename (``--store`` for ``data``)
    or ``--<field-name>`` with dashes (the convention every subcommand follows)."""
    return (renames or {}).get(name) or "--" + name.replace("_", "-")


def require(args: argparse.Namespace, dest: str, flag: str) -> Any:
    """The value of a flag that is required (checked after parsing, so a deprecated alias counts)."""
    value = getattr(args, dest, None)
    if value is None:
        raise ValueError(f"{flag} is required")
    return value


def add_store(p: argparse.ArgumentParser, what: str, old: str | None = None) -> None:
    p.add_argument("--store", default=None, metavar="PATH", help=f"trajectory store (zarr): {what}")
    if old:
        deprecated(p, old, "--store", "store")


def add_out(p: argparse.ArgumentParser, what: str, default: str | None = None) -> None:
    p.add_argument("--out", default=default, metavar="DIR", help=f"output directory: {what}"
                   + (f" (default {default})" if default else ""))


def add_seed(p: argparse.ArgumentParser, default: int = 0) -> None:
    p.add_argument("--seed", type=int, default=default,
                   help=f"root seed of the run; every random stream derives from it (default {default})")


def add_num_threads(p: argparse.ArgumentParser, default: int | None = 1, what: str = "physics threads") -> None:
    p.add_argument("--num-threads", type=int, default=default, metavar="N",
                   help=f"{what} (default {default if default is not None else 'all cores'})")
    deprecated(p, "--threads", "--num-threads", "num_threads", type=int)


# shared counts that must be at least 1: flag -> its dest (checked once for every command, in check_counts)
COUNT_FLAGS = {"--num-threads": "num_threads", "--num-envs": "num_envs"}


def check_counts(args: argparse.Namespace) -> None:
    """The shared count flags a command was given are >= 1 (None: the command's default), one wording for
    every command. Checked after parsing rather than by an argparse ``type``: argparse's own errors print
    the whole usage block, and a bad flag here is a one-line error (docs/cli.md)."""
    for flag, dest in COUNT_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None and int(value) < 1:
            raise ValueError(f"{flag} {value}: must be at least 1")


def add_json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help=f"also write {what} as JSON to PATH (no PATH or '-': stdout, the text report on stderr)")


def add_resume(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--resume", action="store_true", help=f"continue the run in --out from {what}")


def add_num_envs(p: argparse.ArgumentParser, default: int | None, what: str = "parallel envs") -> None:
    p.add_argument("--num-envs", type=int, default=default, metavar="N",
                   help=f"{what}" + (f" (default {default})" if default is not None else ""))


@contextlib.contextmanager
def json_alone_on_stdout(path: str | None) -> Iterator[None]:
    """With ``--json -`` stdout carries the JSON alone, so a pipe into a JSON reader works: while the
    command runs, what it prints for people goes to stderr, and ``write_json`` to the real stdout."""
    global _json_stream
    if path != "-":
        yield
        return
    _json_stream = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _json_stream = None


def write_json(path: str | None, obj: Any, **dump: Any) -> None:
    """``--json PATH``: write ``obj`` there ('-': stdout), the parent folders made as needed."""
    import json
    from pathlib import Path

    if not path:
        return
    text = json.dumps(obj, **{"indent": 2, "default": str, **dump})
    if path == "-":
        print(text, file=_json_stream or sys.stdout)
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
