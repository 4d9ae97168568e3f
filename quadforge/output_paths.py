"""Output paths checked before any work starts: a run never ends in ``NotADirectoryError`` after an
hour of work, never writes its files among someone else's, and never replaces finished work unasked.

- ``check_output_file(path, flag, owns)``: a file to (re)write - not a directory, every parent a directory
  (or creatable) and writable, not inside a trajectory store or a training run (a store's
  ``manifest.json`` is a file too), and either new, empty or an earlier output of its command (``owns``:
  ``is_json_file`` for ``--json``, ``is_hdf5_file`` for an export, ``is_text_file`` for a page or table),
  so a rerun replaces its own file and a user's ``notes.txt`` is never replaced by a JSON.
- ``check_output_dir(path, kind, owns)``: a folder of ``kind`` - new, empty, or one that ``owns(path)``
  recognises as its own (a trajectory store for ``collect``, an eval report for ``eval``).
- ``check_run_dir(path, resume, overwrite)``: a training run folder - new or empty, or holding a run
  that ``--resume`` continues or ``--overwrite`` replaces; otherwise refused (a finished 3000-step
  model is not silently replaced by a 5-step one).
Errors are ``ValueError``s naming the flag, the path and what to do, so the CLI prints one line.
- ``check_train_out(out_dir, resume, overwrite)``: ``check_run_dir`` for the trainers' Python ``train``
  functions (their arguments named in the error), on the main process only (under torchrun the other
  ranks would see the files the main one has begun to write).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

RUN_FILES = ("last.pt", "best.pt")
# held by a training while it writes its --out (training.loop.RunLog): one training per folder at a time;
# left behind empty when a run stops, so a folder holding only it is still an empty one
RUN_LOCK = ".train.lock"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
MAX_JSON_BYTES = 64 << 20


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


def is_hdf5_file(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(8) == HDF5_SIGNATURE


def is_json_file(p: Path) -> bool:
    if p.stat().st_size > MAX_JSON_BYTES:   # our JSON outputs are small; never read a huge file whole to learn that
        return False
    try:
        json.loads(p.read_bytes())
        return True
    except ValueError:   # UnicodeDecodeError and JSONDecodeError both are
        return False


def is_text_file(p: Path) -> bool:
    try:
        with open(p, encoding="utf-8") as f:
            f.read(1 << 16)
        return True
    except UnicodeDecodeError:
        return False


def _enclosing_store_or_run(p: Path) -> str | None:
    """The trajectory store or training run folder ``p`` would be written into, described; None if none.
    Symlinks are followed: the write would follow them too."""
    for parent in p.resolve().parents:
        if parent.is_dir() and is_store_dir(parent):
            return f"inside the trajectory store {parent}"
        if holds_run(parent) or any(parent.glob("model_*.pt")):   # `train`'s or `train-expert`'s (rsl_rl's)
            return f"inside the training run folder {parent}"
    return None


def check_output_file(path: str | os.PathLike, flag: str, owns: Callable[[Path], bool]) -> Path:
    """A file that will be written: not a folder, parents creatable, not inside a store or a run, and
    either new or an earlier output of its command, which ``owns`` recognises by its content."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {p}: is a folder; give a file path")
    _check_parents(p, flag)
    inside = _enclosing_store_or_run(p)
    if inside:
        raise ValueError(f"{flag} {p}: {inside}; writing there would damage it: choose a path outside it")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise ValueError(f"{flag} {p}: exists and is not writable")
        try:
            replaceable = p.stat().st_size == 0 or owns(p)   # an empty file (a write cut short) holds nothing
        except OSError:   # unreadable: nothing says it is ours
            replaceable = False
        if not replaceable:
            raise ValueError(f"{flag} {p}: exists and is not an earlier output (not what this command writes); "
                             f"replacing it would lose it: choose a new path, or move the file away first")
    return p


def listing(p: Path, n: int = 4) -> str:
    """The first ``n`` names in folder ``p``, for an error that says what a refused folder holds."""
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
        raise ValueError(f"{flag} {p}: a non-empty folder that is not a {kind} (it holds {listing(p)}); "
                         f"give a new or empty folder")
    return p


def holds_run(path: str | os.PathLike) -> bool:
    """A folder with a training run's checkpoint in it (last.pt, best.pt or step_*.pt)."""
    p = Path(path)
    return p.is_dir() and (any((p / f).is_file() for f in RUN_FILES) or any(p.glob("step_*.pt")))


def check_run_dir(path: str | os.PathLike, resume: bool = False, overwrite: bool = False,
                  flag: str = "--out", options: tuple[str, str] = ("--resume", "--overwrite")) -> Path:
    """A training run folder: new/empty, or an existing run continued (``resume``) or replaced
    (``overwrite``). A non-empty folder that is not a run is refused even with ``overwrite``.
    ``options``: how the caller spells resume and overwrite (the CLI's flags, or a function's arguments)."""
    p = Path(path)
    resume_opt, overwrite_opt = options
    if resume and overwrite:
        raise ValueError(f"{resume_opt} and {overwrite_opt} contradict each other; pass one")
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {p}: is a file; give a folder for the run (created if missing)")
    _check_parents(p, flag)
    has_run = holds_run(p)
    if resume:
        if not has_run:
            raise ValueError(f"{resume_opt}: {p} holds no checkpoint (last.pt, best.pt or step_*.pt) to resume")
        return p
    if p.is_dir() and any(x.name != RUN_LOCK for x in p.iterdir()):
        if has_run and overwrite:
            return p
        if has_run:
            raise ValueError(f"{flag} {p}: already holds a training run ({listing(p)}); pass {resume_opt} to "
                             f"continue it, {overwrite_opt} to replace it, or choose a new folder")
        raise ValueError(f"{flag} {p}: a non-empty folder that is not a training run (it holds {listing(p)}); "
                         f"give a new or empty folder")
    return p


def is_store_dir(p: Path) -> bool:
    """A trajectory store (committed, or with staged episodes only) or a half-created one. Compaction's
    ``.lock`` is no proof: compacting any folder used to leave one, and while a store is being created its
    ``staging/`` (the episodes compacted) or ``.collect.lock`` (taken before the first episode) is there too."""
    return any((p / name).exists() for name in ("manifest.json", "staging", "meta", "zarr.json", "quarantine",
                                                 ".collect.lock"))


def is_eval_dir(p: Path) -> bool:
    return (p / "eval.json").is_file() or (p / "report.md").is_file()


def check_train_out(out_dir: str | os.PathLike | None, resume: bool, overwrite: bool) -> None:
    """What a trainer's ``train(..., out_dir, resume=, overwrite=)`` checks before any work: ``check_run_dir``
    with its arguments' names, on rank 0 of a torchrun job (or the only process). None: no files."""
    if out_dir is None or int(os.environ.get("RANK", "0")) != 0:
        return
    check_run_dir(out_dir, resume, overwrite, flag="out_dir", options=("resume=True", "overwrite=True"))
