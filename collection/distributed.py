"""`quadforge collect --workers K`: K Ray actors, each its own env batch and collector id.

Each actor runs ``collect.collect_episodes`` with collector id ``<collector_id>.w<k>`` and its share
of the missing episodes, writing through its own ``StagingWriter`` (writers never share a file). The
driver alone compacts - every ``compact_every`` new episodes and at the end - and shows one progress
bar over the actors' running totals. ``ray.init()`` starts a local Ray unless ``--address`` names a
cluster; an actor asks for ``num_threads`` CPUs (and one GPU when its physics runs on CUDA).
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from quadforge.collection.collect import (CollectConfig, collect_episodes, collect_lock, compact_store,
                                          store_count)
from quadforge.collection.progress import Progress, Tally
from quadforge.data.staging import list_quarantined

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
    with collect_lock(cfg.out):   # the driver holds the store for the whole job
        return _run_distributed(cfg)


def _run_distributed(cfg: CollectConfig) -> dict[str, Any]:
    import ray

    done = store_count(cfg.out)
    missing = max(cfg.episodes - done, 0)
    summary: dict[str, Any] = {"target": cfg.episodes, "already": done, "collected": 0, "workers": cfg.workers}
    if missing:
        started_ray = not ray.is_initialized()
        if started_ray:
            if cfg.address:
                ray.init(address=cfg.address, log_to_driver=False)
            else:
                ray.init(num_cpus=max(os.cpu_count() or 1, cfg.workers * cfg.num_threads),
                         include_dashboard=False, log_to_driver=False)
        try:
            summary.update(_drive(ray, replace(cfg, progress=False), missing, done, cfg.progress))
        finally:
            if started_ray:
                ray.shutdown()
    compact_store(cfg.out)
    summary["in_store"] = store_count(cfg.out)
    quarantined = list_quarantined(cfg.out)
    if quarantined:   # set aside by compaction (docs/data.md): say so, the target counts only merged episodes
        summary["quarantined"] = [str(p) for p, _ in quarantined]
    return summary


def _drive(ray: Any, cfg: CollectConfig, missing: int, done: int, show: bool) -> dict[str, Any]:
    actor_cls = ray.remote(num_cpus=cfg.num_threads, num_gpus=actor_gpus(cfg), max_concurrency=2)(CollectorWorker)
    shares = [q for q in quotas(missing, cfg.workers)]
    actors = [actor_cls.remote(cfg, f"{cfg.collector_id}.w{k}", q) for k, q in enumerate(shares) if q > 0]
    runs = [a.run.remote() for a in actors]
    bar = Progress(cfg.episodes, done, desc=f"collect x{len(actors)}", enabled=show)
    last_compact = 0
    try:
        pending = list(runs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            tallies = ray.get([a.progress.remote() for a in actors])
            total = Tally()
            for tally, _ in tallies:
                total = total.merge(tally)
            bar.update(total, sum(steps for _, steps in tallies))
            if cfg.compact_every and total.episodes - last_compact >= cfg.compact_every:
                compact_store(cfg.out)
                last_compact = total.episodes
        results = ray.get(runs)  # raises a worker's error here
    finally:
        bar.close()
        for a in actors:
            ray.kill(a)
    return {"collected": sum(r["episodes"] for r in results), "runs": results}
