"""Robot specifications: the figures every other part reads about a robot, and its MJCF model.

The MJCF files under ``envs/assets/`` are written in this repository from published figures (link
lengths, masses, inertias, joint ranges, motor limits); ``RobotSpec.published`` carries each figure with
its source so tests and docs can check the model against them. Everything is in SI units and in the
project joint order (``quadforge.layout.JOINT_NAMES``: legs FR, FL, RR, RL x hip, thigh, calf).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from quadforge.layout import JOINT_NAMES, LEGS

ASSETS = Path(__file__).resolve().parent / "assets"

_UNITREE_GO1 = "Unitree Go1 product specification / go1_description (unitree_ros)"
_LEGGED_GYM_GO1 = "walk-these-ways go1_config (Margolis & Agrawal 2022)"
_UNITREE_ALIENGO = "Unitree Aliengo product specification / aliengo_description (unitree_ros)"


@dataclass(frozen=True)
class RobotSpec:
    """Everything about one quadruped that code above the physics needs.

    Per-joint tuples are in ``JOINT_NAMES`` order; per-foot tuples in ``LEGS`` order. ``kp``/``kd`` are
    the PD gains of the position actuators (N*m/rad, N*m*s/rad), the same for every joint.
    """

    name: str
    mjcf_path: str
    default_joint_pos: tuple[float, ...]          # (12,) rad, standing pose
    kp: float
    kd: float
    action_scale: float                           # q_target = default + action_scale * a
    torque_limits: tuple[float, ...]              # (12,) N*m
    velocity_limits: tuple[float, ...]            # (12,) rad/s
    joint_ranges: tuple[tuple[float, float], ...]  # (12, 2) rad
    hip_offsets: tuple[tuple[float, float, float], ...]  # (4, 3) m, hip (abduction) joint in base frame
    abduction_length: float                       # m, hip joint -> thigh joint along y
    thigh_length: float                           # m, thigh joint -> knee
    calf_length: float                            # m, knee -> foot-sphere centre
    foot_radius: float                            # m
    nominal_base_height: float                    # m, base above flat ground in the default pose
    total_mass: float                             # kg, sum of the MJCF's link masses
    published: dict[str, tuple[object, str]] = field(default_factory=dict, compare=False, hash=False)
    joint_names: tuple[str, ...] = JOINT_NAMES
    base_body: str = "base"
    imu_site: str = "imu"
    foot_sites: tuple[str, ...] = tuple(f"{leg}_foot" for leg in LEGS)
    foot_geoms: tuple[str, ...] = tuple(f"{leg}_foot" for leg in LEGS)
    hip_bodies: tuple[str, ...] = tuple(f"{leg}_hip" for leg in LEGS)
    thigh_bodies: tuple[str, ...] = tuple(f"{leg}_thigh" for leg in LEGS)
    calf_bodies: tuple[str, ...] = tuple(f"{leg}_calf" for leg in LEGS)
    actuator_names: tuple[str, ...] = JOINT_NAMES  # one position actuator per joint, same order

    def load_model(self):
        """The compiled robot-only model (no floor): ``mujoco.MjModel``."""
        import mujoco

        return mujoco.MjModel.from_xml_path(self.mjcf_path)

    def spec(self):
        """A fresh editable ``mujoco.MjSpec`` of the robot, for composing scenes (add floor/terrain)."""
        import mujoco

        return mujoco.MjSpec.from_file(self.mjcf_path)

    @property
    def leg_side(self) -> tuple[int, ...]:
        """+1 for left legs, -1 for right legs (sign of the hip's y offset), LEGS order."""
        return tuple(1 if leg[1] == "L" else -1 for leg in LEGS)


def _per_leg(hip: float, thigh: float, calf: float) -> tuple[float, ...]:
    return (hip, thigh, calf) * len(LEGS)


def _hip_offsets(x: float, y: float) -> tuple[tuple[float, float, float], ...]:
    sign = {"F": 1.0, "R": -1.0, "L": 1.0}
    return tuple((sign[leg[0]] * x, (1.0 if leg[1] == "L" else -1.0) * y, 0.0) for leg in LEGS)


def _default_pose(hip: float, thigh_front: float, thigh_rear: float, calf: float) -> tuple[float, ...]:
    # left legs abduct by +hip, right by -hip: both feet move outward
    pose = []
    for leg in LEGS:
        side = 1.0 if leg[1] == "L" else -1.0
        pose += [side * hip, thigh_front if leg[0] == "F" else thigh_rear, calf]
    return tuple(pose)


def _standing_height(pose: tuple[float, ...], abd: float, l1: float, l2: float, r: float) -> float:
    """Base height over flat ground with every foot sphere touching it (mean over legs)."""
    zs = []
    for i, leg in enumerate(LEGS):
        q0, q1, q2 = pose[3 * i: 3 * i + 3]
        side = 1.0 if leg[1] == "L" else -1.0
        # sagittal-plane foot depth below the thigh joint, then the abduction rotation about x
        z_s = -l1 * math.cos(q1) - l2 * math.cos(q1 + q2)
        zs.append(side * abd * math.sin(q0) + z_s * math.cos(q0))
    return -sum(zs) / len(zs) + r


def _ranges(hip: tuple[float, float], thigh: tuple[float, float], calf: tuple[float, float]):
    return (hip, thigh, calf) * len(LEGS)


@dataclass(frozen=True)
class _Figures:
    """One quadruped's published figures (per-leg values hip, thigh, calf) and where each came from."""

    name: str
    source: str                                   # the figures' default source
    mass_spec: tuple[float, str]                  # kg, spec sheet wording
    link_masses: dict[str, float]                 # kg: trunk, hip, thigh, calf, foot
    hip_offset: tuple[float, float]               # m, (x, y) of the hip joints from the base
    abduction: float
    thigh: float
    calf: float
    foot_radius: float
    ranges: tuple[tuple[float, float], ...]       # (hip, thigh, calf) rad
    torque_limits: tuple[float, float, float]     # N*m
    velocity_limits: tuple[float, float, float]   # rad/s
    kp: float
    kd: float
    # sources that differ from ``source``: velocity_limits_rad_s, default_pose_rad, pd_gains, action_scale
    notes: dict[str, str]
    pose: tuple[float, float, float, float] = (0.1, 0.8, 1.0, -1.5)   # hip, thigh front, thigh rear, calf
    action_scale: float = 0.25


def _quadruped(f: _Figures) -> RobotSpec:
    """The RobotSpec of a 12-joint quadruped from its figures (its MJCF is ``assets/<name>.xml``)."""
    pose = _default_pose(*f.pose)
    masses = f.link_masses
    src = {"source": f.source, **f.notes}
    return RobotSpec(
        name=f.name,
        mjcf_path=str(ASSETS / f"{f.name}.xml"),
        default_joint_pos=pose,
        kp=f.kp, kd=f.kd, action_scale=f.action_scale,
        torque_limits=_per_leg(*f.torque_limits),
        velocity_limits=_per_leg(*f.velocity_limits),
        joint_ranges=_ranges(*f.ranges),
        hip_offsets=_hip_offsets(*f.hip_offset),
        abduction_length=f.abduction, thigh_length=f.thigh, calf_length=f.calf, foot_radius=f.foot_radius,
        nominal_base_height=round(_standing_height(pose, f.abduction, f.thigh, f.calf, f.foot_radius), 4),
        total_mass=round(masses["trunk"] + 4 * sum(v for k, v in masses.items() if k != "trunk"), 4),
        published={
            "mass_spec_kg": f.mass_spec,
            "link_masses_kg": (masses, f.source),
            "hip_offset_m": (f.hip_offset, f.source),
            "abduction_length_m": (f.abduction, f.source),
            "thigh_length_m": (f.thigh, f.source),
            "calf_length_m": (f.calf, f.source),
            "foot_radius_m": (f.foot_radius, f.source),
            "hip_range_rad": (f.ranges[0], f.source),
            "thigh_range_rad": (f.ranges[1], f.source),
            "calf_range_rad": (f.ranges[2], f.source),
            "torque_limits_Nm": (f.torque_limits, f.source),
            "velocity_limits_rad_s": (f.velocity_limits, src.get("velocity_limits_rad_s", f.source)),
            "default_pose_rad": (f.pose, src["default_pose_rad"]),
            "pd_gains": ((f.kp, f.kd), src["pd_gains"]),
            "action_scale": (f.action_scale, src["action_scale"]),
        },
    )


def _go1() -> RobotSpec:
    return _quadruped(_Figures(
        name="go1", source=_UNITREE_GO1,
        mass_spec=(12.0, "Unitree Go1 spec sheet: approx. 12 kg with battery"),
        link_masses={"trunk": 5.204, "hip": 0.696, "thigh": 1.013, "calf": 0.166, "foot": 0.06},
        hip_offset=(0.1881, 0.04675), abduction=0.08, thigh=0.213, calf=0.213, foot_radius=0.02,
        ranges=((-0.863, 0.863), (-0.686, 4.501), (-2.818, -0.888)),
        torque_limits=(23.7, 23.7, 35.55), velocity_limits=(30.1, 30.1, 20.06), kp=20.0, kd=0.5,
        notes={"velocity_limits_rad_s": _UNITREE_GO1 + " (knee: 30.1 / 1.5 gear)",
               "default_pose_rad": _LEGGED_GYM_GO1 + ": hip +-0.1, thigh 0.8 front / 1.0 rear, calf -1.5",
               "pd_gains": _LEGGED_GYM_GO1 + ": stiffness 20, damping 0.5",
               "action_scale": _LEGGED_GYM_GO1}))


def _aliengo() -> RobotSpec:
    return _quadruped(_Figures(
        name="aliengo", source=_UNITREE_ALIENGO,
        mass_spec=(21.0, "Unitree Aliengo spec sheet: approx. 21 kg (without payload)"),
        link_masses={"trunk": 9.041, "hip": 1.993, "thigh": 0.639, "calf": 0.207, "foot": 0.06},
        hip_offset=(0.2399, 0.051), abduction=0.083, thigh=0.25, calf=0.25, foot_radius=0.0265,
        ranges=((-1.2217, 1.2217), (-0.524, 3.927), (-2.775, -0.611)),
        torque_limits=(44.0, 44.0, 55.0), velocity_limits=(20.0, 20.0, 20.0), kp=40.0, kd=1.0,
        notes={"default_pose_rad": "legged_gym A1/Aliengo-style default pose (our choice)",
               "pd_gains": "our choice: Go1's walk-these-ways gains scaled ~2x for the ~1.6x heavier robot",
               "action_scale": "our choice, as Go1"}))


# THE robot registry: name -> a function building its RobotSpec (called once, on first use). Every robot list
# (``--robot`` help, config validation, ``load_policy``'s robot check, ``quadforge info``) reads it when asked.
ROBOTS: dict[str, Callable[[], RobotSpec]] = {}
_CACHE: dict[str, RobotSpec] = {}


def register_robot(name: str, build: Callable[[], RobotSpec]) -> None:
    """Add robot ``name``: ``build()`` returns its ``RobotSpec`` (whose ``name`` is ``name``); a taken name is refused."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"register_robot: name {name!r} must be a non-empty string without ':'")
    if name in ROBOTS:
        raise ValueError(f"register_robot: robot {name!r} is already registered")
    if not callable(build):
        raise ValueError(f"register_robot({name!r}): build must be a function returning its RobotSpec, "
                         f"got {type(build).__name__}")
    ROBOTS[name] = build


def robot_names() -> tuple[str, ...]:
    """Every registered robot, in registration order."""
    return tuple(ROBOTS)


def get_robot(name: str) -> RobotSpec:
    """The spec of a named robot; ValueError naming the allowed names for an unknown one."""
    if name not in ROBOTS:
        raise ValueError(f"unknown robot {name!r}; allowed robots: {', '.join(ROBOTS)}")
    if name not in _CACHE:
        spec = ROBOTS[name]()
        if not isinstance(spec, RobotSpec) or spec.name != name:
            raise ValueError(f"robot {name!r}: its builder returned {getattr(spec, 'name', type(spec).__name__)!r}, "
                             f"not a RobotSpec named {name!r}")
        _CACHE[name] = spec
    return _CACHE[name]


def add_robot(p, default: str = "go1") -> None:
    """The ``--robot`` flag, its help listing the robots registered now."""
    p.add_argument("--robot", default=default, help=f"{' | '.join(ROBOTS)} (default {default})")


register_robot("go1", _go1)
register_robot("aliengo", _aliengo)
