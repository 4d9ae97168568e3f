"""Compose the MuJoCo scene a backend steps: one robot on a ground plane or a terrain heightfield.

The scene adds, to the robot's own MJCF (``RobotSpec.spec()``), the ground and a set of sensors chosen
so that one copy of ``MjData.sensordata`` per env is the whole batched readout (``SensorLayout`` says
where each quantity lives). Contact forces come from MuJoCo ``contact`` sensors reduced to the net
force in the world frame; such a sensor reports the force the tracked object exerts on the rest, so
the readout negates it (checked against ``cfrc_ext`` when this file was written).

Domain randomization uses a small pool of model variants (copies of the compiled model with sampled
friction, added base mass and motor strength); envs are spread over the pool by a seeded draw.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import mujoco
import numpy as np

from quadforge.envs.backends.base import RandomizationConfig
from quadforge.layout import JOINT_NAMES, LEGS

# The tracked bodies of RobotState.contact_forces, in this order. Calf entries exclude the foot
# sphere (a geom of the calf body), so a foot on the ground is never a "calf collision".
TRACKED = ("base",) + tuple(f"{leg}_thigh" for leg in LEGS) + tuple(f"{leg}_calf" for leg in LEGS) \
    + tuple(f"{leg}_foot" for leg in LEGS)
GROUND_NAME = "ground"
BASE_FRAME_SITE = "quadforge_base_frame"
_SENS = mujoco.mjtSensor
_OBJ = mujoco.mjtObj


@dataclass(frozen=True)
class SensorLayout:
    """Column slices of ``sensordata`` (every block in project joint / foot order)."""

    root_pos: slice        # 3, base frame origin, world
    root_quat: slice       # 4, wxyz
    root_lin_vel: slice    # 3, world
    root_ang_vel: slice    # 3, world
    root_lin_vel_b: slice  # 3, base frame (velocimeter at the base origin)
    root_ang_vel_b: slice  # 3, base frame (gyro)
    up_b: slice            # 3, world z axis in the base frame (= -projected gravity)
    joint_pos: slice       # 12
    joint_vel: slice       # 12
    joint_torque: slice    # 12, actuator force after limits
    foot_pos: slice        # 12 = 4 x 3, world
    contacts: slice        # 39 = 13 x 3 in TRACKED order (base, thighs, whole calf bodies, foot geoms);
                           # the calf bodies include their foot sphere: the backend subtracts the feet
    size: int

    @functools.cached_property
    def kinematic(self) -> slice:
        """The columns that describe the physical state (checked for non-finite values)."""
        return slice(self.root_pos.start, self.joint_vel.stop)

    def fields(self) -> dict[str, slice]:
        """RobotState field -> columns, for the fields that are a plain copy of sensordata."""
        return {"root_pos_w": self.root_pos, "root_quat_w": self.root_quat, "root_lin_vel_w": self.root_lin_vel,
                "root_ang_vel_w": self.root_ang_vel, "root_lin_vel_b": self.root_lin_vel_b,
                "root_ang_vel_b": self.root_ang_vel_b, "joint_pos": self.joint_pos, "joint_vel": self.joint_vel,
                "joint_torque": self.joint_torque}


@dataclass
class Scene:
    model: mujoco.MjModel
    sensors: SensorLayout
    robot: object          # envs.robots.RobotSpec
    terrain: object | None  # envs.terrain.Terrain, None for a plane
    ground_geom: int
    addon_sensors: dict[str, slice] = None  # columns of sensordata the scene addon added, by name


def _check_names(model: mujoco.MjModel, robot) -> None:
    """A robot MJCF missing a contract name is an error here, not a silent wrong readout later."""
    wanted = [(robot.base_body, _OBJ.mjOBJ_BODY)] + [(n, _OBJ.mjOBJ_JOINT) for n in robot.joint_names] \
        + [(n, _OBJ.mjOBJ_ACTUATOR) for n in robot.actuator_names] \
        + [(n, _OBJ.mjOBJ_SITE) for n in robot.foot_sites] + [(n, _OBJ.mjOBJ_GEOM) for n in robot.foot_geoms] \
        + [(n, _OBJ.mjOBJ_BODY) for n in robot.thigh_bodies + robot.calf_bodies]
    for name, kind in wanted:
        if mujoco.mj_name2id(model, kind, name) < 0:
            raise ValueError(f"robot MJCF {robot.mjcf_path}: no {kind.name[6:].lower()} named {name!r}")


def _add_ground(spec: mujoco.MjSpec, terrain) -> None:
    if terrain is None:
        spec.worldbody.add_geom(name=GROUND_NAME, type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.05],
                                friction=[1.0, 0.005, 0.0001])
        return
    geom = terrain.mujoco_hfield().add_to(spec, name=GROUND_NAME)
    geom.friction = [1.0, 0.005, 0.0001]


def _add_sensors(spec: mujoco.MjSpec, robot) -> SensorLayout:
    cursor = 0

    def block(sensors: list[tuple], ref: tuple | None = None) -> slice:
        # (type, objtype, name, dim, intprm0) each; returns the slice of sensordata the block occupies
        nonlocal cursor
        start = cursor
        for stype, objtype, name, dim, intprm in sensors:
            s = spec.add_sensor(type=stype, objtype=objtype, objname=name)
            if ref is not None:  # express the quantity in this frame instead of the world's
                s.reftype, s.refname = ref
            if stype == _SENS.mjSENS_CONTACT:
                # data="force" (bit 1), reduce="netforce" (3), one slot: net world-frame force
                s.intprm[0], s.intprm[1], s.intprm[2] = 1 << int(mujoco.mjtConDataField.mjCONDATA_FORCE), 3, 1
            cursor += dim
        return slice(start, cursor)

    base = robot.base_body
    # a site at the base frame's origin with its orientation: body-frame velocities and gravity come
    # straight from MuJoCo's velocity-stage sensors, current after mj_step1
    spec.body(base).add_site(name=BASE_FRAME_SITE, group=5)
    xb = _OBJ.mjOBJ_XBODY  # the body frame itself, not its centre of mass
    layout = dict(
        root_pos=block([(_SENS.mjSENS_FRAMEPOS, xb, base, 3, 0)]),
        root_quat=block([(_SENS.mjSENS_FRAMEQUAT, xb, base, 4, 0)]),
        root_lin_vel=block([(_SENS.mjSENS_FRAMELINVEL, xb, base, 3, 0)]),
        root_ang_vel=block([(_SENS.mjSENS_FRAMEANGVEL, xb, base, 3, 0)]),
        root_lin_vel_b=block([(_SENS.mjSENS_VELOCIMETER, _OBJ.mjOBJ_SITE, BASE_FRAME_SITE, 3, 0)]),
        root_ang_vel_b=block([(_SENS.mjSENS_GYRO, _OBJ.mjOBJ_SITE, BASE_FRAME_SITE, 3, 0)]),
        up_b=block([(_SENS.mjSENS_FRAMEZAXIS, _OBJ.mjOBJ_XBODY, "world", 3, 0)],
                   ref=(_OBJ.mjOBJ_SITE, BASE_FRAME_SITE)),
        joint_pos=block([(_SENS.mjSENS_JOINTPOS, _OBJ.mjOBJ_JOINT, j, 1, 0) for j in robot.joint_names]),
        joint_vel=block([(_SENS.mjSENS_JOINTVEL, _OBJ.mjOBJ_JOINT, j, 1, 0) for j in robot.joint_names]),
        joint_torque=block([(_SENS.mjSENS_ACTUATORFRC, _OBJ.mjOBJ_ACTUATOR, a, 1, 0)
                            for a in robot.actuator_names]),
        foot_pos=block([(_SENS.mjSENS_FRAMEPOS, _OBJ.mjOBJ_SITE, s, 3, 0) for s in robot.foot_sites]),
        contacts=block([(_SENS.mjSENS_CONTACT, _OBJ.mjOBJ_BODY, b, 3, 0)
                        for b in (base,) + tuple(robot.thigh_bodies) + tuple(robot.calf_bodies)]
                       + [(_SENS.mjSENS_CONTACT, _OBJ.mjOBJ_GEOM, g, 3, 0) for g in robot.foot_geoms]),
    )
    return SensorLayout(size=cursor, **layout)


def build_scene(robot, terrain=None, sim_dt: float = 0.005, addon=None) -> Scene:
    """Compile the robot + ground (+ sensors) model. ``terrain`` is an ``envs.terrain.Terrain`` or None;
    ``addon`` (optional) adds task objects after the robot's sensors (``BackendConfig.scene_addon``)."""
    if not sim_dt > 0:
        raise ValueError(f"sim_dt must be > 0 seconds, got {sim_dt}")
    spec = robot.spec()
    spec.option.timestep = sim_dt
    # MuJoCo would silently reset a diverged sim to qpos0; the backend detects non-finite state itself
    # and restores the env's last reset state, so it can count and report it.
    spec.option.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_AUTORESET)
    _add_ground(spec, terrain)
    sensors = _add_sensors(spec, robot)
    addon_sensors = addon.add_to(spec, sensors.size) if addon is not None else {}
    extra = max((s.stop for s in addon_sensors.values()), default=sensors.size) - sensors.size
    model = spec.compile()
    _check_names(model, robot)
    if model.nsensordata != sensors.size + extra:
        raise RuntimeError(f"scene sensors hold {model.nsensordata} values, layout expects {sensors.size + extra}")
    free = mujoco.mjtJoint.mjJNT_FREE
    if model.njnt != 1 + len(JOINT_NAMES) or model.jnt_type[0] != free or model.nq != 7 + len(JOINT_NAMES):
        raise ValueError(f"robot MJCF {robot.mjcf_path}: expected a free joint on the base followed by "
                         f"{len(JOINT_NAMES)} hinges (nq {7 + len(JOINT_NAMES)}), got njnt {model.njnt}, nq {model.nq}")
    if model.nu != len(JOINT_NAMES):
        raise ValueError(f"robot MJCF {robot.mjcf_path}: {model.nu} actuators, expected {len(JOINT_NAMES)}")
    return Scene(model=model, sensors=sensors, robot=robot, terrain=terrain,
                 ground_geom=mujoco.mj_name2id(model, _OBJ.mjOBJ_GEOM, GROUND_NAME), addon_sensors=addon_sensors)


@dataclass
class Variants:
    models: list[mujoco.MjModel]   # the pool
    env_variant: np.ndarray        # (N,) int, pool index of each env
    friction: np.ndarray           # (N,) sliding friction of every contact of the env
    added_mass: np.ndarray         # (N,) kg added to the base
    motor_strength: np.ndarray     # (N,) scale of Kp, Kd and torque limits


def _draw(rng: np.random.Generator, rng_range: tuple[float, float] | None, n: int, nominal: float,
          field_name: str) -> np.ndarray:
    if rng_range is None:
        return np.full(n, nominal)
    lo, hi = (float(v) for v in rng_range)
    if not lo <= hi:
        raise ValueError(f"RandomizationConfig.{field_name} must be (low, high) with low <= high, got {rng_range}")
    return rng.uniform(lo, hi, n)


def make_variants(scene: Scene, rcfg: RandomizationConfig | None, num_envs: int,
                  rng: np.random.Generator) -> Variants:
    """The model pool and each env's variant; ``rcfg=None`` gives one nominal model for every env."""
    base = scene.model
    nominal_friction = float(base.geom_friction[scene.ground_geom, 0])
    if rcfg is None:
        return Variants([base], np.zeros(num_envs, dtype=np.int64), np.full(num_envs, nominal_friction),
                        np.zeros(num_envs), np.ones(num_envs))
    k = int(rcfg.num_variants)
    if k < 1:
        raise ValueError(f"RandomizationConfig.num_variants must be >= 1, got {rcfg.num_variants}")
    friction = _draw(rng, rcfg.friction_range, k, nominal_friction, "friction_range")
    mass = _draw(rng, rcfg.added_mass_range, k, 0.0, "added_mass_range")
    strength = _draw(rng, rcfg.motor_strength_range, k, 1.0, "motor_strength_range")
    if (friction <= 0).any() or (strength <= 0).any():
        raise ValueError("RandomizationConfig: friction_range and motor_strength_range must be > 0")
    base_id = mujoco.mj_name2id(base, _OBJ.mjOBJ_BODY, scene.robot.base_body)
    if (base.body_mass[base_id] + mass <= 0).any():
        raise ValueError(f"RandomizationConfig.added_mass_range {rcfg.added_mass_range} would make the base "
                         f"mass ({base.body_mass[base_id]:.3f} kg) non-positive")
    models = []
    for i in range(k):
        m = copy.deepcopy(base)
        # every geom (robot and ground) gets the same sliding friction, so whichever geom's value MuJoCo
        # combines into a contact (max, or the higher-priority foot), the contact sees this friction
        m.geom_friction[:, 0] = friction[i]
        m.body_mass[base_id] += mass[i]
        # position actuator: force = kp*(ctrl - q) - kd*qdot = gain*ctrl + bias1*q + bias2*qdot
        m.actuator_gainprm[:, 0] *= strength[i]
        m.actuator_biasprm[:, 1:3] *= strength[i]
        m.actuator_forcerange *= strength[i]
        mujoco.mj_setConst(m, mujoco.MjData(m))  # refresh mass-derived constants (subtree mass, ...)
        models.append(m)
    # an even spread over the pool, shuffled: every variant is used when num_envs >= num_variants
    env_variant = rng.permutation(np.arange(num_envs) % k)
    return Variants(models, env_variant, friction[env_variant], mass[env_variant], strength[env_variant])
