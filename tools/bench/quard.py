"""`quadforge bench quard`: the QUARD tasks - the privileged expert's success per family, the speed and
gait it walks at per instruction word, and the camera's frames per second.

1. Expert: ``HierarchicalPolicy(QuardExpert, GaitController)`` on ``QuardEnv(quard:<family>)``, training
   colours, flat ground, images off (the expert reads privileged terms), ``episodes`` per family on a
   seed never used while the expert was written (``EXPERT_SEED``); success, each failure reason, time
   to success, path length. Target (issue 14): >= 95 % per family.
2. Speed words: mean ground speed (path length / time to success, successful episodes) per speed word
   and gait word; gaits: the measured phase offsets of the feet - each foot's touchdown times against
   the front-right foot's, as a fraction of the cycle - against walk-these-ways' (phase, offset, bound).
3. Camera: frames per second on one core (the render thread) at 64^2, 96^2, 128^2, RGB and RGB-D
   (depth from the GL depth buffer), MuJoCo's offscreen renderer with shadows, reflections and
   multisampling off; and env steps per second with images at 5 Hz against without images.
"""
from __future__ import annotations

import collections
import os
import time

import numpy as np
import torch

from quadforge.tools.bench.common import Table, report

EXPERT_SEED = 1000
RESOLUTIONS = (64, 96, 128)


def _expert_run(family: str, episodes: int, num_envs: int, seed: int, record: bool = False):
    from quadforge.collection.rollout import Rollout, RolloutConfig
    from quadforge.envs.quard.env import QuardConfig, QuardEnv
    from quadforge.experts.quard_expert import make_quard_expert

    env = QuardEnv(QuardConfig.make(f"quard:{family}", num_envs=num_envs, seed=seed, images=False))
    try:
        rollout = Rollout(env, make_quard_expert(env), RolloutConfig(record=record))
        t0 = time.perf_counter()
        eps = list(rollout.episodes(max_episodes=episodes))
        return eps, time.perf_counter() - t0
    finally:
        env.close()


def _phase_offsets(contacts: np.ndarray, frequency: float, dt: float) -> np.ndarray:
    """(4,) mean touchdown phase of each foot (LEGS order) relative to FR, in [0, 1)."""
    td = [np.flatnonzero((contacts[1:, j] > 0.5) & (contacts[:-1, j] < 0.5)) + 1 for j in range(4)]
    if any(len(t) < 3 for t in td):
        return np.full(4, np.nan)
    out = np.zeros(4)
    for j in range(4):
        diffs = []
        for t in td[0][1:-1]:   # for every FR touchdown, the nearest touchdown of foot j
            k = td[j][np.argmin(np.abs(td[j] - t))]
            diffs.append(((k - t) * dt * frequency) % 1.0)
        ang = 2 * np.pi * np.asarray(diffs)     # circular mean: 0.98 and 0.02 average to 0
        out[j] = (np.arctan2(np.sin(ang).mean(), np.cos(ang).mean()) / (2 * np.pi)) % 1.0
    return out


def _expected_offsets(gait: str) -> np.ndarray:
    """walk-these-ways' foot phases (FR = t+o, FL = t+p+o+b, RR = t+p, RL = t+b) relative to FR."""
    from quadforge.experts.gait import GAITS
    p, o, b = GAITS[gait]
    return np.array([0.0, p + b, p - o, b - o]) % 1.0


def _camera_rows(table: Table, quick: bool) -> None:
    from quadforge.envs.quard.camera import CameraConfig
    from quadforge.envs.quard.env import QuardConfig, QuardEnv

    frames = 40 if quick else 150
    for res in RESOLUTIONS:
        for depth in (False, True):
            cfg = QuardConfig.make("quard:all", num_envs=4, seed=0,
                                   camera=CameraConfig(width=res, height=res, depth=depth))
            env = QuardEnv(cfg)
            try:
                ids = np.arange(env.num_envs)
                env.render(ids)   # warm-up (context, textures)
                t0 = time.perf_counter()
                n = 0
                while n < frames:
                    env.render(ids)
                    n += len(ids)
                dt = time.perf_counter() - t0
                table.add(f"{res}x{res}", "RGB-D" if depth else "RGB", n, round(1e3 * dt / n, 2), round(n / dt, 1))
            finally:
                env.close()


def _step_rows(table: Table, quick: bool) -> None:
    from quadforge.envs.quard.env import QuardConfig, QuardEnv
    from quadforge.experts.quard_expert import make_quard_expert

    steps = 100 if quick else 300
    for images in (False, True):
        env = QuardEnv(QuardConfig.make("quard:all", num_envs=16, seed=0, images=images))
        try:
            policy = make_quard_expert(env)
            policy.reset(torch.arange(env.num_envs))
            for _ in range(10):
                env.step(policy.act(env.terms))
            t0 = time.perf_counter()
            for _ in range(steps):
                env.step(policy.act(env.terms))
            dt = time.perf_counter() - t0
            table.add("images 64x64 RGB at 5 Hz" if images else "no images", env.num_envs, steps,
                      round(steps * env.num_envs / dt, 1))
        finally:
            env.close()


def main(quick: bool = False, json_path: str | None = None, families: tuple[str, ...] | None = None) -> int:
    os.environ.setdefault("LP_NUM_THREADS", "1")   # llvmpipe: one render thread per worker
    from quadforge.envs.quard.instructions import FAMILIES, GAIT_OF_WORD, GAIT_WORDS, SPEEDS
    from quadforge.envs.quard.rules import OUTCOMES
    from quadforge.experts.quard_expert import SPEED_BANDS

    families = tuple(families or FAMILIES)
    episodes, num_envs = (24, 12) if quick else (200, 40)
    title = f"QUARD expert, training colours, flat, seed {EXPERT_SEED}" + (" (--quick)" if quick else "")
    expert = Table(title, ["family", "episodes", "success", "target >= 0.95"] + list(OUTCOMES[2:])
                   + ["mean time to success s", "mean path m", "wall s"])
    speed_sum: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    t_start = time.perf_counter()
    for family in families:
        eps, wall = _expert_run(family, episodes, num_envs, EXPERT_SEED)
        outcomes = collections.Counter(e.info["quard_outcome"] for e in eps)
        ok = [e for e in eps if e.info["quard_outcome"] == "success"]
        rate = len(ok) / len(eps)
        expert.add(family, len(eps), round(rate, 4), rate >= 0.95, *[outcomes.get(o, 0) for o in OUTCOMES[2:]],
                   round(float(np.mean([e.info["time_to_success"] for e in ok])), 2) if ok else None,
                   round(float(np.mean([e.info["path_length"] for e in ok])), 2) if ok else None, round(wall, 1))
        if family != "distinguish":    # distinguish turns on the spot: no walking speed
            for e in ok:
                p = e.info["task_params"]
                speed_sum[(p["speed"], p["gait"])].append(e.info["path_length"] / max(e.info["time_to_success"], 1e-6))
        print(f"[bench quard] {family}: {rate:.3f} of {len(eps)} ({wall:.0f} s)", flush=True)

    speeds = Table("mean ground speed m/s per speed word x gait word (successful walking episodes)",
                   ["speed word", "band m/s"] + list(GAIT_WORDS) + ["all gaits"])
    for s in SPEEDS:
        cells = [round(float(np.mean(speed_sum[(s, g)])), 3) if speed_sum[(s, g)] else None for g in GAIT_WORDS]
        pooled = [v for g in GAIT_WORDS for v in speed_sum[(s, g)]]
        speeds.add(s, SPEED_BANDS[s], *cells, round(float(np.mean(pooled)), 3) if pooled else None)

    # gait phase offsets, measured from the foot contacts of recorded go_to episodes
    gaits = Table("gait phase offsets of the feet relative to FR (FR, FL, RR, RL), measured vs commanded",
                  ["gait word", "episodes", "measured", "commanded", "max abs error"])
    eps, _ = _expert_run("go_to", 16 if quick else 48, 16, EXPERT_SEED + 1, record=True)
    by_gait = collections.defaultdict(list)
    from quadforge.experts.quard_expert import GAIT_FREQUENCY
    for e in eps:
        contacts = e.features["foot_contacts"]
        if len(contacts) > 100:
            by_gait[e.info["task_params"]["gait"]].append(_phase_offsets(contacts[50:], GAIT_FREQUENCY, 0.02))
    for word in GAIT_WORDS:
        rows = [r for r in by_gait[word] if np.isfinite(r).all()]
        if not rows:
            gaits.add(word, 0, None, None, None)
            continue
        ang = 2 * np.pi * np.asarray(rows)
        mean = (np.arctan2(np.sin(ang).mean(0), np.cos(ang).mean(0)) / (2 * np.pi)) % 1.0
        want = _expected_offsets(GAIT_OF_WORD[word])
        err = np.abs((mean - want + 0.5) % 1.0 - 0.5).max()
        gaits.add(word, len(rows), " ".join(f"{v:.2f}" for v in mean), " ".join(f"{v:.2f}" for v in want),
                  round(float(err), 3))

    camera = Table("camera frames per second on one core (render thread; shadows, reflections, MSAA off)",
                   ["resolution", "channels", "frames", "ms per frame", "frames/s"])
    _camera_rows(camera, quick)
    steps = Table("QuardEnv + expert steps per second, 16 envs, quard:all",
                  ["images", "envs", "steps", "env steps/s"])
    _step_rows(steps, quick)
    report("quard", [expert, speeds, gaits, camera, steps], json_path,
           extra={"wall_s": round(time.perf_counter() - t_start, 1), "expert_seed": EXPERT_SEED,
                  "load_avg": os.getloadavg()})
    return 0


def frames_png(path: str, per_family: int = 4, size: int = 64, seed: int = 0, steps: int = 60) -> str:
    """A PNG of camera frames per family at ``size``^2 (the default resolution): for each family,
    ``per_family`` episodes, each at its spawn and after ``steps`` control steps of the expert, with
    the instruction under it. Pixels are shown as rendered (nearest-neighbour upscaling)."""
    import textwrap

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from quadforge.envs.quard.camera import CameraConfig
    from quadforge.envs.quard.env import QuardConfig, QuardEnv
    from quadforge.envs.quard.instructions import FAMILIES
    from quadforge.experts.quard_expert import make_quard_expert

    fig, axes = plt.subplots(len(FAMILIES), 2 * per_family, figsize=(2.0 * 2 * per_family, 2.6 * len(FAMILIES)))
    for r, family in enumerate(FAMILIES):
        env = QuardEnv(QuardConfig.make(f"quard:{family}", num_envs=per_family, seed=seed,
                                        camera=CameraConfig(width=size, height=size)))
        try:
            first = env.images.copy()
            texts = [p["instruction"] for p in env.scenes.params]
            policy = make_quard_expert(env)
            policy.reset(torch.arange(env.num_envs))
            later = first.copy()
            taken = np.zeros(env.num_envs, dtype=bool)
            for _ in range(steps):
                _, _, dones, _ = env.step(policy.act(env.terms))
                done = dones.numpy()
                later[done & ~taken] = first[done & ~taken]   # finished early: keep its spawn frame
                taken |= done
            later[~taken] = env.images[~taken]
            for c in range(per_family):
                for k, (img, when) in enumerate(((first[c], "spawn"), (later[c], f"+{steps * env.dt:.1f} s"))):
                    ax = axes[r, 2 * c + k]
                    ax.imshow(img, interpolation="nearest")
                    ax.set_xticks([]), ax.set_yticks([])
                    ax.set_title(when, fontsize=7)
                    if k == 0:
                        ax.set_xlabel("\n".join(textwrap.wrap(texts[c], 34)), fontsize=6.5, loc="left")
        finally:
            env.close()
    fig.suptitle(f"QUARD front camera, {size}x{size} RGB (as rendered), one row per family: "
                 + ", ".join(FAMILIES), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
