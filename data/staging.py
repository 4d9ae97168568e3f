"""Collectors' write path: one immutable staging file per episode, made visible by an atomic rename.

A staging file is ``<store>/staging/<episode_id>.npz`` (uncompressed npz, no pickle): one member per
feature plus ``__info__``, the episode's info as a JSON string. It is written under a dot-prefixed
temp name, fsynced, renamed into place and the directory fsynced, so a reader (the compactor) sees
either the whole file or nothing. Episode ids are ``<collector_id>-<counter:08d>``; a writer resumes
its counter after the highest id of its collector already in the store or staged.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from data.schema import CATALOGUE, IMAGE_PREFIX, check_episode

STAGING_DIR = "staging"
INFO_KEY = "__info__"
_COLLECTOR_RE = re.compile(r"^[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)*$")


def staging_dir(store_path: str | Path) -> Path:
    return Path(store_path) / STAGING_DIR


def list_staged(store_path: str | Path) -> list[Path]:
    """Complete staging files in the deterministic order compaction consumes them (by name)."""
    d = staging_dir(store_path)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.suffix == ".npz" and not p.name.startswith("."))


def episode_id_of(path: Path) -> str:
    return path.stem


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ValueError(f"episode info value {value!r} ({type(value).__name__}) is not JSON-able")


def _cast(name: str, value: np.ndarray) -> np.ndarray:
    dtype = "uint8" if name.startswith(IMAGE_PREFIX) else CATALOGUE[name].dtype
    return np.ascontiguousarray(value, dtype=dtype)


def read_staged(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Load one staging file; a damaged one is a ValueError naming the file."""
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        info = json.loads(str(data.pop(INFO_KEY)))
    except (OSError, ValueError, KeyError, EOFError) as err:
        raise ValueError(f"staging file {path}: unreadable ({err})") from err
    return data, info


class StagingWriter:
    """One per collector process; never shares files with another writer."""

    def __init__(self, store_path: str | Path, collector_id: str):
        if not _COLLECTOR_RE.match(str(collector_id)):
            raise ValueError(f"collector_id={collector_id!r}: use letters, digits, '_', '.', '-' only")
        self.store_path = Path(store_path)
        self.collector_id = str(collector_id)
        self.dir = staging_dir(self.store_path)
        self.dir.mkdir(parents=True, exist_ok=True)
        from data.store import TrajectoryStore  # the store module imports this one
        prefix = self.collector_id + "-"
        counters = [int(eid[len(prefix):]) for eid in TrajectoryStore.existing_episode_ids(self.store_path)
                    if eid.startswith(prefix) and eid[len(prefix):].isdigit()]
        self.counter = max(counters) + 1 if counters else 0

    def next_episode_id(self) -> str:
        return f"{self.collector_id}-{self.counter:08d}"

    def write_episode(self, episode: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> str:
        """Write one episode durably; returns its episode id."""
        episode_id = self.next_episode_id()
        write_staging_file(self.store_path, episode_id, self.collector_id, episode, info)
        self.counter += 1
        return episode_id


def write_staging_file(store_path: str | Path, episode_id: str, collector_id: str,
                       episode: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> Path:
    """Validate, then write ``<store>/staging/<episode_id>.npz`` via temp + fsync + atomic rename."""
    where = f"episode {episode_id}"
    length = check_episode(episode, where)
    if INFO_KEY in episode:
        raise ValueError(f"{where}: feature name {INFO_KEY!r} is reserved")
    arrays = {name: _cast(name, np.asarray(v)) for name, v in episode.items()}
    full_info = dict(_jsonable(dict(info)))
    full_info.update(episode_id=episode_id, collector_id=collector_id, length=length)
    d = staging_dir(store_path)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"{episode_id}.npz"
    tmp = d / f".tmp-{episode_id}-{os.getpid()}.npz"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays, **{INFO_KEY: np.asarray(json.dumps(full_info))})
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(d)
    return final
