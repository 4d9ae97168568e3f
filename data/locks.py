"""Exclusive locks that say who holds them: ``fcntl.flock`` on a file that records its holder.

The kernel releases an flock when its process dies (killed, crashed, machine rebooted), so a lock is
never left "stuck": a lock file whose flock is free is stale by definition, whatever it still says
about its last holder, and the next taker simply overwrites that record. While the lock is held the
file names the holder - pid, host, command line, start time - so a refused second writer can say who
is in the way. flock is enforced on local file systems; network file systems may not enforce it
(docs/data.md, "what the store guarantees").
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


class LockHeldError(ValueError):
    """Another live process holds the lock (a ValueError, so the CLI prints it as a one-line error)."""


def holder_record(what: str) -> dict[str, Any]:
    return {"what": what, "pid": os.getpid(), "host": socket.gethostname(),
            "command": " ".join(sys.argv)[:300] or sys.executable,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def describe_holder(path: Path) -> str:
    """One phrase naming the process recorded in a lock file (best effort: the file may be mid-write)."""
    try:
        rec = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        rec = {}
    if not isinstance(rec, dict) or "pid" not in rec:
        return "an unknown process (no holder record)"
    return (f"{rec.get('what', 'a writer')} pid {rec['pid']} on host {rec.get('host', '?')} since "
            f"{rec.get('since', '?')} (command: {rec.get('command', '?')})")


class HeldLock:
    """An acquired lock; ``release()`` (or leaving the ``with`` block / process exit) frees it."""

    def __init__(self, path: Path, fd: int, stale: str | None):
        self.path, self._fd, self.stale_holder = path, fd, stale

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)   # a record left behind therefore means its holder died
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "HeldLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:  # a dropped writer frees its lock even without an explicit release
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def acquire(path: str | Path, what: str, timeout: float | None = 0.0, hint: str = "") -> HeldLock:
    """Take the exclusive lock ``path`` for ``what`` (e.g. "collect"); wait up to ``timeout`` seconds
    (None: forever). Held by a live process after that: ``LockHeldError`` naming the holder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockHeldError(f"{path}: held by {describe_holder(path)}; {what} refused"
                                        + (f" ({hint})" if hint else "")) from None
                time.sleep(0.05)
        previous = os.pread(fd, 4096, 0)
        stale = describe_holder(path) if previous.strip() else None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder_record(what)).encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return HeldLock(path, fd, stale)


def is_held(path: str | Path) -> bool:
    """Whether a live process holds the lock ``path`` now (a missing lock file: no). This process's own
    locks count as held: flock locks belong to the open file, not the process."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


@contextmanager
def locked(path: str | Path, what: str, timeout: float | None = 0.0, hint: str = "") -> Iterator[HeldLock]:
    lock = acquire(path, what, timeout, hint)
    try:
        yield lock
    finally:
        lock.release()
