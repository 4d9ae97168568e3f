"""The store's small JSON files: written atomically, read with a one-line error naming the file."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from quadforge.data.staging import fsync_dir


def write_json_atomic(path: Path, obj: Any) -> None:
    """temp + fsync + rename + fsync(dir): the file is either the old one or the whole new one."""
    write_bytes_atomic(path, json.dumps(obj).encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``write_json_atomic`` for bytes already encoded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing {what}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: corrupt {what} (not valid JSON: {err})") from err
