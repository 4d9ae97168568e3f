"""``EnvPool``: run one per-env job over N envs on the caller's thread plus persistent worker threads.

Built for ``mujoco_cpu``'s step, where each env costs tens of microseconds of GIL-free MuJoCo work and
the step repeats a few thousand times a second:

- persistent workers woken by a plain lock (no Future, no queue item per step);
- envs handed out one at a time from one shared ``range`` iterator (its ``next`` is atomic under the
  GIL), so a thread that starts late or draws contact-heavy envs simply takes fewer: no fixed slices
  to fall out of balance. Which thread steps an env never changes what the env computes.

Workers hold no reference to the owner between runs (the job is dropped after each run), so an owner
that is garbage-collected can still close its pool from ``__del__``.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterator

# job(envs): step every env index drawn from the shared iterator until it passes n - 1
Job = Callable[[Iterator[int]], None]


class _Shared:
    """What the caller and the workers share; the workers see only this, never the pool's owner."""

    def __init__(self, num_workers: int):
        self.go = [threading.Lock() for _ in range(num_workers)]     # held = worker sleeps
        self.done = [threading.Lock() for _ in range(num_workers)]   # held = worker busy
        for lock in self.go + self.done:
            lock.acquire()
        self.job: Job | None = None
        self.envs: Iterator[int] | None = None
        self.errors: list[BaseException] = []
        self.closing = False


def _worker(shared: _Shared, k: int) -> None:
    go, done = shared.go[k], shared.done[k]
    while True:
        go.acquire()
        if shared.closing:
            done.release()
            return
        try:
            shared.job(shared.envs)
        except BaseException as err:  # handed to the caller, which re-raises it
            shared.errors.append(err)
        done.release()


class EnvPool:
    """``run(job, n)``: ``job`` is called once on every thread (the caller's included) with one shared
    iterator over ``range(n)`` and must stop when the iterator is exhausted."""

    def __init__(self, num_threads: int, name: str = "env-pool"):
        if int(num_threads) < 1:
            raise ValueError(f"EnvPool num_threads must be >= 1, got {num_threads}")
        self.num_threads = int(num_threads)
        self._shared = _Shared(self.num_threads - 1)
        self._threads = [threading.Thread(target=_worker, args=(self._shared, k), name=f"{name}-{k}", daemon=True)
                         for k in range(self.num_threads - 1)]
        for t in self._threads:
            t.start()

    def run(self, job: Job, n: int, tail: Callable[[], None] | None = None) -> None:
        """``tail``: work for the caller's thread alone, done once it finds no env left while the workers
        may still finish their last ones. Not before its share of envs: Python work on the caller makes
        the workers wait for the GIL between envs, and each hand-over costs a thread wake-up; in the
        tail they are inside MuJoCo (no GIL) and the caller would only wait."""
        sh = self._shared
        if sh.closing:
            raise RuntimeError("EnvPool.run after close()")
        # a range iterator's next is one C call that never releases the GIL: every index goes out once
        envs = iter(range(n))
        sh.job, sh.envs = job, envs
        for go in sh.go:
            go.release()
        try:
            job(envs)
            if tail is not None:
                tail()
        finally:
            for done in sh.done:   # every worker has stopped touching the envs before we return
                done.acquire()
            sh.job = sh.envs = None
        if sh.errors:
            err, sh.errors[:] = sh.errors[0], []
            raise err

    def close(self) -> None:
        sh = self._shared
        if sh.closing:
            return
        sh.closing = True
        for go in sh.go:
            go.release()
        for t in self._threads:
            t.join()
