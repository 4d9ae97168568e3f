"""The store's feature catalogue and schema: what each per-step feature is (dtype, shape, names, units).

A store's schema is fixed by its first compacted episode and every later episode must agree with it.
Features are the raw observation terms of ``quadforge.layout.TERM_DIMS`` plus the per-step signals below;
camera images (when present) are features named ``images/<camera>`` (uint8, (H, W, C)).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from quadforge.layout import COMMAND_NAMES, HEIGHT_SCAN_X, HEIGHT_SCAN_Y, JOINT_NAMES, LEGS, TERM_DIMS

FORMAT_VERSION = 1
IMAGE_PREFIX = "images/"

_XYZ = ("x", "y", "z")
_TERM_INFO: dict[str, tuple[tuple[str, ...], str]] = {
    "base_lin_vel": (_XYZ, "m/s"),
    "base_ang_vel": (_XYZ, "rad/s"),
    "projected_gravity": (_XYZ, "1"),
    "commands": (COMMAND_NAMES, "mixed: m/s, rad/s, m, Hz, rad (walk-these-ways command space)"),
    "dof_pos": (JOINT_NAMES, "rad (relative to the default pose)"),
    "dof_vel": (JOINT_NAMES, "rad/s"),
    "dof_pos_sin": (JOINT_NAMES, "1"),
    "dof_pos_cos": (JOINT_NAMES, "1"),
    "last_action": (JOINT_NAMES, "normalised joint action"),
    "last_last_action": (JOINT_NAMES, "normalised joint action"),
    "foot_contacts": (LEGS, "1"),
    "gait_clock": (LEGS, "1"),
    "base_height": (("z",), "m"),
    "height_scan": (tuple(f"{x:+.1f},{y:+.1f}" for x in HEIGHT_SCAN_X for y in HEIGHT_SCAN_Y), "m"),
    "friction": (("mu",), "1"),
    "added_mass": (("kg",), "kg"),
}


@dataclass(frozen=True)
class FeatureSpec:
    dtype: str
    shape: tuple[int, ...]          # per step
    names: tuple[str, ...] = ()     # names of the last axis' entries, if meaningful
    units: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"], d["names"] = list(self.shape), list(self.names)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FeatureSpec":
        return cls(dtype=str(d["dtype"]), shape=tuple(int(s) for s in d["shape"]),
                   names=tuple(d.get("names", ())), units=str(d.get("units", "")))


def _catalogue() -> dict[str, FeatureSpec]:
    cat = {name: FeatureSpec("float32", (dim,), *_TERM_INFO[name]) for name, dim in TERM_DIMS.items()}
    cat["actions"] = FeatureSpec("float32", (12,), JOINT_NAMES, "policy output (normalised joint action)")
    cat["applied_actions"] = FeatureSpec("float32", (12,), JOINT_NAMES,
                                         "action applied when a relabelling expert's label is stored as actions (DAgger)")
    cat["joint_targets"] = FeatureSpec("float32", (12,), JOINT_NAMES, "rad (absolute PD target)")
    cat["hl_commands"] = FeatureSpec("float32", (12,), (), "high-level command (GeRM Eq. 9)")
    cat["rewards"] = FeatureSpec("float32", (), (), "task reward per control step")
    cat["terminated"] = FeatureSpec("bool", (), (), "episode ended by a termination at this step")
    cat["time_outs"] = FeatureSpec("bool", (), (), "episode ended by the time limit at this step")
    return cat


CATALOGUE: dict[str, FeatureSpec] = _catalogue()
ALLOWED_FEATURES = tuple(CATALOGUE) + (IMAGE_PREFIX + "<camera>",)


def spec_for(name: str, value: np.ndarray, where: str) -> FeatureSpec:
    """The spec a feature must have; raises naming the feature and allowed values if it cannot."""
    if name.startswith(IMAGE_PREFIX):
        if value.ndim != 4 or value.shape[-1] not in (1, 3, 4):
            raise ValueError(f"{where}: image feature {name!r} must be (T, H, W, C) with C in 1/3/4, "
                             f"got {value.shape}")
        return FeatureSpec("uint8", tuple(value.shape[1:]), (), "image pixels")
    if name not in CATALOGUE:
        raise ValueError(f"{where}: unknown feature {name!r}; allowed: {list(ALLOWED_FEATURES)}")
    spec = CATALOGUE[name]
    if tuple(value.shape[1:]) != spec.shape:
        raise ValueError(f"{where}: feature {name!r} has per-step shape {tuple(value.shape[1:])}, "
                         f"expected {spec.shape}")
    return spec


def check_episode(features: Mapping[str, np.ndarray], where: str) -> int:
    """Validate one episode's feature dict; returns its length."""
    if not features:
        raise ValueError(f"{where}: episode has no features")
    lengths = {name: len(np.asarray(v)) if np.ndim(v) else -1 for name, v in features.items()}
    length = next(iter(lengths.values()))
    if length < 1 or any(n != length for n in lengths.values()):
        raise ValueError(f"{where}: every feature needs the same number of steps (>= 1); got {lengths}")
    for name, value in features.items():
        spec_for(name, np.asarray(value), where)
    return length


@dataclass
class StoreSchema:
    features: dict[str, FeatureSpec]
    robot: str
    control_dt: float
    format_version: int = FORMAT_VERSION

    @property
    def control_rate_hz(self) -> float:
        return 1.0 / self.control_dt if self.control_dt > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": self.format_version, "robot": self.robot, "control_dt": self.control_dt,
                "control_rate_hz": self.control_rate_hz,
                "features": {k: v.to_dict() for k, v in sorted(self.features.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StoreSchema":
        return cls(features={k: FeatureSpec.from_dict(v) for k, v in d["features"].items()},
                   robot=str(d.get("robot", "")), control_dt=float(d.get("control_dt", 0.0)),
                   format_version=int(d.get("format_version", FORMAT_VERSION)))

    @classmethod
    def from_episode(cls, features: Mapping[str, np.ndarray], info: Mapping[str, Any],
                     where: str) -> "StoreSchema":
        specs = {name: spec_for(name, np.asarray(v), where) for name, v in features.items()}
        return cls(specs, robot=str(info.get("robot", "")), control_dt=float(info.get("control_dt", 0.02)))

    def check(self, features: Mapping[str, np.ndarray], where: str) -> None:
        """Raise naming ``where``, the feature, expected vs found on any disagreement."""
        missing = sorted(set(self.features) - set(features))
        extra = sorted(set(features) - set(self.features))
        if missing or extra:
            raise ValueError(f"{where}: schema mismatch: features missing {missing}, unexpected {extra} "
                             f"(store has {sorted(self.features)})")
        for name, spec in self.features.items():
            v = features[name]
            found_shape = tuple(v.shape[1:])
            if found_shape != spec.shape:
                raise ValueError(f"{where}: schema mismatch in feature {name!r}: expected per-step shape "
                                 f"{spec.shape}, found {found_shape}")
            if np.dtype(v.dtype) != np.dtype(spec.dtype):
                raise ValueError(f"{where}: schema mismatch in feature {name!r}: expected dtype "
                                 f"{spec.dtype}, found {v.dtype}")
