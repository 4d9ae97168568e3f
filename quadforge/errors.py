"""Failures the user did not type, said in one message: ``JobFailed``.

Bad input is a ``ValueError`` the CLI prints as one line (exit 2). A job can also stop for a reason
outside its input - the disk filled, a Ray worker died. Such a failure is raised as ``JobFailed`` with a
message that says, in one line, where (the store), what failed, what is safe and how to go on; the CLI
prints that line (exit 1) instead of a traceback. The original error stays chained for a debugger.
"""
from __future__ import annotations

import errno

# write failures that are the machine's, not the data's: the disk, the quota, the file system
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


class JobFailed(RuntimeError):
    """A job stopped for an outside reason; ``str(err)`` is the whole message for the user."""


def is_write_failure(err: BaseException) -> bool:
    """An ``OSError`` from the disk or file system (full, quota, read-only, I/O error)."""
    return isinstance(err, OSError) and err.errno in WRITE_ERRNOS


def os_reason(err: OSError) -> str:
    """``No space left on device (ENOSPC)``: the system's words and the code's name."""
    name = errno.errorcode.get(err.errno or -1, "")
    text = err.strerror or str(err)
    return f"{text} ({name})" if name else text
