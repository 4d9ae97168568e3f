"""`quadforge bench store`: staging, compaction, loading and window sampling throughput.

All ratios are measured in one run on the same synthetic proprioceptive episodes (the features a
collection stores: 15 per step, 121 floats + 2 flags). Issue 4 targets: compaction >= 300k steps/s;
RAM window sampling >= 100k windows/s at n = 64, B = 1024; collection >= 0.85 x env-alone.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.compaction import compact
from data.samplers import TransitionSampler, WindowSampler
from data.staging import StagingWriter
from data.store import TrajectoryStore
from data.synthetic import PROPRIO_FEATURES, synthetic_episode, synthetic_info
from envs.layout import get_layout
from tools.bench.common import Table, median_time, report
from tools.seeding import numpy_rng


def _stage(root: Path, episodes: int, length: int, seed: int) -> tuple[int, float]:
    rng = numpy_rng(seed, "bench_store")
    writer = StagingWriter(root, "bench")
    eps = [(synthetic_episode(rng, length, i % 4 != 3), synthetic_info(i, i % 4 != 3)) for i in range(episodes)]
    t0 = time.perf_counter()
    for feats, info in eps:
        writer.write_episode(feats, info)
    return episodes * length, time.perf_counter() - t0


def _disk_windows(store: TrajectoryStore, terms: tuple[str, ...], context: int, count: int, seed: int) -> float:
    """Windows/s reading each window's terms straight from the on-disk zarr arrays."""
    arrays = [store.array(t) for t in terms]
    ends = store.episodes["end"]
    starts = store.episodes["start"]
    rng = numpy_rng(seed, "disk_windows")
    t0 = time.perf_counter()
    for _ in range(count):
        e = int(rng.integers(len(ends)))
        t = int(rng.integers(starts[e], ends[e]))
        lo = max(int(starts[e]), t - context + 1)
        for a in arrays:
            np.asarray(a[lo:t + 1])
    return count / (time.perf_counter() - t0)


def _collection_ratio(quick: bool) -> tuple[Table | None, str]:
    try:
        from collection.throughput import measure  # team "collection"
    except ImportError:
        return None, "collection.throughput.measure is missing: collection vs env-alone ratio not measured"
    num_envs, steps = (64, 100) if quick else (256, 300)
    res: dict[str, Any] = measure(num_envs, steps)
    t = Table("collection vs env alone", ["key", "value"])
    for k, v in res.items():
        t.add(k, v)
    return t, ""


def main(quick: bool = False, json_path: str | None = None) -> int:
    torch.set_num_threads(1)
    episodes, length = (40, 500) if quick else (200, 1000)
    context, batch = 64, 1024
    layout = get_layout("proprio")
    tmp = Path(tempfile.mkdtemp(prefix="qf_bench_store_"))
    try:
        base = tmp / "staged"
        steps, t_stage = _stage(base, episodes, length, seed=0)
        rates = Table(f"store throughput ({episodes} episodes x {length} steps, proprioception)",
                      ["operation", "per second", "unit", "seconds"])
        rates.add("staging write (one file + fsync per episode)", steps / t_stage, "steps/s", t_stage)
        compaction: dict[str, float] = {}
        for mode in ("chunked", "episode"):
            root = tmp / mode
            shutil.copytree(base, root)
            r = compact(root, append_mode=mode)
            compaction[mode] = r.steps / r.seconds
            label = ("compaction, buffered chunk-aligned appends" if mode == "chunked"
                     else "compaction, one episode at a time (zarr append)")
            rates.add(label, compaction[mode], "steps/s", r.seconds)
        store = TrajectoryStore.open(tmp / "chunked")
        t_load = median_time(lambda: store.load(), repeats=3, warmup=1)
        rates.add("full load into RAM", steps / t_load, "steps/s", t_load)
        t0 = time.perf_counter()
        sampler = WindowSampler(store, layout, context=context, split="all")
        t_build = time.perf_counter() - t0
        rates.add("WindowSampler build (load + layout + index)", steps / t_build, "steps/s", t_build)
        t_sample = median_time(lambda: sampler.sample(batch), repeats=10 if quick else 30)
        rates.add(f"RAM window sampling (n={context}, B={batch})", batch / t_sample, "windows/s", t_sample)
        t_epoch0 = time.perf_counter()
        n_ep = sum(len(b["mask"]) for b in sampler.epoch(batch))
        t_epoch = time.perf_counter() - t_epoch0
        rates.add(f"RAM epoch pass (n={context}, B={batch})", n_ep / t_epoch, "windows/s", t_epoch)
        trans = TransitionSampler(store, layout, context=context, split="all", success_ratio=0.7569)
        t_tr = median_time(lambda: trans.sample(batch), repeats=10 if quick else 30)
        rates.add(f"RAM transition sampling (n={context}, B={batch})", batch / t_tr, "transitions/s", t_tr)
        n_disk = 20 if quick else 50
        disk = _disk_windows(store, layout.term_names, context, n_disk, seed=0)
        rates.add(f"disk zarr random windows ({len(layout.term_names)} terms)", disk, "windows/s", n_disk / disk)

        ratios = Table("ratios (same run)", ["comparison", "ratio", "target"])
        ratios.add("buffered / one-episode compaction", compaction["chunked"] / compaction["episode"], "> 1")
        ratios.add("RAM / disk window sampling", (batch / t_sample) / disk, ">> 1")
        ratios.add("compaction steps/s / 300k target", compaction["chunked"] / 3e5, ">= 1")
        ratios.add("RAM windows/s / 100k target", (batch / t_sample) / 1e5, ">= 1")
        tables = [rates, ratios]
        coll, note = _collection_ratio(quick)
        if coll is not None:
            tables.append(coll)
        else:
            print(note)
        report("store", tables, json_path, extra={"collection_note": note} if note else None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0
