"""`quadforge bench vla`: the vision-language-action models at the CPU preset (64² frames, 6-frame history).

Tables:
1. parameters (active / total) and acting latency per command of ``VLAPolicy.act`` at batch 1 and 64,
   with a frame due for every env (the 5 Hz steps: encode the new frame with FiLM + TokenLearner, then
   decode: RT-1's read-outs in one pass, GeRM's 12 dimensions greedily with the key/value cache). The
   control steps in between return the held command and are not timed;
2. training throughput (samples/s) of one optimizer step - DrQ shift, forward, (for the Q objective the
   target network's pass over the 7 frames), backward, AdamW - on synthetic image windows
   (``training.vla_data.ColourChoiceTask`` rendered at 64²) at the preset's batch size.
3. image-window sampling throughput (windows/s) of the trainer's store source
   (``training.vla_data.open_image_source(...).batches``: 6 history frames + the next one, the commands,
   the 75.69 % success mix, converted to the trainer's batch) on synthetic QUARD-like episodes staged and
   compacted to a temporary store (``bench store_images``'s episodes: 64² RGB + depth every 10th step),
   through a chunk cache smaller than the store: uniform i.i.d. draws vs the chunk-aware stream the
   trainer uses by default, without the prefetch thread (the sampler's own rate).
Candidates are timed round-robin so load drift on the shared machine hits them alike; medians; one
torch thread.
"""
from __future__ import annotations

import copy

import torch

from quadforge.tools.bench.common import Table, report
from quadforge.tools.bench.germ import interleaved_medians
from quadforge.models.registry import model_names
from quadforge.seeding import seed_everything

MODELS = model_names(trainer="vla")
IMAGE_SIZE = 64


def _build(name: str, source):
    from quadforge.training.vla import build_model, default_config, model_config
    cfg = default_config(name, "cpu")
    vla = model_config(cfg, source.image_size, source.instructions)
    seed_everything(0)
    return cfg, build_model(name, vla)


def latency_table(batches: tuple[int, ...], repeats: int) -> Table:
    from quadforge.experts.hierarchical import command_binner
    from quadforge.training.vla_data import ColourChoiceTask
    from quadforge.experts.vla import VLAPolicy
    source = ColourChoiceTask(image_size=IMAGE_SIZE, history=6, seed=0)
    settings = {**source.settings, "image_every": 1}     # every call takes a frame: the 5 Hz step's cost
    cols = ["model", "active params", "total params"] + [f"ms/command batch {b}" for b in batches] + \
        [f"ms/env batch {batches[-1]}"]
    t = Table(f"VLA acting latency ({IMAGE_SIZE}² frames, history 6, CPU preset, {torch.get_num_threads()} threads)", cols)
    fns, counts = {}, {}
    for name in ("rt1", "germ", "germ-dense"):            # germ-il acts exactly like germ
        _, model = _build(name, source)
        counts[name] = model.parameter_counts()
        for b in batches:
            policy = VLAPolicy(copy.deepcopy(model), command_binner(), settings, source.instructions, b)
            frames = source.sample(b)["frames"][:, -2]
            obs = {"images/front_rgb": frames, "instruction": torch.arange(b) % len(source.instructions)}
            for _ in range(6):                            # a full history, as in steady state
                policy.act(obs)
            fns[f"{name}/{b}"] = lambda p=policy, o=obs: p.act(o)
    med = interleaved_medians(fns, repeats)
    for name, c in counts.items():
        row = [med[f"{name}/{b}"] * 1e3 for b in batches]
        t.add(name, c["active"], c["total"], *row, row[-1] / batches[-1])
    return t


def throughput_table(steps: int, device: str = "cpu", amps: tuple[str, ...] = ("off",)) -> Table:
    """Samples/s of one optimizer step per model (and per mixed-precision setting in ``amps``) on
    ``device``; the batch is moved there once (the trainer's own copy-in is not timed)."""
    from quadforge.experts.hierarchical import command_binner
    from quadforge.models.vla import images_to_float
    from quadforge.models.vision import random_shift
    from quadforge.training.loop import autocast
    from quadforge.training.vla import losses
    from quadforge.training.vla_data import ColourChoiceTask
    dev = torch.device(device)
    source = ColourChoiceTask(image_size=IMAGE_SIZE, history=6, seed=0, success_ratio=0.7569)
    binner = command_binner()
    where = f"{torch.get_num_threads()} threads" if dev.type == "cpu" else torch.cuda.get_device_name(dev)
    t = Table(f"VLA training throughput (CPU preset models, {where})",
              ["model", "objective", "amp", "batch", "samples/s", "ms/step", "vs rt1"])
    fns, meta = {}, {}
    for name in MODELS:
        for amp in amps:
            cfg, model = _build(name, source)
            model.to(dev).train()
            target = copy.deepcopy(model).eval().requires_grad_(False) if cfg.objective == "q" else None
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
            table = model.frontend.prepare_instructions(source.instructions)
            table = table.to(dev) if torch.is_tensor(table) else table
            batch = {k: v.to(dev) for k, v in source.sample(cfg.batch_size).items()}

            def one(model=model, target=target, batch=batch, cfg=cfg, opt=opt, table=table, amp=amp):
                frames = random_shift(images_to_float(batch["frames"]), cfg.shift_pad)
                with autocast(dev, amp):
                    terms = losses(model, target, batch, frames, table[batch["instruction"]], binner, cfg)
                opt.zero_grad(set_to_none=True)
                terms["loss"].backward()
                opt.step()
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)

            key = f"{name}/{amp}"
            fns[key], meta[key] = one, (name, cfg.objective, amp, cfg.batch_size)
    med = interleaved_medians(fns, steps, warmup=1 if dev.type == "cpu" else 3)   # CUDA: lazy init, autotune
    for key, dt in med.items():
        name, objective, amp, b = meta[key]
        t.add(name, objective, amp, b, b / dt, dt * 1e3, med[f"rt1/{amp}"] / dt)
    return t


def sampling_table(quick: bool) -> Table:
    import shutil
    import tempfile
    import time
    from pathlib import Path

    from quadforge.data.compaction import compact
    from quadforge.data.store import TrajectoryStore
    from quadforge.tools.bench.store_images import _stage
    from quadforge.training.vla_data import open_image_source
    episodes, length, rounds, per_round, batch = (12, 1000, 3, 2, 32) if quick else (60, 1000, 5, 4, 32)
    tmp = Path(tempfile.mkdtemp(prefix="qf_bench_vla_"))
    try:
        root = tmp / "s"
        _, frames, _, _ = _stage(root, episodes, length)
        compact(root)
        cam = "images/front_rgb"
        chunk = TrajectoryStore.open(root).array(cam).chunks[0]
        n_chunks = -(-frames // chunk)
        cache = max(2, n_chunks // 6)
        t = Table(f"VLA image-window sampling from the store (B={batch}, 6+1 frames of 64², {episodes} episodes = "
                  f"{frames} frames in {n_chunks} chunks of {chunk}; cache {cache} chunks; no prefetch)",
                  ["sampling", "windows per wall s", "windows per CPU s", "chunk misses per batch", "vs uniform"])
        feeds, caches, spent = {}, {}, {}
        for mode in ("uniform", "stream"):
            src = open_image_source(root, 6, split="train", success_ratio=0.7569, cache_chunks=cache)
            feeds[mode], caches[mode] = src.batches(batch, 0, mode), src.sampler.caches[cam]
            next(feeds[mode])                                 # first batch: the resident set's first decodes
            spent[mode] = [0.0, 0.0, 0, caches[mode].misses]
        for _ in range(rounds):                               # round-robin: load drift hits both alike
            for mode, feed in feeds.items():
                w0, c0 = time.perf_counter(), time.process_time()
                for _ in range(per_round):
                    next(feed)
                spent[mode][0] += time.perf_counter() - w0
                spent[mode][1] += time.process_time() - c0
                spent[mode][2] += per_round
        rate = {m: spent[m][2] * batch / spent[m][0] for m in feeds}
        for mode in feeds:
            wall, cpu, n, first = spent[mode]
            t.add(mode, rate[mode], n * batch / max(cpu, 1e-9), (caches[mode].misses - first) / n,
                  rate[mode] / rate["uniform"])
        for feed in feeds.values():
            feed.close()
        return t
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(quick: bool = False, json_path: str | None = None, threads: int = 1) -> int:
    # one thread by default, like the other model benchmarks: on this shared 2-core machine two threads
    # per process oversubscribe the cores and turn every op into a wait (measured: ~10x slower acting
    # at load 10); pass threads=2 on a quiet machine to see the preset's intended training speed
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        lat = latency_table((1, 64), repeats=5 if quick else 20)
        thr = throughput_table(steps=3 if quick else 10)
        smp = sampling_table(quick)
        report("vla", [lat, thr, smp], json_path, {"quick": quick, "image_size": IMAGE_SIZE, "threads": threads})
    finally:
        torch.set_num_threads(before)
    return 0
