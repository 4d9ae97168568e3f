"""Synthetic episodes in the store's feature catalogue, for tests and the store benchmark.

Values are random but shaped like the real thing (unit gravity vector, bounded joint angles, a
`terminated` flag on failed episodes' last step), so schema, stats and samplers see realistic input.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from quadforge.data.schema import CATALOGUE

# what a proprioceptive collection stores: the deployable terms + per-step signals
PROPRIO_FEATURES = ("base_lin_vel", "base_ang_vel", "projected_gravity", "commands", "dof_pos", "dof_vel",
                    "last_action", "last_last_action", "foot_contacts", "gait_clock", "actions",
                    "joint_targets", "rewards", "terminated", "time_outs")


def _smooth(rng: np.random.Generator, shape: tuple[int, ...], dt: float = 0.02) -> np.ndarray:
    """Per entry a 0.5-3 Hz sinusoid of random amplitude and phase plus 1% noise: a 50 Hz sensor-like
    signal, so compression sees realistic (not white-noise) data."""
    length, rest = shape[0], shape[1:]
    t = np.arange(length)[:, None] * dt
    width = int(np.prod(rest, dtype=np.int64))
    freq, phase, amp = rng.uniform(0.5, 3.0, width), rng.uniform(0, 2 * np.pi, width), rng.uniform(0.1, 2.0, width)
    x = amp * np.sin(2 * np.pi * freq * t + phase) + 0.01 * rng.standard_normal((length, width))
    return x.reshape(shape)


def synthetic_episode(rng: np.random.Generator, length: int, success: bool,
                      features: Iterable[str] = PROPRIO_FEATURES) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name in features:
        spec = CATALOGUE[name]
        shape = (length,) + spec.shape
        if spec.dtype == "bool":
            out[name] = np.zeros(shape, dtype=bool)
        else:
            out[name] = _smooth(rng, shape).astype(spec.dtype)
    if "projected_gravity" in out:
        g = out["projected_gravity"] * 0.05 + np.array([0.0, 0.0, -1.0], dtype=np.float32)
        out["projected_gravity"] = (g / np.linalg.norm(g, axis=1, keepdims=True)).astype(np.float32)
    if "terminated" in out and not success:
        out["terminated"][-1] = True
    if "time_outs" in out and success:
        out["time_outs"][-1] = True
    return out


def synthetic_info(i: int, success: bool, terrain_types: tuple[str, ...] = ("flat", "stairs_up", "gaps")
                   ) -> dict[str, Any]:
    return {"success": success, "failure_reason": "none" if success else "fall",
            "terrain_type": terrain_types[i % len(terrain_types)], "terrain_level": i % 10,
            "task": "locomotion", "gait": "trot", "policy_id": "gait:trot", "seed": i,
            "robot": "go1", "control_dt": 0.02, "label": {"distance_ratio": 0.9 if success else 0.2}}


# --- image episodes (QUARD-like): tests and the image benchmark ------------------------------------
COLOURS = {"blue": (40, 60, 200), "green": (40, 170, 60), "red": (200, 40, 40), "yellow": (220, 200, 40)}


def synthetic_frames(rng: np.random.Generator, frames: int, size: int = 64, depth: bool = False
                     ) -> tuple[np.ndarray, np.ndarray | None]:
    """``frames`` camera frames shaped like a rendered QUARD scene (shadows and anti-aliasing off): a sky
    shaded by rows, MuJoCo's checker ground in perspective that slides as the robot walks toward two
    coloured boxes (which grow), and the horizon bobbing a pixel or two with the gait. Smooth
    rendered-looking pixels with edges, neither white noise nor a still image; a real render has more
    texture, so bytes per frame measured on these are indicative, not the QUARD figure.
    RGB (F, size, size, 3) uint8; depth (F, size, size) metres."""
    rows = np.arange(size)[:, None]
    cols = np.arange(size)[None, :]
    light = rng.uniform(0.9, 1.1)
    palette = list(COLOURS.values())
    c1, c2 = (np.asarray(palette[i], np.float32) for i in rng.choice(len(palette), 2, replace=False))
    x1, x2 = rng.uniform(0.15, 0.35), rng.uniform(0.65, 0.85)
    bob_phase = rng.uniform(0, 2 * np.pi)
    rgb = np.empty((frames, size, size, 3), np.uint8)
    dep = np.empty((frames, size, size), np.float32) if depth else None
    for f in range(frames):
        dist = 3.0 * (1 - f / max(frames, 1)) + 0.5                      # metres to the boxes
        travel = 3.0 * f / max(frames, 1)                                # metres walked
        horizon = size // 2 + int(round(1.5 * np.sin(bob_phase + 2.1 * f)))
        below = rows >= horizon
        shade = (0.75 + 0.5 * rows / size).astype(np.float32)           # (size, 1)
        ground_m = 0.3 * size / np.maximum(rows - horizon + 1, 1)        # metres to the ground at each row
        checker = (np.floor(2 * (ground_m + travel)) + np.floor((cols - size / 2) / size * ground_m * 4)) % 2
        img = np.where(below[..., None],
                       np.array([110, 100, 90], np.float32) * (shade * (0.85 + 0.3 * checker))[..., None],
                       np.array([150, 190, 230], np.float32) * (1.6 - shade)[..., None]) * light
        d = np.where(below, ground_m, 20.0).astype(np.float32) * np.ones((1, size), np.float32)
        half = max(1, int(size * 0.08 / dist * 3))
        for x, c in ((x1, c1), (x2, c2)):
            ys = slice(max(horizon - half, 0), horizon + half)
            xs = slice(max(int(x * size) - half, 0), int(x * size) + half)
            img[ys, xs] = c * shade[ys][..., None] * light
            d[ys, xs] = dist
        rgb[f] = np.clip(img, 0, 255).astype(np.uint8)
        if dep is not None:
            dep[f] = d
    return rgb, dep


def synthetic_task_params(i: int, seed: int = 0, families: Sequence[str] = ("go_to",)) -> dict[str, Any]:
    """Task parameters shaped like a QUARD episode's; episode ``i`` is labelled ``families[i % len]`` (the
    data layer knows no QUARD families: a caller that wants them all passes
    ``envs.quard.families.family_names()``). The instruction is always a go_to one."""
    rng = np.random.default_rng([seed, i])
    family = families[i % len(families)]
    colour = str(rng.choice(list(COLOURS)))
    speed, gait = str(rng.choice(["slowly", "normally", "quickly"])), str(rng.choice(["trotting", "pacing"]))
    return {"family": family, "target": "cube", "colour": colour, "slot": int(rng.choice([-1, 1])),
            "speed": speed, "gait": gait, "seed": int(seed * 1000 + i),
            "instruction": f"go to the {colour} cube, {speed} with a {gait} gait"}


def synthetic_image_episode(rng: np.random.Generator, length: int, success: bool, stride: int = 10,
                            size: int = 64, depth: bool = False, instruction_index: int = 0,
                            features: Iterable[str] = PROPRIO_FEATURES + ("hl_commands",),
                            ) -> dict[str, np.ndarray]:
    """A proprioceptive episode plus ``images/front_rgb`` (and ``images/front_depth``) every ``stride``
    steps and the per-step ``instruction`` index, as a QUARD collection records them."""
    out = synthetic_episode(rng, length, success, features)
    frames = -(-length // stride)
    rgb, dep = synthetic_frames(rng, frames, size, depth)
    out["images/front_rgb"] = rgb
    if dep is not None:
        out["images/front_depth"] = dep
    out["instruction"] = np.full(length, instruction_index, dtype=np.int64)
    return out


SYNTHETIC_INSTRUCTIONS = ("go to the red cube, slowly with a trotting gait",
                          "stop the blue ball, quickly with a pacing gait")


def write_synthetic_image_store(root: str | Path, episodes: int = 5, stride: int = 10, size: int = 16,
                                seed: int = 0) -> Path:
    """A small compacted QUARD-like store - proprioception (a one-entry term, ``base_height``, among it),
    ``hl_commands``, two instructions, ``size``²
    RGB frames every ``stride`` steps, every fourth episode a failure - for tests and for trying the
    exports (tools/check_exports_external.py)."""
    from quadforge.data.compaction import compact
    from quadforge.data.writer import StagingWriter
    rng = np.random.default_rng(seed)
    with StagingWriter(root, "cam") as w:
        for i in range(episodes):
            length, success, k = int(rng.integers(15, 40)), i % 4 != 3, i % 2
            feats = synthetic_image_episode(rng, length, success, stride=stride, size=size, instruction_index=k,
                                            features=PROPRIO_FEATURES + ("hl_commands", "base_height"))
            params = synthetic_task_params(i, seed)
            text = SYNTHETIC_INSTRUCTIONS[k]
            w.write_episode(feats, {**synthetic_info(i, success), "task": f"quard:{params['family']}",
                                    "task_params": params, "instruction": text, "instructions": {str(k): text},
                                    "frame_stride": stride})
    compact(root)
    return Path(root)
