"""``StagingWriter``: the one writer per collector process (episode ids ``<collector_id>-<counter>``).

It sits above both the staging format and the store: its counter resumes after the highest id the store
already holds or has staged, so a resumed collector never reuses an id.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from quadforge.data.locks import acquire
from quadforge.data.staging import (COLLECTOR_ID_RE, COLLECTOR_ID_RULE, partial_writes, remove_partial_writes,
                                    staging_dir, write_staging_file, writer_lock_path)
from quadforge.data.store import TrajectoryStore


class StagingWriter:
    """One per collector id and store at a time: it holds ``staging/.writer-<collector_id>.lock`` (an
    flock naming its process, ``data.locks``) while alive, so two writers can never hand out the same
    episode ids; a second one is refused with an error naming the first. ``close()`` (or dropping the
    writer, or the process ending) releases it."""

    def __init__(self, store_path: str | Path, collector_id: str):
        if not COLLECTOR_ID_RE.match(str(collector_id)):
            raise ValueError(f"collector_id={collector_id!r}: use {COLLECTOR_ID_RULE}")
        self.store_path = Path(store_path)
        self.collector_id = str(collector_id)
        self.dir = staging_dir(self.store_path)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock = acquire(writer_lock_path(self.store_path, self.collector_id),
                            f"staging writer {self.collector_id!r}",
                            hint="episode ids would collide; give this writer another collector id")
        # this collector's earlier writer was killed mid-write: its temp files are no episode (the lock says
        # no other writer of this collector is alive)
        self.removed_partial = remove_partial_writes(partial_writes(self.store_path, self.collector_id))
        prefix = self.collector_id + "-"
        counters = [int(eid[len(prefix):]) for eid in TrajectoryStore.existing_episode_ids(self.store_path)
                    if eid.startswith(prefix) and eid[len(prefix):].isdigit()]
        self.counter = max(counters) + 1 if counters else 0

    def next_episode_id(self) -> str:
        return f"{self.collector_id}-{self.counter:08d}"

    def close(self) -> None:
        self.lock.release()

    def __enter__(self) -> "StagingWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def write_episode(self, episode: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> str:
        """Write one episode durably; returns its episode id."""
        episode_id = self.next_episode_id()
        write_staging_file(self.store_path, episode_id, self.collector_id, episode, info)
        self.counter += 1
        return episode_id
