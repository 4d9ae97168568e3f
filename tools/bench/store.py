"""`quadforge bench store`: staging, compaction, loading and window sampling throughput.

All ratios are measured in one run on the same synthetic proprioceptive episodes (the features a
collection stores: 15 per step, 121 floats + 2 flags). Issue 4 targets: compaction >= 300k steps/s;
RAM window sampling >= 100k windows/s at n = 64, B = 1024; collection >= 0.85 x env-alone.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr.codecs  # noqa: F401  (zarr's ~0.3 s first import is start-up, not compaction throughput)

from quadforge.data.compaction import compact
from quadforge.data.episode_table import DICT_COLUMNS, read_table, segment_files_on_disk
from quadforge.data.samplers import TransitionSampler, WindowSampler
from quadforge.data.writer import StagingWriter
from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic import synthetic_episode, synthetic_info
from quadforge.layout import get_layout
from quadforge.tools.bench.common import Table, process_memory, report
from quadforge.seeding import numpy_rng


def _timed(fn) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of this process, all threads)."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def _repeat(fn, arg, reps: int) -> None:
    """Call ``fn(arg)`` ``reps`` times, dropping each result as a training loop does (keeping them
    all would time page faults on fresh memory instead of sampling)."""
    for _ in range(reps):
        fn(arg)


def _stage(root: Path, episodes: int, length: int, seed: int) -> tuple[int, float, float]:
    rng = numpy_rng(seed, "bench_store")
    writer = StagingWriter(root, "bench")
    eps = [(synthetic_episode(rng, length, i % 4 != 3), synthetic_info(i, i % 4 != 3)) for i in range(episodes)]
    _, wall, cpu = _timed(lambda: [writer.write_episode(f, i) for f, i in eps])
    return episodes * length, wall, cpu


def _disk_windows(store: TrajectoryStore, terms: tuple[str, ...], context: int, count: int, seed: int) -> None:
    """Read ``count`` random windows each window's terms straight from the on-disk zarr arrays."""
    arrays = [store.array(t) for t in terms]
    ends = store.episodes["end"]
    starts = store.episodes["start"]
    rng = numpy_rng(seed, "disk_windows")
    for _ in range(count):
        e = int(rng.integers(len(ends)))
        t = int(rng.integers(starts[e], ends[e]))
        lo = max(int(starts[e]), t - context + 1)
        for a in arrays:
            np.asarray(a[lo:t + 1])


def _validation_costs(root: Path, raw_bytes: int, t_open: float, t_load: float) -> Table:
    """Seconds per GB of raw (decoded) data for each integrity check level (files hot in the page
    cache: the store was just written; a cold disk adds its read time to the reading levels)."""
    from quadforge.data.validate import validate
    disk = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    gb = raw_bytes / 1e9
    t = Table(f"integrity checks ({raw_bytes / 1e6:.0f} MB raw, {disk / 1e6:.0f} MB on disk)",
              ["check", "wall s", "s per GB raw", "s per GB on disk", "ok"])
    t.add("TrajectoryStore.open (digests, one stat per chunk)", t_open, t_open / gb, t_open / (disk / 1e9), True)
    t.add("store.load (decode + CRC32C per chunk)", t_load, t_load / gb, t_load / (disk / 1e9), True)
    for label, kw in (("validate --quick (metadata, chunk files)", dict(checksums=False, check_values=False)),
                      ("validate (default: every chunk's CRC32C)", dict(checksums=True, check_values=False)),
                      ("validate --deep (+ finite values, stats)", dict(checksums=True, check_values=True))):
        rep, wall, _ = _timed(lambda: validate(root, **kw))
        t.add(label, wall, wall / gb, wall / (disk / 1e9), rep.ok)
    return t


def _collection_ratio(quick: bool) -> tuple[Table | None, str]:
    try:
        from quadforge.collection.throughput import measure  # team "collection"
    except ImportError:
        return None, "quadforge.collection.throughput.measure is missing: collection vs env-alone ratio not measured"
    num_envs, steps = (64, 250) if quick else (256, 300)  # > 200 steps: 4 s episodes must finish
    # Storage has a fixed cost per episode (one staging file + fsync), so the ratio depends on episode
    # length: 4 s (200 steps) is FCNet's dataset recipe (~192 steps per episode) and is the target row;
    # 1 s (50 steps) is a stress row with four times the writes per env-step.
    t = Table("collection vs env alone (gait expert, flat)",
              ["episode s", "envs", "env steps/s", "collect steps/s", "ratio", "episodes written", "target"])
    for episode_s, target in ((4.0, ">= 0.85"), (1.0, "stress")):
        res: dict[str, Any] = measure(num_envs, steps, episode_s=episode_s)
        t.add(episode_s, num_envs, res["env_steps_per_s"], res["collect_steps_per_s"], res["ratio"],
              res["episodes_written"], target)
    return t, ""


def _collection_info(i: int, rng: np.random.Generator) -> dict[str, Any]:
    """An info dict the size and shape of a gait-expert collection's (its label's numbers and rule, the
    collector's extras: about 1 KB as an episode-table row), not ``synthetic_info``'s few keys."""
    ok = i % 4 != 3
    numbers = {k: float(rng.random()) for k in ("lin_vel_error", "ang_vel_error", "distance",
                                                 "commanded_displacement", "progress")}
    rule = {"max_lin_vel_error": 0.35, "max_ang_vel_error": 0.5, "min_progress_fraction": 0.5,
            "min_commanded_displacement": 0.5, "version": 1}
    extra = {"terrain_spec": "flat,slope_up,rough_slope,stairs_up", "skill_mix": "walking=1", "push_vel": 0.0,
             "termination_reason": "none" if ok else "fall", "env_id": i % 256, "action_noise_std": 0.0,
             **{k: float(rng.random()) for k in ("distance", "commanded_distance", "lin_vel_error",
                                                  "lin_vel_x_error", "ang_vel_error", "commanded_displacement")}}
    cmd = rng.uniform(-1, 1, 3)
    return {**synthetic_info(i, ok), "label": {"reason": "success" if ok else "fall", "numbers": numbers, "rule": rule},
            "cmd_vx": float(cmd[0]), "cmd_vy": float(cmd[1]), "cmd_wz": float(cmd[2]), "return": float(rng.random()),
            **extra}


def _table_growth(tmp: Path, quick: bool, sizes: tuple[int, ...] | None = None, runs: int | None = None) -> Table:
    """Runs of compactions of 50 short episodes onto stores whose episode tables grow. A compaction that
    rewrote the whole table grew with the store; with the table in segments (data/episode_table.py) a
    run's median should not, and its slowest compaction is the one whose merge reached furthest. Then one
    ``TrajectoryStore.open``, which reads and checks the whole table (linear in the store either way)."""
    sizes = sizes or ((1_000, 5_000) if quick else (1_000, 10_000, 30_000, 100_000))
    runs = runs or (5 if quick else 10)
    features = ("actions", "rewards", "terminated", "time_outs")
    table = Table(f"{runs} compactions of 50 episodes (5 steps each) onto a store of N episodes (collection-sized rows)",
                  ["table episodes", "median wall s", "max wall s", "median CPU s", "table MB", "table files",
                   "median / the smallest's", "open s"])
    root = tmp / "table_growth"
    rng = numpy_rng(0, "table_growth")
    have, first = 0, None
    with StagingWriter(root, "growth") as writer:
        for size in sizes:
            while have < size:           # grown in blocks, untimed
                for i in range(have, min(size, have + 5_000)):
                    writer.write_episode(synthetic_episode(rng, 5, i % 4 != 3, features), _collection_info(i, rng))
                have = min(size, have + 5_000)
                compact(root)
            walls, cpus, start = [], [], have
            for _ in range(runs):
                for i in range(have, have + 50):
                    writer.write_episode(synthetic_episode(rng, 5, i % 4 != 3, features), _collection_info(i, rng))
                _, wall, cpu = _timed(lambda: compact(root))
                walls.append(wall)
                cpus.append(cpu)
                have += 50
            median = float(np.median(walls))
            first = first or median
            files = [root / f for f in segment_files_on_disk(root)]
            _, open_wall, _ = _timed(lambda: TrajectoryStore.open(root))   # reads and checks the whole table
            table.add(start, median, max(walls), float(np.median(cpus)), sum(p.stat().st_size for p in files) / 1e6,
                      len(files), median / first, open_wall)
    return table


def _table_rss_child(root: str, defer_dicts: bool, queue) -> None:
    """In a fresh process: read the table once (imports, allocator), then again; the resident bytes the second
    read added, per row."""
    import gc
    manifest = json.loads((Path(root) / "manifest.json").read_text())
    read_table(Path(root), manifest, defer_dicts=defer_dicts)
    gc.collect()
    before = process_memory("VmRSS")
    table = read_table(Path(root), manifest, defer_dicts=defer_dicts)
    gc.collect()
    queue.put((process_memory("VmRSS") - before) / len(table))


def _rss_per_row(root: Path, defer_dicts: bool) -> float:
    """Resident bytes per row a table read adds to a fresh process (after a first read warmed its imports
    and allocator): what each DDP rank pays, allocator slack and mapped pages included."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_table_rss_child, args=(str(root), defer_dicts, queue))
    child.start()
    try:
        return float(queue.get(timeout=600))
    finally:
        child.join()


def _table_open(root: Path, rounds: int = 5) -> Table:
    """Reading a store's episode table (what every ``TrajectoryStore.open`` does, in each process): all its
    columns decoded, as before, against the dict columns left in the segment files until read
    (``DeferredColumn``); then that first read of them. Rounds alternate the two; the best round of each is
    kept (the host's noise only ever adds). Memory: the heap the table holds (tracemalloc, one more read
    each) and the resident memory a read adds to a process of its own."""
    manifest = json.loads((root / "manifest.json").read_text())
    rows = int(manifest["num_episodes"])
    table = Table(f"opening the episode table ({rows:,} collection-sized rows, {len(manifest.get('episode_segments', []))} "
                  f"segments; best of {rounds} alternating rounds)",
                  ["read", "ms per 1k rows", "heap B per row", "RSS B per row", "/ all decoded"])
    eager, deferred, later = "all columns decoded", "dict columns deferred", "  then its first read of the dict columns"
    read = {eager: lambda: read_table(root, manifest, defer_dicts=False), deferred: lambda: read_table(root, manifest)}
    best = {eager: float("inf"), deferred: float("inf"), later: float("inf")}
    for _ in range(rounds):
        for name in (eager, deferred):
            t, wall, _ = _timed(read[name])
            best[name] = min(best[name], wall)
            if name == deferred:
                _, wall, _ = _timed(t.decode)
                best[later] = min(best[later], wall)
    heap = {}
    for name in (eager, deferred):
        tracemalloc.start()
        t = read[name]()
        heap[name] = tracemalloc.get_traced_memory()[0] / rows
        tracemalloc.stop()
        del t
    rss = {eager: _rss_per_row(root, False), deferred: _rss_per_row(root, True)}
    for name, wall in best.items():
        table.add(name, 1e3 * wall / rows * 1e3, heap.get(name, float("nan")), rss.get(name, float("nan")),
                  wall / best[eager])
    return table


def main(quick: bool = False, json_path: str | None = None) -> int:
    torch.set_num_threads(1)
    episodes, length = (60, 1000) if quick else (200, 1000)
    context, batch = 64, 1024
    layout = get_layout("proprio")
    tmp = Path(tempfile.mkdtemp(prefix="qf_bench_store_"))
    try:
        base = tmp / "staged"
        steps, t_stage, c_stage = _stage(base, episodes, length, seed=0)
        # wall rates depend on how loaded the shared machine is; CPU-second rates much less so
        rates = Table(f"store throughput ({episodes} episodes x {length} steps, proprioception)",
                      ["operation", "per wall second", "per CPU second", "unit", "wall s"])
        rates.add("staging write (one file + fsync per episode)", steps / t_stage, steps / c_stage, "steps/s",
                  t_stage)
        compaction: dict[str, float] = {}
        compaction_cpu: dict[str, float] = {}
        # one-episode appends are ~10x slower: compare both modes on the same first `subset` episodes,
        # and time the buffered mode on everything
        subset = min(episodes, 20)
        staged = sorted((base / "staging").iterdir())
        for mode, count in (("chunked", episodes), ("chunked_subset", subset), ("episode", subset)):
            root = tmp / mode
            (root / "staging").mkdir(parents=True)
            for p in staged[:count]:
                shutil.copy(p, root / "staging" / p.name)
            r, wall, cpu = _timed(lambda: compact(root, append_mode=mode.split("_")[0]))
            compaction[mode], compaction_cpu[mode] = r.steps / wall, r.steps / cpu
            label = {"chunked": "compaction, buffered chunk-aligned appends",
                     "chunked_subset": f"  same, first {subset} episodes",
                     "episode": f"  one episode at a time (zarr append), first {subset} episodes"}[mode]
            rates.add(label, r.steps / wall, r.steps / cpu, "steps/s", wall)
        store = TrajectoryStore.open(tmp / "chunked")
        _, t_open, _ = _timed(lambda: TrajectoryStore.open(tmp / "chunked"))
        loaded, t_load, c_load = _timed(store.load)
        rates.add("full load into RAM (with the chunk CRC32C check)", steps / t_load, steps / c_load, "steps/s",
                  t_load)
        checks = _validation_costs(tmp / "chunked", sum(a.nbytes for a in loaded.values()), t_open, t_load)
        del loaded
        sampler, t_build, c_build = _timed(lambda: WindowSampler(store, layout, context=context, split="all"))
        rates.add("WindowSampler build (load + layout + index)", steps / t_build, steps / c_build, "steps/s",
                  t_build)
        reps = 10 if quick else 30
        _, w, c = _timed(lambda: _repeat(sampler.sample, batch, reps))
        t_sample, window_cpu_rate = w / reps, reps * batch / c
        rates.add(f"RAM window sampling (n={context}, B={batch})", batch / t_sample, reps * batch / c,
                  "windows/s", t_sample)
        n_ep, w, c = _timed(lambda: sum(len(b["mask"]) for b in sampler.epoch(batch)))
        rates.add(f"RAM epoch pass (n={context}, B={batch})", n_ep / w, n_ep / c, "windows/s", w)
        trans = TransitionSampler(store, layout, context=context, split="all", success_ratio=0.7569)
        _, w, c = _timed(lambda: _repeat(trans.sample, batch, reps))
        rates.add(f"RAM transition sampling (n={context}, B={batch})", reps * batch / w, reps * batch / c,
                  "transitions/s", w / reps)
        n_disk = 20 if quick else 50
        _, w, c = _timed(lambda: _disk_windows(store, layout.term_names, context, n_disk, seed=0))
        disk = n_disk / w
        rates.add(f"disk zarr random windows ({len(layout.term_names)} terms)", disk, n_disk / c, "windows/s", w)

        ratios = Table("ratios (same run)", ["comparison", "ratio", "target"])
        ratios.add("buffered / one-episode compaction (same episodes)",
                   compaction["chunked_subset"] / compaction["episode"], "> 1")
        ratios.add("RAM / disk window sampling", (batch / t_sample) / disk, ">> 1")
        ratios.add("compaction steps per wall s / 300k target", compaction["chunked"] / 3e5, ">= 1")
        ratios.add("compaction steps per CPU s / 300k target", compaction_cpu["chunked"] / 3e5, ">= 1")
        ratios.add("RAM windows per wall s / 100k target", (batch / t_sample) / 1e5, ">= 1")
        ratios.add("RAM windows per CPU s / 100k target", window_cpu_rate / 1e5, ">= 1")
        tables = [rates, checks, ratios, _table_growth(tmp, quick), _table_open(tmp / "table_growth")]
        from quadforge.tools.bench.store_images import image_tables   # camera frames: tools/bench/store_images.py
        image, image_extra = image_tables(quick)
        tables += image
        coll, note = _collection_ratio(quick)
        if coll is not None:
            tables.append(coll)
        else:
            print(note)
        report("store", tables, json_path, extra={**image_extra, **({"collection_note": note} if note else {})})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0
