"""What a reproduction run records about where it ran: the commit (and uncommitted files) and the machine."""
from __future__ import annotations

import os
import platform
from typing import Any


def git_state() -> dict[str, Any]:
    """The commit the run used and which tracked files differed from it (others' work in progress)."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.split("\n")
        return {"head": head, "modified": [line[3:] for line in dirty if line.strip()]}
    except (OSError, subprocess.CalledProcessError):
        return {"head": None, "modified": []}


def machine() -> dict[str, Any]:
    import torch
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "load_avg_1m": os.getloadavg()[0]}
