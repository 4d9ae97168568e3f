"""`quadforge collect --workers K`: K Ray actors, each its own env batch and collector id.

Each actor runs ``collect.collect_episodes`` with collector id ``<collector_id>.w<k>`` and its share
of the missing episodes, writing through its own ``StagingWriter`` (writers never share a file). The
driver alone compacts - on the job's ``CompactionSchedule`` over the actors' total and at the end - and
shows one progress bar over the actors' running totals. A worker that dies stops the job with one line
naming it (``JobFailed``): every episode it staged is safe and rerunning the command resumes. ``ray.init()`` starts a local Ray unless ``--address`` names a
cluster; an actor asks for ``num_threads`` CPUs (and one GPU when its physics runs on CUDA).
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from quadforge.collection.collect import (CollectConfig, CompactionSchedule, collect_episodes, compact_store,
                                          run_to_target)
from quadforge.collection.progress import Progress, Tally
from quadforge.errors import JobFailed

POLL_S = 1.0


class CollectorWorker:
    """The actor body: one collector; ``progress`` can be read while ``run`` works (threaded actor)."""

    def __init__(self, cfg: CollectConfig, collector_id: str, quota: int) -> None:
        self.cfg, self.collector_id, self.quota = cfg, collector_id, quota
        self.tally, self.steps_per_s = Tally(), 0.0

    def _seen(self, tally: Tally, steps_per_s: float) -> None:
        self.tally = Tally(tally.episodes, tally.steps, tally.successes, tally.reasons.copy())
        self.steps_per_s = steps_per_s

    def run(self) -> dict[str, Any]:
        return collect_episodes(self.cfg, self.collector_id, self.quota, on_episode=self._seen, compact=False)

    def progress(self) -> tuple[Tally, float]:
        return self.tally, self.steps_per_s


def actor_gpus(cfg: CollectConfig) -> int:
    """GPUs an actor asks Ray for: one when its physics runs on CUDA (``--backend mujoco_warp
    --warp-device cuda``; Ray then makes that GPU the actor's ``cuda:0``), else none (a CPU-only cluster
    would otherwise wait forever for a GPU)."""
    warp_device = cfg.warp.device if cfg.warp is not None else None
    return 1 if cfg.backend == "mujoco_warp" and (warp_device or "").startswith("cuda") else 0


def quotas(missing: int, workers: int) -> list[int]:
    """Split ``missing`` episodes over ``workers`` as evenly as possible."""
    return [missing // workers + (1 if k < missing % workers else 0) for k in range(workers)]


def run_distributed(cfg: CollectConfig) -> dict[str, Any]:
    def collect_on_ray(missing: int, done: int) -> dict[str, Any]:
        import ray
        started_ray = not ray.is_initialized()
        if started_ray:
            if cfg.address:
                ray.init(address=cfg.address, log_to_driver=False)
            else:
                ray.init(num_cpus=max(os.cpu_count() or 1, cfg.workers * cfg.num_threads),
                         include_dashboard=False, log_to_driver=False)
        try:
            return {"workers": cfg.workers, **_drive(ray, replace(cfg, progress=False), missing, done, cfg.progress)}
        finally:
            if started_ray:
                ray.shutdown()
    return run_to_target(cfg, collect_on_ray)   # the driver holds the store's collect lock for the whole job


def _drive(ray: Any, cfg: CollectConfig, missing: int, done: int, show: bool) -> dict[str, Any]:
    actor_cls = ray.remote(num_cpus=cfg.num_threads, num_gpus=actor_gpus(cfg), max_concurrency=2)(CollectorWorker)
    shares = [q for q in quotas(missing, cfg.workers)]
    ids = [f"{cfg.collector_id}.w{k}" for k, q in enumerate(shares) if q > 0]
    actors = [actor_cls.remote(cfg, cid, q) for cid, q in zip(ids, (q for q in shares if q > 0))]
    runs = [a.run.remote() for a in actors]
    bar = Progress(cfg.episodes, done, desc=f"collect x{len(actors)}", enabled=show)
    schedule = CompactionSchedule(cfg.compact_every, cfg.compact_every_s)
    try:
        pending = list(runs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            tallies = ray.get([a.progress.remote() for a in actors])
            total = Tally()
            for tally, _ in tallies:
                total = total.merge(tally)
            bar.update(total, sum(steps for _, steps in tallies))
            if schedule.due(total.episodes):
                schedule.compact(total.episodes, lambda: compact_store(cfg.out))
        results = ray.get(runs)  # raises a worker's error here
    except ray.exceptions.RayTaskError as err:   # a worker's own error: the worker named, its message kept
        raise worker_error(err, _failed_workers(ray, runs, ids), cfg.out) from err
    except ray.exceptions.RayActorError as err:  # a worker process died (killed, out of memory, node lost)
        raise worker_died(_failed_workers(ray, runs, ids), cfg.out, err) from err
    finally:
        bar.close()
        for a in actors:
            ray.kill(a)
    return {"collected": sum(r["episodes"] for r in results), "runs": results}


def _failed_workers(ray: Any, runs: list, ids: list[str]) -> list[str]:
    """The collector ids whose run ended in an error (a dead actor's run fails at once)."""
    failed = []
    for ref, cid in zip(runs, ids):
        ready, _ = ray.wait([ref], timeout=2.0)
        if not ready:
            continue
        try:
            ray.get(ref)
        except ray.exceptions.RayError:
            failed.append(cid)
    return failed


def _named(workers: list[str]) -> str:
    return f"Ray worker {', '.join(workers)}" if workers else "a Ray worker"


def worker_died(workers: list[str], store: str, err: BaseException) -> JobFailed:
    """One line for a dead collector: which, that the staged episodes are safe, how to resume."""
    cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return JobFailed(f"{_named(workers)} died ({cause.rstrip('.')}); every episode staged so far is safe in {store} "
                     f"(committed or in {store}/staging); rerun the same command to resume to the target")


def worker_error(err: BaseException, workers: list[str], store: str) -> BaseException:
    """A worker's own exception, as the local collector would raise it, with the worker named; its remote
    traceback (Ray's ``RayTaskError`` text) is dropped from the message."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, JobFailed):
        return JobFailed(f"{_named(workers)}: {cause}")
    if isinstance(cause, BaseException):
        try:
            return type(cause)(f"{_named(workers)}: {cause}")
        except TypeError:   # an exception class with another signature: as it came
            return cause
    return worker_died(workers, store, err)
