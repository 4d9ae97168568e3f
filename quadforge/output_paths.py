"""Output paths checked before any work starts: a run never ends in ``NotADirectoryError`` after an
hour of work, never writes its files among someone else's, and never replaces finished work unasked.

- ``check_output_file(path)``: a file to (re)write - not a directory, every parent a directory (or
  creatable) and writable.
- ``check_output_dir(path, kind, owns)``: a folder of ``kind`` - new, empty, or one that ``owns(path)``
  recognises as its own (a trajectory store for ``collect``, an eval report for ``eval``).
- ``check_run_dir(path, resume, overwrite)``: a training run folder - new or empty, or holding a run
  that ``--resume`` continues or ``--overwrite`` replaces; otherwise refused (a finished 3000-step
  model is not silently replaced by a 5-step one).
Errors are ``ValueError``s naming the flag, the path and what to do, so the CLI prints one line.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

RUN_FILES = ("last.pt", "best.pt")


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_parents(path: Path, flag: str) -> None:
    for parent in list(path.parents)[::-1]:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{flag} {path}: {parent} is a file, not a folder; choose another path")
    # the folder the entry lives (or will live) in must be writable; an existing file needs no X bit
    anchor = _nearest_existing(path if path.is_dir() else path.parent)
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: {anchor} is not writable")


def check_output_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """A file that will be written (replacing an older one is fine): not a folder, parents creatable."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {p}: is a folder; give a file path")
    _check_parents(p, flag)
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{flag} {p}: exists and is not writable")
    return p


def _listing(p: Path, n: int = 4) -> str:
    names = sorted(x.name for x in p.iterdir())
    return ", ".join(names[:n]) + (f", ... ({len(names)} entries)" if len(names) > n else "")


def check_output_dir(path: str | os.PathLike, kind: str, owns: Callable[[Path], bool] | None = None,
                     flag: str = "--out") -> Path:
    """A folder for ``kind`` output: absent, empty, or one ``owns`` recognises as a ``kind``."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {p}: is a file; give a folder for the {kind} (created if missing)")
    _check_parents(p, flag)
    if p.is_dir() and any(p.iterdir()) and not (owns is not None and owns(p)):
        raise ValueError(f"{flag} {p}: a non-empty folder that is not a {kind} (it holds {_listing(p)}); "
                         f"give a new or empty folder")
    return p


def holds_run(path: str | os.PathLike) -> bool:
    """A folder with a training run's checkpoint in it (last.pt, best.pt or step_*.pt)."""
    p = Path(path)
    return p.is_dir() and (any((p / f).is_file() for f in RUN_FILES) or any(p.glob("step_*.pt")))


def check_run_dir(path: str | os.PathLike, resume: bool = False, overwrite: bool = False,
                  flag: str = "--out") -> Path:
    """A training run folder: new/empty, or an existing run continued (``resume``) or replaced
    (``overwrite``). A non-empty folder that is not a run is refused even with ``overwrite``."""
    p = Path(path)
    if resume and overwrite:
        raise ValueError("--resume and --overwrite contradict each other; pass one")
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {p}: is a file; give a folder for the run (created if missing)")
    _check_parents(p, flag)
    has_run = holds_run(p)
    if resume:
        if not has_run:
            raise ValueError(f"--resume: {p} holds no checkpoint (last.pt, best.pt or step_*.pt) to resume")
        return p
    if p.is_dir() and any(p.iterdir()):
        if has_run and overwrite:
            return p
        if has_run:
            raise ValueError(f"{flag} {p}: already holds a training run ({_listing(p)}); pass --resume to "
                             f"continue it, --overwrite to replace it, or choose a new folder")
        raise ValueError(f"{flag} {p}: a non-empty folder that is not a training run (it holds {_listing(p)}); "
                         f"give a new or empty folder")
    return p


def is_store_dir(p: Path) -> bool:
    """A trajectory store (committed, or with staged episodes only) or a half-created one."""
    return any((p / name).exists() for name in ("manifest.json", "staging", "meta", "zarr.json", "quarantine",
                                                 ".collect.lock", ".lock"))


def is_eval_dir(p: Path) -> bool:
    return (p / "eval.json").is_file() or (p / "report.md").is_file()
