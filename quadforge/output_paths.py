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
- ``file_written_whole(path, flag)`` / ``folder_written_whole(path, flag)``: an output written whole or
  not at all - a failed write (a full disk, Ctrl-C) leaves no partial file or folder behind, and an earlier
  output in place; a full disk is a one-line ``JobFailed``. ``made_folder_removed_on_failure(path,
  holds_work)``: a job that fails before any of its work leaves no folder it made.
- ``check_train_out(out_dir, resume, overwrite)``: ``check_run_dir`` for the trainers' Python ``train``
  functions (their arguments named in the error), on the main process only (under torchrun the other
  ranks would see the files the main one has begun to write).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

from quadforge.errors import JobFailed, write_failure_reason

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


def _is_store_root(p: Path) -> bool:
    """A folder that is a trajectory store for certain (``is_store_dir`` also takes a folder that merely
    holds a ``meta/`` or ``staging/``, which a folder above one's output may well do): a committed store,
    or one a collection has begun."""
    return ((p / "manifest.json").is_file() and (p / "zarr.json").is_file()) or (p / ".collect.lock").exists()


def _refuse_inside_a_store(p: Path, flag: str) -> None:
    """An output folder is never inside a trajectory store: its files would sit among the store's arrays (a
    compaction's rewrite, a validate, a copy of the store meet them). Symlinks are followed, as the write would."""
    store = next((parent for parent in p.resolve().parents if _is_store_root(parent)), None)
    if store is not None:
        raise ValueError(f"{flag} {p}: inside the trajectory store {store}; writing there would damage it: "
                         f"choose a path outside it")


def table_marker(command: str) -> str:
    """The line a command's ``--table FILE`` ends with (a Markdown comment: invisible when rendered), by which
    a rerun knows the file as its own; a user's notes, text as well, never carry it."""
    return f"<!-- written by `quadforge {command}`: a rerun replaces this file -->"


def written_by(command: str) -> Callable[[Path], bool]:
    """``owns`` for ``--table``: a text file that ends with ``table_marker(command)``."""
    def owns(p: Path) -> bool:
        return is_text_file(p) and p.stat().st_size <= MAX_JSON_BYTES and \
            p.read_text(encoding="utf-8").rstrip().endswith(table_marker(command))
    return owns


def _enclosing_store_or_run(p: Path) -> str | None:
    """The trajectory store or training run folder ``p`` would be written into, described; None if none."""
    for parent in p.resolve().parents:
        if _is_store_root(parent):
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
    _refuse_inside_a_store(p, flag)
    if p.is_dir() and any(p.iterdir()) and not (owns is not None and owns(p)):
        article = "an" if kind[:1] in "aeiou" else "a"
        raise ValueError(f"{flag} {p}: a non-empty folder that is not {article} {kind} (it holds {listing(p)}); "
                         f"give a new or empty folder")
    return p


def holds_run(path: str | os.PathLike) -> bool:
    """A folder with a training run's checkpoint in it (last.pt, best.pt or step_*.pt)."""
    p = Path(path)
    return p.is_dir() and (any((p / f).is_file() for f in RUN_FILES) or any(p.glob("step_*.pt")))


# what a trainer writes into its --out before the first checkpoint (training.loop.RunLog, the trainers'
# train_config.json): a folder holding only these is a run stopped before any checkpoint - nothing to
# resume or lose - which a rerun starts afresh
RUN_START_FILES = frozenset({RUN_LOCK, "tb", "train_config.json", "val.jsonl"})


def _only_run_start_files(p: Path) -> bool:
    return p.is_dir() and all(x.name in RUN_START_FILES for x in p.iterdir())


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
    _refuse_inside_a_store(p, flag)
    has_run = holds_run(p)
    if resume:
        if not has_run:
            started = " (a run stopped before its first checkpoint: run it again without " + resume_opt + ")" \
                if _only_run_start_files(p) else ""
            raise ValueError(f"{resume_opt}: {p} holds no checkpoint (last.pt, best.pt or step_*.pt) to "
                             f"resume{started}")
        return p
    if p.is_dir() and not _only_run_start_files(p):
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
    """An ``eval`` report, or an ``eval-expert`` one (its ``expert_report.*`` beside a folder per expert)."""
    return any((p / name).is_file() for name in ("eval.json", "report.md", "expert_report.json", "expert_report.md"))


def check_train_out(out_dir: str | os.PathLike | None, resume: bool, overwrite: bool) -> None:
    """What a trainer's ``train(..., out_dir, resume=, overwrite=)`` checks before any work: ``check_run_dir``
    with its arguments' names, on rank 0 of a torchrun job (or the only process). None: no files."""
    if out_dir is None or int(os.environ.get("RANK", "0")) != 0:
        return
    check_run_dir(out_dir, resume, overwrite, flag="out_dir", options=("resume=True", "overwrite=True"))


def _failed_write(err: BaseException, flag: str, path: Path) -> None:
    reason = write_failure_reason(err)
    if reason is not None:
        raise JobFailed(f"{flag} {path}: {reason}; nothing was written (the partial output is removed), "
                        f"the source is unchanged: free space or choose another path, and run it again") from err


@contextlib.contextmanager
def file_written_whole(path: str | os.PathLike, flag: str) -> Iterator[Path]:
    """Yields a hidden path beside ``path`` to write; it replaces ``path`` when the block ends, and is
    removed when the block fails (an earlier file at ``path`` stays as it was)."""
    out = Path(path)
    partial = out.with_name(f".{out.name}.partial")
    try:
        yield partial
        os.replace(partial, out)
    except BaseException as err:
        partial.unlink(missing_ok=True)
        _failed_write(err, flag, out)
        raise


@contextlib.contextmanager
def made_folder_removed_on_failure(path: str | os.PathLike, holds_work: Callable[[Path], bool]) -> Iterator[None]:
    """A job that may create the folder ``path``: when it fails, a folder it made that holds none of its work
    (``holds_work`` False: only what a job writes before its first result) is removed, so no empty store or
    run is left to be taken for one."""
    out = Path(path)
    made_here = not out.exists()
    try:
        yield
    except BaseException:
        if made_here and out.is_dir() and not holds_work(out):
            shutil.rmtree(out, ignore_errors=True)
        raise


@contextlib.contextmanager
def folder_written_whole(path: str | os.PathLike, flag: str) -> Iterator[Path]:
    """The folder ``path`` (new or empty: ``check_output_dir``) to write into; when the block fails,
    what it added is removed, and the folder too if the block made it."""
    out = Path(path)
    existed = out.is_dir()
    before = set(out.iterdir()) if existed else set()
    try:
        yield out
    except BaseException as err:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        elif out.is_dir():
            for entry in set(out.iterdir()) - before:
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        _failed_write(err, flag, out)
        raise
