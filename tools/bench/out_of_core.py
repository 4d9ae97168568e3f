"""`quadforge bench out_of_core`: training on stores larger than RAM (issue 28), both sampler paths side by side.

Writes synthetic stores directly (no simulation: ``data.synthetic_store``, the proprio layout's features),
then measures, each in a fresh process so its peak RSS is its own:

- a store that fits both paths (2M steps; quick: 100k): window sampling (context 16, B = 256) and
  training (FCNet, the ``cpu`` preset at B = 256) on the RAM path and the out-of-core path;
- a large store (50M steps; quick: 400k) on the out-of-core path: the one-off shard write, the streaming
  moments pass, sampling and training, with peak RSS and RSS growth per stored step;
- the RAM path's ceiling on this machine: its measured bytes per stored step against this machine's memory;
- DAgger's aggregate (``data.store_set.StoreSet``: an expert store and a relabelled one read as one): the
  store that fits both paths plus a second store of half its steps, sampled and trained on both paths, and
  the large store plus that second store out of core (RSS growth per stored step of the aggregate).

Bars (issue 28): peak RSS <= 8 GB and RSS growth <= 50 B per stored step on the large store out of core;
out-of-core windows/s >= 0.5x the RAM path's on the store that fits both (same run); the same for DAgger's
aggregate. Stores go to
``runs/bench_out_of_core/`` under the working directory (gitignored), are reused when complete (the time
their writing took is kept beside them) and deleted at the end unless ``QUADFORGE_BENCH_KEEP=1``.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path
from typing import Any

from quadforge.tools.bench.common import Table, process_memory, report

STORE_DIR = Path("runs/bench_out_of_core")
CONTEXT, BATCH = 16, 256
# (store that fits both paths, large store, sampled batches, training steps)
FULL = (2_000_000, 50_000_000, 400, 60)
QUICK = (100_000, 400_000, 50, 12)


def _child(kind: str, store_paths: list[str], budget: str, batches: int, train_steps: int, out: str, queue) -> None:
    """One measurement in a fresh process: build the sampler on one path, draw batches, or train. Several
    ``store_paths``: DAgger's aggregate of them (a ``StoreSet``)."""
    import numpy as np
    import torch
    torch.set_num_threads(1)
    from quadforge.data.ram_budget import sampler_source
    from quadforge.data.samplers import WindowSampler
    from quadforge.data.step_shards import ShardSource
    from quadforge.data.store import TrajectoryStore
    from quadforge.data.store_set import StoreSet
    from quadforge.layout import get_layout
    from quadforge.training.imitation import train
    from quadforge.training.presets import preset
    base = process_memory("VmRSS")
    store = StoreSet.open(store_paths) if len(store_paths) > 1 else TrajectoryStore.open(store_paths[0])
    layout = get_layout("proprio")
    res: dict[str, Any] = {"steps": store.num_steps}
    if kind == "sample":
        t0 = time.perf_counter()
        src = sampler_source(store, [*layout.term_names, "actions"], layout, budget, log=None)
        s = WindowSampler(src, layout, context=CONTEXT, split="train", seed=0, reward_feature=None)
        res["build_s"] = time.perf_counter() - t0
        res["path"] = "out-of-core" if isinstance(src, ShardSource) else "RAM"
        t0 = time.perf_counter()
        mean, _ = s.obs_stats()
        res["moments_s"] = time.perf_counter() - t0
        for _ in range(3):
            s.sample(BATCH)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(batches):
            s.sample(BATCH)
        res["windows_per_s"] = batches * BATCH / (time.perf_counter() - t0)
        res["windows_per_cpu_s"] = batches * BATCH / (time.process_time() - c0)   # less sensitive to the load
        res["finite"] = bool(np.isfinite(mean.numpy()).all())
    else:
        cfg = preset("fcnet", "cpu")
        cfg.max_steps, cfg.batch_size, cfg.context, cfg.ram_budget = train_steps, BATCH, CONTEXT, budget
        cfg.log_every = cfg.val_every = max(1, train_steps // 3)
        cfg.val_batches, cfg.tensorboard, cfg.checkpoint_every_s = 1, False, 0.0
        t0 = time.perf_counter()
        result = train(cfg, store if len(store_paths) > 1 else store_paths[0], out)
        res["train_s"] = time.perf_counter() - t0
        rows = [r["windows_per_s"] for r in result.history[1:]] or [result.history[-1]["windows_per_s"]]
        res["windows_per_s"] = float(np.median(rows))
    res["peak_rss"], res["base_rss"] = process_memory("VmHWM"), base
    queue.put(res)


def _measure(kind: str, stores: list[Path], budget: str, batches: int, train_steps: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = stores[0]
    out = store.parent / f"train_{kind}_{budget}"
    shutil.rmtree(out, ignore_errors=True)
    p = ctx.Process(target=_child, args=(kind, [str(s) for s in stores], budget, batches, train_steps, str(out),
                                         queue))
    p.start()
    try:
        res = queue.get(timeout=6 * 3600)
    finally:
        p.join()
    shutil.rmtree(out, ignore_errors=True)
    if p.exitcode != 0:
        raise RuntimeError(f"bench out_of_core: the {kind} measurement on {[str(s) for s in stores]} exited "
                           f"with {p.exitcode}")
    return res


def _store(steps: int, seed: int = 0) -> tuple[Path, float, bool]:
    """The synthetic store of ``steps`` steps (written now, or reused): (path, seconds its writing took, reused)."""
    from quadforge.data.store import TrajectoryStore
    from quadforge.data.synthetic_store import write_synthetic_store
    path = STORE_DIR / (f"store_{steps}" + (f"_seed{seed}" if seed else ""))
    record = path.with_name(path.name + ".seconds")
    if record.is_file() and (path / "manifest.json").is_file() and TrajectoryStore.open(path).num_steps >= steps:
        return path, float(record.read_text()), True
    seconds = write_synthetic_store(path, steps, seed=seed, log=print)
    record.write_text(str(seconds))
    return path, seconds, False


def _ram_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def main(quick: bool = False, json_path: str | None = None) -> int:
    from quadforge.data.ram_budget import DEFAULT_FRACTION
    small_steps, big_steps, batches, train_steps = QUICK if quick else FULL
    STORE_DIR.mkdir(parents=True, exist_ok=True)
    try:
        small, small_s, small_reused = _store(small_steps)
        big, big_s, big_reused = _store(big_steps)
        second_steps = max(1, small_steps // 2)      # DAgger's relabelled store beside the expert's
        second, second_s, second_reused = _store(second_steps, seed=1)
        writes = Table("synthetic stores (proprio features, 1,000-step episodes, written without simulation)",
                       ["store", "steps", "write s", "steps/s", "on disk GB", "reused"])
        for path, steps, s, reused in ((small, small_steps, small_s, small_reused), (big, big_steps, big_s, big_reused),
                                       (second, second_steps, second_s, second_reused)):
            disk = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "shards" not in p.parts)
            writes.add(path.name, steps, s, steps / s, disk / 1e9, reused)

        paths = Table(f"window sampling and training, context {CONTEXT}, B = {BATCH} (each row a fresh process; "
                      f"shared 2-core machine)",
                      ["store steps", "path", "what", "windows/s", "windows/CPU s", "setup s", "moments s",
                       "peak RSS GB", "RSS growth B/step"])
        results: dict[str, dict[str, Any]] = {}
        for store, steps, label in ((small, small_steps, "fits"), (big, big_steps, "large")):
            for budget in (("inf", "0") if label == "fits" else ("0",)):
                for kind in ("sample", "train"):
                    r = _measure(kind, [store], budget, batches, train_steps)
                    path = "RAM" if budget == "inf" else "out-of-core"
                    results[f"{label}/{path}/{kind}"] = r
                    growth = (r["peak_rss"] - r["base_rss"]) / steps
                    paths.add(steps, path, "sampler" if kind == "sample" else "FCNet training",
                              r["windows_per_s"], r.get("windows_per_cpu_s", ""),
                              r.get("build_s", r.get("train_s", 0.0)), r.get("moments_s", ""),
                              r["peak_rss"] / 1e9, growth)

        dagger = Table(f"DAgger's aggregate: an expert store and a relabelled store ({second_steps:,} steps) read as "
                       f"one (StoreSet), context {CONTEXT}, B = {BATCH} (each row a fresh process)",
                       ["aggregate steps", "path", "what", "windows/s", "windows/CPU s", "setup s", "moments s",
                        "peak RSS GB", "RSS growth B/step"])
        for store, label in ((small, "fits"), (big, "large")):
            steps = (small_steps if label == "fits" else big_steps) + second_steps
            for budget in (("inf", "0") if label == "fits" else ("0",)):
                for kind in ("sample", "train"):
                    r = _measure(kind, [store, second], budget, batches, train_steps)
                    path = "RAM" if budget == "inf" else "out-of-core"
                    results[f"dagger/{label}/{path}/{kind}"] = r
                    dagger.add(f"{steps - second_steps:,} + {second_steps:,}", path,
                               "sampler" if kind == "sample" else "FCNet training", r["windows_per_s"],
                               r.get("windows_per_cpu_s", ""), r.get("build_s", r.get("train_s", 0.0)),
                               r.get("moments_s", ""), r["peak_rss"] / 1e9, (r["peak_rss"] - r["base_rss"]) / steps)

        ram_per_step = ((results["fits/RAM/sample"]["peak_rss"] - results["fits/RAM/sample"]["base_rss"])
                        / small_steps)
        ceiling = Table("the RAM path's ceiling on this machine (from its measured bytes per stored step)",
                        ["memory", "GB", "RAM path B/step", "max steps"])
        ceiling.add("physical memory", _ram_bytes() / 1e9, ram_per_step, _ram_bytes() / ram_per_step)
        ceiling.add(f"--ram-budget auto ({DEFAULT_FRACTION:.0%})", DEFAULT_FRACTION * _ram_bytes() / 1e9, ram_per_step,
                    DEFAULT_FRACTION * _ram_bytes() / ram_per_step)

        big_ooc = results["large/out-of-core/train"]
        big_sample = results["large/out-of-core/sample"]
        peak = max(big_ooc["peak_rss"], big_sample["peak_rss"])
        growth = max((r["peak_rss"] - r["base_rss"]) / big_steps for r in (big_ooc, big_sample))
        bars = Table("issue 28 bars (same run)", ["bar", "measured", "target", "met"])
        bars.add(f"peak RSS on the {big_steps:,}-step store, out of core (GB)", peak / 1e9, "<= 8", peak <= 8e9)
        bars.add("RSS growth per stored step, out of core (B)", growth, "<= 50", growth <= 50)
        for kind in ("sample", "train"):
            ratio = (results[f"fits/out-of-core/{kind}"]["windows_per_s"] / results[f"fits/RAM/{kind}"]["windows_per_s"])
            what = "sampler" if kind == "sample" else "training"
            bars.add(f"out-of-core / RAM {what} windows/s ({small_steps:,}-step store)", ratio, ">= 0.5", ratio >= 0.5)
        cpu = (results["fits/out-of-core/sample"]["windows_per_cpu_s"] / results["fits/RAM/sample"]["windows_per_cpu_s"])
        bars.add(f"out-of-core / RAM sampler windows per CPU s ({small_steps:,}-step store)", cpu, ">= 0.5", cpu >= 0.5)
        for kind in ("sample", "train"):
            ratio = (results[f"dagger/fits/out-of-core/{kind}"]["windows_per_s"]
                     / results[f"dagger/fits/RAM/{kind}"]["windows_per_s"])
            what = "sampler" if kind == "sample" else "training"
            bars.add(f"DAgger aggregate: out-of-core / RAM {what} windows/s ({small_steps + second_steps:,} steps, "
                     f"2 stores)", ratio, ">= 0.5", ratio >= 0.5)
        cpu = (results["dagger/fits/out-of-core/sample"]["windows_per_cpu_s"]
               / results["dagger/fits/RAM/sample"]["windows_per_cpu_s"])
        bars.add(f"DAgger aggregate: out-of-core / RAM sampler windows per CPU s ({small_steps + second_steps:,} "
                 f"steps, 2 stores)", cpu, ">= 0.5", cpu >= 0.5)
        agg = max((r["peak_rss"] - r["base_rss"]) / (big_steps + second_steps)
                  for r in (results["dagger/large/out-of-core/sample"], results["dagger/large/out-of-core/train"]))
        bars.add(f"DAgger aggregate: RSS growth per stored step, out of core ({big_steps + second_steps:,} steps) (B)",
                 agg, "<= 50", agg <= 50)
        report("out_of_core", [writes, paths, ceiling, dagger, bars], json_path, extra={"raw": results})
    finally:
        if os.environ.get("QUADFORGE_BENCH_KEEP") != "1":
            shutil.rmtree(STORE_DIR, ignore_errors=True)
    return 0
