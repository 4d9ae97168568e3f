"""`quadforge bench quard_gpu`: the vision-language half on the GPU path - QUARD tasks on MuJoCo Warp with
the batch renderer's camera, and the VLAs' training step on the torch device.

1. QUARD env steps/s: ``QuardEnv(quard:all)`` on the ``mujoco_warp`` backend, 64² RGB frames of every
   world at 5 Hz (``image_every`` 10) through MuJoCo Warp's batch renderer (``envs.backends.warp_camera``),
   zero actions (the robots stand; the step, the task rules and the frames are what is timed, not a
   policy). Steps/s counts control steps x worlds.
2. Camera frames/s: one ``render`` of every world (refit the BVH, ray-trace, copy the frames to the
   host arrays the store reads), timed alone on the same env.
3. VLA training samples/s: ``bench vla``'s optimizer step (DrQ shift, forward, backward, AdamW) of every
   VLA on the torch device, fp32 and bf16 autocast.

On a GPU: Warp and torch on ``cuda:0``, 1024 and 4096 worlds (quick: 1024). Without one: Warp's CPU
device and 4 worlds, to show the path runs, not to be fast. Issue 23 asks for these numbers per GPU; no
target is set for them.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from quadforge.tools.bench.common import Table, device_sync, median_time, rate_per_second, report


def _quard_env(num_envs: int, device: str):
    """QUARD quard:all on mujoco_warp with images on, through the one builder."""
    from quadforge.envs.backends.base import WarpConfig
    from quadforge.envs.builder import make_env

    return make_env(task="quard:all", terrain=None, num_envs=num_envs, seed=0, num_threads=os.cpu_count(),
                    backend="mujoco_warp", warp=WarpConfig(device=device), task_options={"images": True})


def env_rows(table: Table, counts: list[int], device: str, steps: int, renders: int) -> None:
    for n in counts:
        t0 = time.perf_counter()
        env = _quard_env(n, device)
        build_s = time.perf_counter() - t0
        try:
            zeros = torch.zeros(n, 12, device=env.device)
            for _ in range(3):                    # warm-up: kernel loads, the CUDA graph's capture
                env.step(zeros)
            rate = rate_per_second(lambda: env.step(zeros), n, steps, rounds=2, sync=device_sync)
            rgb = np.zeros((n, env.camera.height, env.camera.width, 3), np.uint8)
            ids = np.arange(n)
            # a render ends copying its frames to the host, which waits for the device: no sync needed
            frame_s = median_time(lambda: env.camera.render(ids, rgb), renders, warmup=1)
            table.add(n, str(env.backend.device), round(build_s, 1), rate, n / frame_s,
                      frame_s * 1e3, int((rgb.reshape(n, -1).max(1) > 0).sum()))
            print(f"  quard:all {n} worlds: {rate:.0f} env steps/s, {n / frame_s:.0f} frames/s", flush=True)
        finally:
            env.close()


def main(quick: bool = False, json_path: str | None = None) -> int:
    from quadforge.envs.backends.mujoco_warp import import_warp
    from quadforge.tools.bench.vla import throughput_table

    import_warp()   # without MuJoCo Warp: the one-line ImportError saying how to install it
    on_gpu = torch.cuda.is_available()
    device = "cuda:0" if on_gpu else "cpu"
    counts = ([1024] if quick else [1024, 4096]) if on_gpu else [4]
    steps = 20 if on_gpu else 5
    env_table = Table(f"QUARD quard:all on mujoco_warp ({device}), 64² RGB at 5 Hz through the batch renderer, "
                      "zero actions", ["worlds", "device", "build s", "env steps/s", "frames/s (render alone)",
                                       "ms per render", "frames with pixels"])
    env_rows(env_table, counts, device, steps, renders=5 if quick else 10)
    amps = ("off", "bf16") if on_gpu else ("off",)
    vla_table = throughput_table(steps=5 if quick else 20, device=device, amps=amps)
    extra = {"gpu": on_gpu, "gpu_name": torch.cuda.get_device_name(0) if on_gpu else None, "quick": quick}
    report("quard_gpu", [env_table, vla_table], json_path, extra)
    return 0
