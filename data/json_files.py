"""The store's small JSON files: written atomically, read with a one-line error naming the file."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from quadforge.data.staging import fsync_dir


def write_json_atomic(path: Path, obj: Any) -> None:
    """temp + fsync + rename + fsync(dir): the file is either the old one or the whole new one."""
    write_text_atomic(path, json.dumps(obj))


def write_text_atomic(path: Path, text: str) -> None:
    """``write_json_atomic`` for text already encoded (json.dumps, not json.dump: dump streams through the
    encoder's pure-Python path, ~3x slower on a large episode table)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
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
