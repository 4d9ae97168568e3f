"""`quadforge bench store_images` (also the image section of `bench store`): camera frames in the store.

Synthetic QUARD-like episodes (20 s at 50 Hz, 64x64 RGB + 64x64 depth every 10th step = 5 Hz, the
proprioceptive features and hl_commands at every step; frames look rendered: flat colours, two boxes,
a little noise) are staged and compacted, then read back as VLA training windows (H = 6 history frames
+ 1 next frame, B = 64) by ``ImageWindowSampler`` from the on-disk store:

- uniform draws through a cache smaller than the store (every window may need its own chunk);
- the chunk-aware stream (a resident set of chunks, one swapped per batch);
- a small conv net trained on each batch (what a training loop sees) fed by uniform draws or the
  stream, each with and without the prefetch thread;
- uniform draws with a cache holding the whole store (the RAM-resident ceiling).

Also: store bytes per frame (on disk vs raw), and what recording frames costs a rollout step
(``FrameRecorder`` at 64 envs vs the packed proprioceptive step buffer).
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quadforge.data.compaction import compact
from quadforge.data.image_sampler import ImageWindowSampler, prefetch
from quadforge.data.writer import StagingWriter
from quadforge.data.store import TrajectoryStore
from quadforge.data.synthetic import synthetic_image_episode, synthetic_info, synthetic_task_params
from quadforge.envs.quard.families import family_names
from quadforge.tools.bench.common import Table, report
from quadforge.seeding import numpy_rng

STRIDE, SIZE, HISTORY, BATCH = 10, 64, 6, 64


def _stage(root: Path, episodes: int, length: int) -> tuple[int, int, float, float]:
    rng = numpy_rng(0, "bench_store_images")
    writer = StagingWriter(root, "bench")
    steps = frames = 0
    wall = cpu = 0.0
    for i in range(episodes):
        success = i % 4 != 3
        feats = synthetic_image_episode(rng, length, success, stride=STRIDE, size=SIZE, depth=True,
                                        instruction_index=i % 7)
        params = synthetic_task_params(i, families=family_names())
        info = {**synthetic_info(i, success), "task": f"quard:{params['family']}", "task_params": params,
                "instruction": params["instruction"], "instructions": {str(i % 7): params["instruction"]},
                "frame_stride": STRIDE}
        w0, c0 = time.perf_counter(), time.process_time()
        writer.write_episode(feats, info)
        wall, cpu = wall + time.perf_counter() - w0, cpu + time.process_time() - c0
        steps, frames = steps + length, frames + len(feats["images/front_rgb"])
    return steps, frames, wall, cpu


def _rate(fn, count: int) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return count / (time.perf_counter() - w0), count / max(time.process_time() - c0, 1e-9)


def _consumer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small conv encoder trained on each batch: the work prefetching overlaps."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 5, stride=4), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=2),
                              torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 12))
    return net, torch.optim.SGD(net.parameters(), lr=1e-3)


def _train_on(net, opt, batch) -> None:
    x = batch["images/front_rgb"].flatten(0, 1).permute(0, 3, 1, 2).float().div_(255)
    loss = (net(x).view(BATCH, HISTORY, 12) - batch["actions"]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _recording_cost(num_envs: int = 64, steps: int = 100) -> Table:
    from quadforge.collection.frames import FrameRecorder
    from quadforge.collection.rollout import PackedSteps
    from quadforge.data.synthetic import PROPRIO_FEATURES
    from quadforge.data.schema import CATALOGUE
    terms = {n: torch.zeros((num_envs,) + CATALOGUE[n].shape, dtype=torch.bool if CATALOGUE[n].dtype == "bool"
                            else torch.float32) for n in PROPRIO_FEATURES}
    frames = {"images/front_rgb": torch.randint(0, 255, (num_envs, SIZE, SIZE, 3), dtype=torch.uint8),
              "images/front_depth": torch.rand(num_envs, SIZE, SIZE)}
    t = Table(f"rollout recording cost per control step ({num_envs} envs, {SIZE}x{SIZE} RGB + depth)",
              ["what", "us per step", "vs packed proprioception"])
    # buffers sized to the timed steps and written once before timing: page faults on first touch of a
    # fresh buffer are allocation, not recording (a collector reuses its buffers episode after episode)
    packed = PackedSteps(num_envs, steps)
    count = np.zeros(num_envs, dtype=np.int64)
    rng = np.random.default_rng(0)
    offsets = rng.integers(0, STRIDE, num_envs)    # envs out of phase, as after auto-resets

    def run(fn) -> float:
        for s in range(steps):
            count[:] = (s + offsets) % steps
            fn()
        t0 = time.perf_counter()
        for s in range(steps):
            count[:] = (s + offsets) % steps
            fn()
        return (time.perf_counter() - t0) / steps * 1e6
    base = run(lambda: packed.write(count, terms))
    t.add("packed proprioceptive step buffer (15 features)", base, 1.0)
    for stride in (STRIDE, 1):
        rec = FrameRecorder(num_envs, steps, stride)
        us = run(lambda: rec.write(count, frames))
        t.add(f"FrameRecorder, a frame every {stride} step(s)", us, us / base)
    return t


def image_tables(quick: bool = False) -> tuple[list[Table], dict[str, Any]]:
    torch.set_num_threads(1)
    episodes, length = (24, 1000) if quick else (120, 1000)
    n_batches = 8 if quick else 30
    tmp = Path(tempfile.mkdtemp(prefix="qf_bench_images_"))
    extra: dict[str, Any] = {}
    try:
        root = tmp / "s"
        steps, frames, w_stage, c_stage = _stage(root, episodes, length)
        rates = Table(f"image store ({episodes} episodes x {length} steps, {SIZE}x{SIZE} RGB + depth every "
                      f"{STRIDE} steps = {frames} frames)", ["operation", "per wall s", "per CPU s", "unit"])
        rates.add("staging write (one file + fsync per episode)", frames / w_stage, frames / c_stage, "frames/s")
        w0, c0 = time.perf_counter(), time.process_time()
        compact(root)
        w, c = time.perf_counter() - w0, time.process_time() - c0
        rates.add("compaction (steps + frames)", frames / w, frames / c, "frames/s")
        rates.add("  the same compaction", steps / w, steps / c, "steps/s")
        store = TrajectoryStore.open(root)

        size = Table("store bytes per frame", ["feature", "chunk (frames)", "raw B/frame", "on disk B/frame",
                                               "compression"])
        for name in store.image_features:
            spec = store.schema.features[name]
            raw = int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize
            disk = sum(p.stat().st_size for p in (root / name).rglob("*") if p.is_file()) / frames
            size.add(name, store.array(name).chunks[0], raw, disk, raw / disk)
            extra[f"bytes_per_frame/{name}"] = disk
        step_bytes = sum(p.stat().st_size for p in (root / "data").rglob("*") if p.is_file())
        size.add("all per-step features, per frame's 10 steps", "", "", step_bytes / frames, "")

        chunk = store.array("images/front_rgb").chunks[0]
        n_chunks = -(-frames // chunk)
        small = max(8, n_chunks // 6)
        win = Table(f"image windows from disk (H={HISTORY}+1 frames, B={BATCH}, RGB + depth, {n_chunks} chunks of "
                    f"{chunk} frames per camera; small cache = {small} chunks)",
                    ["mode", "windows per wall s", "windows per CPU s", "chunk misses per batch"])

        def measure(label: str, sampler: ImageWindowSampler, batches) -> float:
            first = sampler.caches["images/front_rgb"].misses
            wall, cpu = _rate(lambda: [next(batches) for _ in range(n_batches)], n_batches * BATCH)
            misses = (sampler.caches["images/front_rgb"].misses - first) / n_batches
            win.add(label, wall, cpu, misses)
            return wall

        def draws(s):
            while True:
                yield s.sample(BATCH)
        s = ImageWindowSampler(store, history=HISTORY, split="all", success_ratio=0.7569, cache_chunks=small)
        uniform = measure("uniform draws, small cache", s, draws(s))
        s = ImageWindowSampler(store, history=HISTORY, split="all", success_ratio=0.7569, cache_chunks=small)
        stream = measure("chunk-aware stream, small cache", s, s.stream(BATCH))
        s = ImageWindowSampler(store, history=HISTORY, split="all", success_ratio=0.7569, cache_chunks=n_chunks)
        for _ in s.epoch(BATCH * 8):   # warm: every chunk decoded once
            pass
        resident = measure("uniform draws, whole store cached (RAM ceiling)", s, draws(s))

        train = Table(f"training loop on image windows (small conv net, B={BATCH}x{HISTORY} frames)",
                      ["loop", "batches per wall s", "windows per wall s"])
        torch.manual_seed(0)
        for label, chunk_aware, pre in (("uniform draws, no prefetch", False, False),
                                        ("uniform draws + prefetch thread", False, True),
                                        ("chunk-aware stream, no prefetch", True, False),
                                        ("chunk-aware stream + prefetch thread", True, True)):
            net, opt = _consumer()
            s = ImageWindowSampler(store, history=HISTORY, split="all", success_ratio=0.7569, cache_chunks=small)
            source = s.stream(BATCH) if chunk_aware else draws(s)
            batches = prefetch(source, depth=2) if pre else source
            w0 = time.perf_counter()
            for _ in range(n_batches):
                _train_on(net, opt, next(batches))
            wall = time.perf_counter() - w0
            if pre:
                batches.close()
            train.add(label, n_batches / wall, n_batches * BATCH / wall)

        ratios = Table("ratios (same run)", ["comparison", "ratio"])
        ratios.add("chunk-aware stream / uniform draws (small cache)", stream / uniform)
        ratios.add("whole store cached / chunk-aware stream", resident / stream)
        ratios.add("training loop, uniform draws: prefetch / no prefetch", train.rows[1][1] / train.rows[0][1])
        ratios.add("training loop, chunk-aware stream: prefetch / no prefetch", train.rows[3][1] / train.rows[2][1])
        return [rates, size, win, train, ratios, _recording_cost(num_envs=16 if quick else 64)], extra
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(quick: bool = False, json_path: str | None = None) -> int:
    tables, extra = image_tables(quick)
    report("store_images", tables, json_path, extra=extra)
    return 0
