"""What a reproduction run records about where it ran: the commit (and uncommitted files) and the machine."""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


# the checkout this code runs from (an editable install's repository root), not the caller's directory
CODE_ROOT = Path(__file__).resolve().parents[1]


def git_state() -> dict[str, Any]:
    """The commit the run's code came from and which tracked files differed from it (work in progress);
    no commit when the code is not a git checkout's (an installed wheel), whatever directory it runs in."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(CODE_ROOT), *args], capture_output=True, text=True,
                              check=True).stdout
    try:
        if Path(git("rev-parse", "--show-toplevel").strip()).resolve() != CODE_ROOT:
            return {"head": None, "modified": []}   # inside some other repository, not a checkout of this one
        dirty = git("status", "--porcelain", "--untracked-files=no").split("\n")
        return {"head": git("rev-parse", "HEAD").strip(), "modified": [line[3:] for line in dirty if line.strip()]}
    except (OSError, subprocess.CalledProcessError):
        return {"head": None, "modified": []}


def machine() -> dict[str, Any]:
    import torch
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "load_avg_1m": os.getloadavg()[0]}
