"""Durable episode writes off the rollout's critical path.

A staging write is a raw episode file plus two fsyncs (file and directory): milliseconds of waiting on the
disk per episode, during which the simulation could be stepping. ``BackgroundWriter`` hands episodes
to one thread that writes them through a ``StagingWriter`` in submission order (so episode ids are
assigned in order). The queue is bounded: when the disk falls behind, ``submit`` blocks, so memory and
the episodes at risk stay bounded - a kill loses at most the ``max_pending`` queued episodes plus the
one being written, all of them "in flight" in the store's sense. A write error is re-raised in the
caller's thread at the next ``submit``, ``flush`` or ``close`` (a ``JobFailed`` - the disk full - as it is,
its message being the user's).
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Mapping

import numpy as np

from quadforge.errors import JobFailed

_STOP = object()


class BackgroundWriter:
    def __init__(self, writer: Any, max_pending: int = 16) -> None:
        if max_pending < 1:
            raise ValueError(f"BackgroundWriter: max_pending={max_pending}; must be >= 1")
        self.writer = writer
        self.written = 0
        self.last_episode_id: str | None = None   # the last one only: a long collection keeps no per-episode list
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="staging-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is None:  # after a failure, drain without writing so callers never hang
                    self.last_episode_id = self.writer.write_episode(*item)
                    self.written += 1
            except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
                self._error = err
            finally:
                self._queue.task_done()

    def _raise(self) -> None:
        if isinstance(self._error, JobFailed):   # its message already says the store, what is safe, how to resume
            raise self._error
        if self._error is not None:
            raise RuntimeError(f"staging write failed: {self._error}") from self._error

    def submit(self, features: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> None:
        """Queue one episode (its arrays must not be modified afterwards)."""
        self._raise()
        if not self._thread.is_alive():
            raise RuntimeError("BackgroundWriter is closed")
        self._queue.put((features, info))

    def flush(self) -> None:
        """Block until every queued episode is on disk."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._raise()

    def __enter__(self) -> "BackgroundWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:  # an error is already on its way: finish the queued writes, do not mask it
            try:
                self.close()
            except RuntimeError:   # JobFailed included
                pass
