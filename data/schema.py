"""The store's feature catalogue and schema: what each per-step feature is (dtype, shape, names, units).

A store's schema is fixed by its first compacted episode and every later episode must agree with it.
Features are the raw observation terms of ``quadforge.layout.TERM_DIMS`` plus the per-step signals below;
task terms (``task_*``, privileged object poses etc., float32 of any per-step shape), the per-step
``instruction`` index, and camera images ``images/<camera>`` (uint8 (H, W, C) or float32 depth (H, W),
recorded every ``stride``-th step: see ``data.images``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from quadforge.data.images import IMAGE_PREFIX, frame_stride_of, image_dtype, is_image, num_frames
from quadforge.terms import (COMMAND_NAMES, HEIGHT_SCAN_X, HEIGHT_SCAN_Y, JOINT_NAMES, LEGS, TASK_TERM_PREFIX,
                             TERM_DIMS)

# 2: the episode table in append-only segments (data/episode_table.py); 1: in one file. Both read; a
# compaction onto a format-1 store writes format 2 (its table file becomes the first segment).
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
TASK_PREFIX = TASK_TERM_PREFIX   # a task term of the env is a per-step feature of the same name

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
    "task_base_pose": (("x", "y", "z", "yaw"), "m, rad (world)"),
    "task_target_pos": (_XYZ, "m (world)"),
    "task_target_vel": (_XYZ, "m/s (world)"),
    "task_distractor_pos": (_XYZ, "m (world)"),
    "task_obstacle_pos": (_XYZ, "m (world)"),
    "task_tunnel_entry": (_XYZ, "m (world)"),
    "task_info": (("family", "speed", "gait", "has_obstacle"), "codes (envs.quard.instructions)"),
}


@dataclass(frozen=True)
class FeatureSpec:
    dtype: str
    shape: tuple[int, ...]          # per step
    names: tuple[str, ...] = ()     # names of the last axis' entries, if meaningful
    units: str = ""
    stride: int = 1                 # control steps per stored row (images: frames every `stride` steps)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"], d["names"] = list(self.shape), list(self.names)
        if self.stride == 1:        # per-step features keep the schema JSON they always had
            del d["stride"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FeatureSpec":
        return cls(dtype=str(d["dtype"]), shape=tuple(int(s) for s in d["shape"]),
                   names=tuple(d.get("names", ())), units=str(d.get("units", "")), stride=int(d.get("stride", 1)))


def _catalogue() -> dict[str, FeatureSpec]:
    # terms added to the layout catalogue later get a spec without entry names rather than a KeyError
    cat = {name: FeatureSpec("float32", (dim,), *_TERM_INFO.get(name, ((), ""))) for name, dim in TERM_DIMS.items()}
    cat["actions"] = FeatureSpec("float32", (12,), JOINT_NAMES, "policy output (normalised joint action)")
    cat["applied_actions"] = FeatureSpec("float32", (12,), JOINT_NAMES,
                                         "action applied when a relabelling expert's label is stored as actions (DAgger)")
    cat["joint_targets"] = FeatureSpec("float32", (12,), JOINT_NAMES, "rad (absolute PD target)")
    cat["hl_commands"] = FeatureSpec("float32", (12,), (), "high-level command (GeRM Eq. 9)")
    cat["rewards"] = FeatureSpec("float32", (), (), "task reward per control step")
    cat["terminated"] = FeatureSpec("bool", (), (), "episode ended by a termination at this step")
    cat["time_outs"] = FeatureSpec("bool", (), (), "episode ended by the time limit at this step")
    cat["pushed"] = FeatureSpec("bool", (), (), "a push came after this step's reward: the next step's observation "
                                               "is after it (stores written before this column lack it)")
    cat["instruction"] = FeatureSpec("int64", (), (), "index into the store's instruction table (-1: none)")
    return cat


CATALOGUE: dict[str, FeatureSpec] = _catalogue()
ALLOWED_FEATURES = tuple(CATALOGUE) + (IMAGE_PREFIX + "<camera>", TASK_PREFIX + "<name>")


def spec_for(name: str, value: np.ndarray, where: str, stride: int = 1) -> FeatureSpec:
    """The spec a feature must have; raises naming the feature and allowed values if it cannot.

    ``stride``: steps per frame of image features (per-step features ignore it)."""
    if is_image(name):
        dtype = image_dtype(name, value, where)
        units = "image pixels (RGB)" if dtype == "uint8" else "depth, m"
        return FeatureSpec(dtype, tuple(value.shape[1:]), (), units, stride)
    if name.startswith(TASK_PREFIX) and name not in CATALOGUE:
        return FeatureSpec("float32", tuple(value.shape[1:]), (), "task term (privileged)")
    if name not in CATALOGUE:
        raise ValueError(f"{where}: unknown feature {name!r}; allowed: {list(ALLOWED_FEATURES)}")
    spec = CATALOGUE[name]
    if tuple(value.shape[1:]) != spec.shape:
        raise ValueError(f"{where}: feature {name!r} has per-step shape {tuple(value.shape[1:])}, "
                         f"expected {spec.shape}")
    return spec


def episode_length(lengths: Mapping[str, int], stride: int, where: str) -> int:
    """The episode's step count from its features' first-axis lengths: every per-step feature has the
    same (>= 1) and every image feature ceil(steps / stride) frames; raises naming ``where``."""
    steps = {n: k for n, k in lengths.items() if not is_image(n)}
    if not steps:
        raise ValueError(f"{where}: episode has no per-step features (only images {sorted(lengths)})")
    length = next(iter(steps.values()))
    if length < 1 or any(n != length for n in steps.values()):
        raise ValueError(f"{where}: every feature needs the same number of steps (>= 1); got {dict(steps)}")
    want = num_frames(length, stride)
    bad = {n: k for n, k in lengths.items() if is_image(n) and k != want}
    if bad:
        raise ValueError(f"{where}: image features need ceil({length} steps / frame_stride {stride}) = {want} "
                         f"frames; got {bad}")
    return length


def check_episode(features: Mapping[str, np.ndarray], where: str, stride: int = 1) -> int:
    """Validate one episode's feature dict (images every ``stride`` steps); returns its step count."""
    if not features:
        raise ValueError(f"{where}: episode has no features")
    lengths = {name: len(np.asarray(v)) if np.ndim(v) else -1 for name, v in features.items()}
    length = episode_length(lengths, stride, where)
    for name, value in features.items():
        spec_for(name, np.asarray(value), where, stride)
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
        d = {"format_version": self.format_version, "robot": self.robot, "control_dt": self.control_dt,
             "control_rate_hz": self.control_rate_hz,
             "features": {k: v.to_dict() for k, v in sorted(self.features.items())}}
        if self.image_features:     # said once, readable without knowing the per-feature strides
            stride = self.frame_stride
            d["images"] = {"frame_stride": stride, "frame_rate_hz": self.control_rate_hz / stride if stride else None,
                           "mapping": "frame j of an episode = its step j * frame_stride; "
                                      "frames per episode = ceil(steps / frame_stride)"}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StoreSchema":
        return cls(features={k: FeatureSpec.from_dict(v) for k, v in d["features"].items()},
                   robot=str(d.get("robot", "")), control_dt=float(d.get("control_dt", 0.0)),
                   format_version=int(d.get("format_version", FORMAT_VERSION)))

    @classmethod
    def from_episode(cls, features: Mapping[str, np.ndarray], info: Mapping[str, Any],
                     where: str) -> "StoreSchema":
        stride = frame_stride_of(info, where)
        specs = {name: spec_for(name, np.asarray(v), where, stride) for name, v in features.items()}
        return cls(specs, robot=str(info.get("robot", "")), control_dt=float(info.get("control_dt", 0.02)))

    @property
    def image_features(self) -> tuple[str, ...]:
        return tuple(sorted(n for n in self.features if is_image(n)))

    @property
    def frame_stride(self) -> int | None:
        """Steps per frame of the store's images (one stride for all cameras), None without images."""
        strides = {self.features[n].stride for n in self.image_features}
        return strides.pop() if len(strides) == 1 else None

    def check_stride(self, info: Mapping[str, Any], where: str) -> None:
        """An episode's ``frame_stride`` must be the store's when it has images."""
        stride = frame_stride_of(info, where)
        if self.image_features and stride != self.frame_stride:
            raise ValueError(f"{where}: frame_stride {stride}, the store records images every "
                             f"{self.frame_stride} steps (one image rate per store)")

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
