"""`quadforge bench quard`: the QUARD tasks - the privileged expert's success per family, the speed and
gait it walks at per instruction word, and the camera's frames per second.

1. Expert: ``HierarchicalPolicy(QuardExpert, GaitController)`` on ``QuardEnv(quard:<family>)``, training
   colours, flat ground, images off (the expert reads privileged terms), ``episodes`` per family on a
   seed never used while the expert was written (``EXPERT_SEED``); success, each failure reason, time
   to success, path length. Target (issue 14): >= 95 % per family.
2. Speed words: mean ground speed (path length / time to success, successful episodes) per speed word
   and gait word; gaits: the measured phase offsets of the feet - each foot's touchdown times against
   the front-right foot's, as a fraction of the cycle - against walk-these-ways' (phase, offset, bound).
   The speed table also has the mean forward speed (base x velocity after the 0.3 s settle) of
   recorded go_to episodes, per speed word and gait word, and the stepping frequency the expert chose.
3. Camera: frames per second on one core (the render thread) at 64^2, 96^2, 128^2, RGB and RGB-D
   (depth from the GL depth buffer), MuJoCo's offscreen renderer with shadows, reflections and
   multisampling off; and env steps per second with images at 5 Hz against without images.
4. Collection: the whole ``collect`` path (``collection.collect.run_local``: env and policy build,
   rollout, background staging writes, compaction) of the privileged expert on quard:all, one
   collector, 8 envs, into a fresh store - with the camera (64^2 RGB at 5 Hz) and without it
   (``CollectConfig.images=False``), the same seed and so the same episodes, the two alternated
   ``repeats`` times in this run. Episodes per minute, their ratio, and the store's real bytes on
   disk per recorded frame (the image group) and per control step (everything).
5. Terrain: the expert's success per family on non-flat curriculum terrain (``TERRAIN_SECTION``:
   rough_slope, slope_up and slope_down at level 3 of 10, every env on that level), images off.
"""
from __future__ import annotations

import collections
import os
import time

import numpy as np
import torch

from quadforge.tools.bench.common import Table, report

EXPERT_SEED = 1000
COLLECT_SEED = 2000
TERRAIN_SEED = 3000
RESOLUTIONS = (64, 96, 128)
# terrain types under the tasks and the curriculum level (of TERRAIN_LEVELS) every env is put on:
# level 3 of 10 is difficulty 0.33 - slopes of 0.13 rise/run (7.5 deg), rough +-5 cm on top
TERRAIN_SECTION = ("rough_slope", "slope_up", "slope_down")
TERRAIN_LEVEL, TERRAIN_LEVELS = 3, 10
SECTIONS = ("expert", "gaits", "camera", "steps", "collect", "terrain")


def _expert_run(family: str, episodes: int, num_envs: int, seed: int, record: bool = False,
                terrain: str | None = None, level: int = 0):
    """The expert's episodes of quard:<family>; on ``terrain`` (a terrain type) every env on ``level``."""
    from quadforge.collection.rollout import Rollout, RolloutConfig
    from quadforge.envs.terrain import TerrainConfig

    tc = None if terrain is None else TerrainConfig.of_types([terrain], num_levels=TERRAIN_LEVELS, num_cols=1,
                                                           seed=seed)
    env = _quard_env(f"quard:{family}", num_envs, seed, terrain=tc, images=False)
    try:
        if tc is not None:
            env.set_terrain_levels(torch.arange(env.num_envs), level)
        rollout = Rollout(env, _expert(env), RolloutConfig(record=record))
        t0 = time.perf_counter()
        eps = rollout.first_episodes(episodes, reset=tc is None)   # each env's first: not biased to quick ends
        return eps, time.perf_counter() - t0
    finally:
        env.close()


def _quard_env(task: str, num_envs: int, seed: int, terrain=None, **options):
    """A QUARD env through the one builder (``options``: ``QuardConfig`` fields); physics on every core."""
    from quadforge.envs.builder import make_env
    return make_env(task=task, terrain=terrain, num_envs=num_envs, seed=seed, num_threads=None, task_options=options)


def _expert(env):
    """The privileged expert over the gait controller, through the one policy loader."""
    from quadforge.experts.registry import policy_for_env
    return policy_for_env("quard_expert", env)


def _outcome_row(table: Table, label: tuple, eps: list, wall: float) -> float:
    """One row: episodes, success, each failure reason, time and path of the successes, the gait words
    of the failures (which gaits fail says why), wall time."""
    from quadforge.envs.quard.rules import OUTCOMES
    outcomes = collections.Counter(e.info["quard_outcome"] for e in eps)
    ok = [e for e in eps if e.info["quard_outcome"] == "success"]
    failed = collections.Counter(e.info["task_params"]["gait"] for e in eps if e.info["quard_outcome"] != "success")
    rate = len(ok) / max(len(eps), 1)
    table.add(*label, len(eps), round(rate, 4), *[outcomes.get(o, 0) for o in OUTCOMES[2:]],
              round(float(np.mean([e.info["time_to_success"] for e in ok])), 2) if ok else None,
              round(float(np.mean([e.info["path_length"] for e in ok])), 2) if ok else None,
              " ".join(f"{g}:{n}" for g, n in sorted(failed.items())) or "-", round(wall, 1))
    return rate


def _dir_bytes(path) -> int:
    """Real bytes of the files under ``path`` (what the store costs on disk, compressed)."""
    from pathlib import Path
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _collect_rows(table: Table, ratio: Table, quick: bool) -> dict:
    """Whole-collect-path throughput with and without the camera, alternated (module doc, 4)."""
    import shutil
    import tempfile
    from pathlib import Path

    from quadforge.collection.collect import CollectConfig, run_local
    from quadforge.data.store import TrajectoryStore, array_path

    episodes, repeats = (16, 1) if quick else (48, 2)
    rates: dict[bool, list[float]] = {True: [], False: []}
    tmp = Path(tempfile.mkdtemp(prefix="bench_quard_collect_"))
    try:
        for rep in range(repeats):
            for images in (True, False):
                out = tmp / f"r{rep}_{'camera' if images else 'no_camera'}"
                cfg = CollectConfig(out=str(out), episodes=episodes, policy="quard_expert", task="quard:all",
                                    num_envs=8, seed=COLLECT_SEED, images=images, progress=False).validate()
                t0 = time.perf_counter()
                summary = run_local(cfg)
                wall = time.perf_counter() - t0
                store = TrajectoryStore.open(out)
                steps = int(store.num_steps)
                frames = int(store.frame_counts("images/front_rgb").sum()) if images else 0
                image_bytes = _dir_bytes(out / array_path("images/front_rgb")) if images else 0
                total = _dir_bytes(out)
                per_min = 60.0 * summary["in_store"] / wall
                rates[images].append(per_min)
                table.add(rep, "64x64 RGB at 5 Hz" if images else "off", summary["in_store"], steps, frames,
                          round(wall, 1), round(per_min, 1), total,
                          round(image_bytes / frames) if frames else None, round(total / steps))
                shutil.rmtree(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pairs = [w / wo for w, wo in zip(rates[True], rates[False])]
    ratio.add(round(float(np.median(rates[True])), 1), round(float(np.median(rates[False])), 1),
              round(float(np.median(pairs)), 3), " ".join(f"{r:.3f}" for r in pairs))
    return {"episodes_per_min_camera": rates[True], "episodes_per_min_no_camera": rates[False], "ratios": pairs}


def _terrain_rows(table: Table, quick: bool, families: tuple[str, ...]) -> None:
    episodes, num_envs = (8, 8) if quick else (24, 12)
    for terrain in TERRAIN_SECTION:
        for family in families:
            eps, wall = _expert_run(family, episodes, num_envs, TERRAIN_SEED, terrain=terrain, level=TERRAIN_LEVEL)
            rate = _outcome_row(table, (terrain, family), eps, wall)
            print(f"[bench quard] {terrain} level {TERRAIN_LEVEL}: {family} {rate:.3f} of {len(eps)} ({wall:.0f} s)",
                  flush=True)


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

    frames = 40 if quick else 150
    for res in RESOLUTIONS:
        for depth in (False, True):
            env = _quard_env("quard:all", 4, 0, camera=CameraConfig(width=res, height=res, depth=depth))
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
    steps = 100 if quick else 300
    for images in (False, True):
        env = _quard_env("quard:all", 16, 0, images=images)
        try:
            policy = _expert(env)
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


def _outcome_columns() -> list[str]:
    from quadforge.envs.quard.rules import OUTCOMES
    return list(OUTCOMES[2:]) + ["mean time to success s", "mean path m", "failures by gait", "wall s"]


def _expert_table(quick: bool, families: tuple[str, ...], speed_sum: dict[tuple[str, str], list[float]]) -> Table:
    """Section 1: the expert's outcomes per family on flat ground; the ground speed of every successful
    walking episode is added to ``speed_sum[(gait word, speed word)]`` for section 2."""
    from quadforge.envs.quard.families import get_family

    episodes, num_envs = (24, 12) if quick else (200, 40)
    table = Table(f"QUARD expert, training colours, flat, seed {EXPERT_SEED}" + (" (--quick)" if quick else ""),
                  ["family", "episodes", "success"] + _outcome_columns())
    for family in families:
        eps, wall = _expert_run(family, episodes, num_envs, EXPERT_SEED)
        rate = _outcome_row(table, (family,), eps, wall)
        if get_family(family).expert.command is None:    # one that turns on the spot has no walking speed
            for e in eps:
                if e.info["quard_outcome"] == "success":
                    p = e.info["task_params"]
                    speed_sum[(p["gait"], p["speed"])].append(e.info["path_length"] / max(e.info["time_to_success"], 1e-6))
        print(f"[bench quard] {family}: {rate:.3f} of {len(eps)} ({wall:.0f} s)", flush=True)
    return table


def _gait_tables(quick: bool, speed_sum: dict[tuple[str, str], list[float]]) -> list[Table]:
    """Section 2: from recorded go_to episodes, the forward speed after the settle per speed and gait word
    (beside section 1's ground speeds) and the feet's phase offsets per gait word against the commanded."""
    from quadforge.envs.quard.words import GAIT_OF_WORD, GAIT_WORDS, SPEEDS
    from quadforge.experts.hierarchical import HL_COMMAND_NAMES
    from quadforge.experts.quard_expert import GAIT_SPEEDS

    f_col = HL_COMMAND_NAMES.index("gait_frequency")
    eps, _ = _expert_run("go_to", 24 if quick else 96, 16, EXPERT_SEED + 1, record=True)
    by_gait, forward = collections.defaultdict(list), collections.defaultdict(list)
    for e in eps:
        p = e.info["task_params"]
        vx = np.asarray(e.features["base_lin_vel"])[15:, 0]      # after the gait controller's 0.3 s settle
        if len(vx):
            forward[(p["gait"], p["speed"])].append(float(vx.mean()))
        contacts = e.features["foot_contacts"]
        if len(contacts) > 100:
            freq = float(np.median(np.asarray(e.features["hl_commands"])[:, f_col]))
            by_gait[p["gait"]].append(_phase_offsets(contacts[50:], freq, 0.02))
    speeds = Table("speed words per gait word: band and stepping frequency the expert holds, mean ground speed "
                   "(path / time to success of successful walking episodes, flat) and mean forward speed "
                   "after the settle (recorded go_to episodes), m/s",
                   ["gait word", "speed word", "band m/s", "frequency Hz", "episodes", "ground speed",
                    "go_to episodes", "forward speed"])
    for g in GAIT_WORDS:
        for s in SPEEDS:
            band, freq = GAIT_SPEEDS[g][s]
            gs, fw = speed_sum[(g, s)], forward[(g, s)]
            speeds.add(g, s, band, freq, len(gs), round(float(np.mean(gs)), 3) if gs else None,
                       len(fw), round(float(np.mean(fw)), 3) if fw else None)
    gaits = Table("gait phase offsets of the feet relative to FR (FR, FL, RR, RL), measured vs commanded",
                  ["gait word", "episodes", "measured", "commanded", "max abs error"])
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
    return [speeds, gaits]


def main(quick: bool = False, json_path: str | None = None, families: tuple[str, ...] | None = None,
         sections: tuple[str, ...] = SECTIONS) -> int:
    os.environ.setdefault("LP_NUM_THREADS", "1")   # llvmpipe: one render thread per worker
    from quadforge.envs.quard.families import family_names

    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"bench quard: unknown sections {unknown}; allowed: {', '.join(SECTIONS)}")
    families = tuple(families or family_names())
    tables, extra = [], {"load_avg_start": os.getloadavg()}
    t_start = time.perf_counter()
    speed_sum: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    if "expert" in sections:
        tables.append(_expert_table(quick, families, speed_sum))
    if "gaits" in sections:
        tables += _gait_tables(quick, speed_sum)
    if "camera" in sections:
        camera = Table("camera frames per second on one core (render thread; shadows, reflections, MSAA off)",
                       ["resolution", "channels", "frames", "ms per frame", "frames/s"])
        _camera_rows(camera, quick)
        tables.append(camera)
    if "steps" in sections:
        steps = Table("QuardEnv + expert steps per second, 16 envs, quard:all",
                      ["images", "envs", "steps", "env steps/s"])
        _step_rows(steps, quick)
        tables.append(steps)
    if "collect" in sections:
        collect = Table("collect path (run_local), quard:all, privileged expert, 1 collector x 8 envs, 1 physics "
                        f"thread, seed {COLLECT_SEED}: camera on / off alternated",
                        ["repeat", "camera", "episodes", "steps", "frames", "wall s", "episodes/min", "store bytes",
                         "image bytes per frame", "store bytes per step"])
        ratio = Table("collect path: episodes/min with the camera against without (median over repeats)",
                      ["camera on", "camera off", "ratio on/off", "ratio per repeat"])
        extra["collect"] = _collect_rows(collect, ratio, quick)
        tables += [collect, ratio]
    if "terrain" in sections:
        terrain = Table(f"QUARD expert on terrain, level {TERRAIN_LEVEL} of {TERRAIN_LEVELS}, training colours, "
                        f"seed {TERRAIN_SEED}" + (" (--quick)" if quick else ""),
                        ["terrain", "family", "episodes", "success"] + _outcome_columns())
        _terrain_rows(terrain, quick, families)
        tables.append(terrain)
    report("quard", tables, json_path,
           extra={"wall_s": round(time.perf_counter() - t_start, 1), "expert_seed": EXPERT_SEED,
                  "load_avg": os.getloadavg(), **extra})
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
    from quadforge.envs.quard.families import family_names

    families = family_names()
    fig, axes = plt.subplots(len(families), 2 * per_family, figsize=(2.0 * 2 * per_family, 2.6 * len(families)))
    for r, family in enumerate(families):
        env = _quard_env(f"quard:{family}", per_family, seed, camera=CameraConfig(width=size, height=size))
        try:
            first = env.images.copy()
            texts = [p["instruction"] for p in env.scenes.params]
            policy = _expert(env)
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
                 + ", ".join(families), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
