"""Synthetic episodes in the store's feature catalogue, for tests and the store benchmark.

Values are random but shaped like the real thing (unit gravity vector, bounded joint angles, a
`terminated` flag on failed episodes' last step), so schema, stats and samplers see realistic input.
"""
from __future__ import annotations

from typing import Any, Iterable

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
