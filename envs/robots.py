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

from quadforge.layout import JOINT_NAMES, LEGS

ASSETS = Path(__file__).resolve().parent / "assets"
ROBOTS = ("go1", "aliengo")

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


def _go1() -> RobotSpec:
    pose = _default_pose(0.1, 0.8, 1.0, -1.5)
    link_masses = {"trunk": 5.204, "hip": 0.696, "thigh": 1.013, "calf": 0.166, "foot": 0.06}
    return RobotSpec(
        name="go1",
        mjcf_path=str(ASSETS / "go1.xml"),
        default_joint_pos=pose,
        kp=20.0, kd=0.5, action_scale=0.25,
        torque_limits=_per_leg(23.7, 23.7, 35.55),
        velocity_limits=_per_leg(30.1, 30.1, 20.06),
        joint_ranges=_ranges((-0.863, 0.863), (-0.686, 4.501), (-2.818, -0.888)),
        hip_offsets=_hip_offsets(0.1881, 0.04675),
        abduction_length=0.08, thigh_length=0.213, calf_length=0.213, foot_radius=0.02,
        nominal_base_height=round(_standing_height(pose, 0.08, 0.213, 0.213, 0.02), 4),
        total_mass=round(link_masses["trunk"] + 4 * sum(v for k, v in link_masses.items() if k != "trunk"), 4),
        published={
            "mass_spec_kg": (12.0, "Unitree Go1 spec sheet: approx. 12 kg with battery"),
            "link_masses_kg": (link_masses, _UNITREE_GO1),
            "hip_offset_m": ((0.1881, 0.04675), _UNITREE_GO1),
            "abduction_length_m": (0.08, _UNITREE_GO1),
            "thigh_length_m": (0.213, _UNITREE_GO1),
            "calf_length_m": (0.213, _UNITREE_GO1),
            "foot_radius_m": (0.02, _UNITREE_GO1),
            "hip_range_rad": ((-0.863, 0.863), _UNITREE_GO1),
            "thigh_range_rad": ((-0.686, 4.501), _UNITREE_GO1),
            "calf_range_rad": ((-2.818, -0.888), _UNITREE_GO1),
            "torque_limits_Nm": ((23.7, 23.7, 35.55), _UNITREE_GO1),
            "velocity_limits_rad_s": ((30.1, 30.1, 20.06), _UNITREE_GO1 + " (knee: 30.1 / 1.5 gear)"),
            "default_pose_rad": ((0.1, 0.8, 1.0, -1.5), _LEGGED_GYM_GO1 + ": hip +-0.1, thigh 0.8 front / 1.0 rear, calf -1.5"),
            "pd_gains": ((20.0, 0.5), _LEGGED_GYM_GO1 + ": stiffness 20, damping 0.5"),
            "action_scale": (0.25, _LEGGED_GYM_GO1),
        },
    )


def _aliengo() -> RobotSpec:
    pose = _default_pose(0.1, 0.8, 1.0, -1.5)
    link_masses = {"trunk": 9.041, "hip": 1.993, "thigh": 0.639, "calf": 0.207, "foot": 0.06}
    return RobotSpec(
        name="aliengo",
        mjcf_path=str(ASSETS / "aliengo.xml"),
        default_joint_pos=pose,
        kp=40.0, kd=1.0, action_scale=0.25,
        torque_limits=_per_leg(44.0, 44.0, 55.0),
        velocity_limits=_per_leg(20.0, 20.0, 20.0),
        joint_ranges=_ranges((-1.2217, 1.2217), (-0.524, 3.927), (-2.775, -0.611)),
        hip_offsets=_hip_offsets(0.2399, 0.051),
        abduction_length=0.083, thigh_length=0.25, calf_length=0.25, foot_radius=0.0265,
        nominal_base_height=round(_standing_height(pose, 0.083, 0.25, 0.25, 0.0265), 4),
        total_mass=round(link_masses["trunk"] + 4 * sum(v for k, v in link_masses.items() if k != "trunk"), 4),
        published={
            "mass_spec_kg": (21.0, "Unitree Aliengo spec sheet: approx. 21 kg (without payload)"),
            "link_masses_kg": (link_masses, _UNITREE_ALIENGO),
            "hip_offset_m": ((0.2399, 0.051), _UNITREE_ALIENGO),
            "abduction_length_m": (0.083, _UNITREE_ALIENGO),
            "thigh_length_m": (0.25, _UNITREE_ALIENGO),
            "calf_length_m": (0.25, _UNITREE_ALIENGO),
            "foot_radius_m": (0.0265, _UNITREE_ALIENGO),
            "hip_range_rad": ((-1.2217, 1.2217), _UNITREE_ALIENGO),
            "thigh_range_rad": ((-0.524, 3.927), _UNITREE_ALIENGO),
            "calf_range_rad": ((-2.775, -0.611), _UNITREE_ALIENGO),
            "torque_limits_Nm": ((44.0, 44.0, 55.0), _UNITREE_ALIENGO),
            "velocity_limits_rad_s": ((20.0, 20.0, 20.0), _UNITREE_ALIENGO),
            "default_pose_rad": ((0.1, 0.8, 1.0, -1.5), "legged_gym A1/Aliengo-style default pose (our choice)"),
            "pd_gains": ((40.0, 1.0), "our choice: Go1's walk-these-ways gains scaled ~2x for the ~1.6x heavier robot"),
            "action_scale": (0.25, "our choice, as Go1"),
        },
    )


_BUILDERS = {"go1": _go1, "aliengo": _aliengo}
_CACHE: dict[str, RobotSpec] = {}


def get_robot(name: str) -> RobotSpec:
    """The spec of a named robot; ValueError naming the allowed names for an unknown one."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown robot {name!r}; allowed robots: {', '.join(ROBOTS)}")
    if name not in _CACHE:
        _CACHE[name] = _BUILDERS[name]()
    return _CACHE[name]
