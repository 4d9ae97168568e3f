"""Failures the user did not type, said in one message: ``JobFailed``.

Bad input is a ``ValueError`` the CLI prints as one line (exit 2). A job can also stop for a reason
outside its input - the disk filled, a Ray worker died. Such a failure is raised as ``JobFailed`` with a
message that says, in one line, where (the store), what failed, what is safe and how to go on; the CLI
prints that line (exit 1) instead of a traceback. The original error stays chained for a debugger.
"""
from __future__ import annotations

import errno
import os
import re

# write failures that are the machine's, not the data's: the disk, the quota, the file system
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


class JobFailed(RuntimeError):
    """A job stopped for an outside reason; ``str(err)`` is the whole message for the user."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a job that can say what it kept and how to go on: ``str(err)`` says it (the CLI prints
    it after ``interrupted``, exit 130 as for any interruption). ``resumable``: a checkpoint was kept that
    the same command with ``--resume`` continues from."""

    def __init__(self, message: str, resumable: bool = False):
        super().__init__(message)
        self.resumable = resumable


def is_write_failure(err: BaseException) -> bool:
    """An ``OSError`` from the disk or file system (full, quota, read-only, I/O error)."""
    return isinstance(err, OSError) and err.errno in WRITE_ERRNOS


def os_reason(err: OSError) -> str:
    """``No space left on device (ENOSPC)``: the system's words and the code's name."""
    name = errno.errorcode.get(err.errno or -1, "")
    text = err.strerror or str(err)
    return f"{text} ({name})" if name else text


def write_failure_reason(err: BaseException) -> str | None:
    """``os_reason`` of a write failure, also one a library reported in its own words (HDF5 raises
    ``RuntimeError: ... errno = 28, error message = 'No space left on device' ...``); None for any other error."""
    if is_write_failure(err):
        return os_reason(err)
    found = re.search(r"errno = (\d+)", str(err)) if isinstance(err, (OSError, RuntimeError)) else None
    code = int(found.group(1)) if found else None
    if code in WRITE_ERRNOS:
        return f"{os.strerror(code)} ({errno.errorcode[code]})"
    return None
