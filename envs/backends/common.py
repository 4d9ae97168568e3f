"""What every backend built on a MuJoCo scene sets up the same way: ``SceneBackend``.

The config checks, the robot, the compiled scene (robot MJCF, ground plane or terrain heightfield, the
sensor readout, a scene addon's objects), the seeded pool of physics variants and each env's draw from
it, the per-env parameters, the joint-order map between the project and the model, and the terrain
height lookup. A backend subclasses it and calls ``_setup_scene`` first in its ``__init__``.
"""
from __future__ import annotations

import mujoco
import numpy as np
import torch

from quadforge.envs.backends.base import BackendConfig
from quadforge.envs.scene import Scene, build_scene, make_variants
from quadforge.layout import NUM_JOINTS
from quadforge.seeding import numpy_rng

# A state entry beyond this magnitude (m, rad, m/s, rad/s) is a diverged simulation, like a NaN.
MAX_ABS_STATE = 1e6
# Foot contact: net contact force above this (N), as legged_gym's contact_forces > 1.
FOOT_CONTACT_FORCE = 1.0


def load_terrain(terrain_cfg):
    """The Terrain to build, or None for a plane (no config, or a flat-plane one)."""
    if terrain_cfg is None or getattr(terrain_cfg, "plane", False):
        return None
    from quadforge.envs.terrain import generate

    return generate(terrain_cfg)


def without_sensors(m: mujoco.MjModel) -> mujoco.MjModel:
    """A copy of ``m`` with every sensor disabled, stepped on the same MjData as ``m`` (same sizes).

    A policy step's physics calls are step2, ``decimation - 1`` full steps and step1; the readout keeps
    step1's position/velocity sensors and the last full step's acceleration-stage sensors (contact
    forces, joint torques; step2's when decimation is 1). Every other call's sensors are overwritten
    unread, so those calls step with this copy; sensors never act on the dynamics, so no state changes.
    Measured: sensors are 11-14 % of a MuJoCo C step of the Go1 scenes here, and MuJoCo Warp's
    acceleration-stage sensors 54 of 471 ns of a physics step on an H100 (docs/scale.md)."""
    import copy

    quiet = copy.deepcopy(m)
    quiet.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_SENSOR)
    return quiet


class SceneBackend:
    """The shared part of a MuJoCo-scene backend (module doc)."""

    @staticmethod
    def check_config(cfg: BackendConfig) -> None:
        """The checks every backend makes before building anything."""
        if int(cfg.num_envs) < 1:
            raise ValueError(f"BackendConfig.num_envs must be >= 1, got {cfg.num_envs}")
        if int(cfg.decimation) < 1:
            raise ValueError(f"BackendConfig.decimation must be >= 1, got {cfg.decimation}")

    def _setup_scene(self, cfg: BackendConfig, device: torch.device) -> None:
        from quadforge.envs.robots import get_robot

        self.check_config(cfg)
        self.cfg = cfg
        self.device = device
        self.num_envs = int(cfg.num_envs)
        self.num_joints = NUM_JOINTS
        self.sim_dt = float(cfg.sim_dt)
        self.decimation = int(cfg.decimation)
        self.num_non_finite = 0
        self.robot = get_robot(cfg.robot)
        self.scene: Scene = build_scene(self.robot, load_terrain(cfg.terrain), self.sim_dt,
                                        getattr(cfg, "scene_addon", None))
        self.variants = make_variants(self.scene, cfg.randomization, self.num_envs,
                                      numpy_rng(cfg.seed, "backend/variants"))
        v = self.variants
        self._env_params = {name: torch.as_tensor(getattr(v, name), dtype=torch.float32, device=device)
                            for name in ("friction", "added_mass", "motor_strength")}
        self._qpos_order = self._hinge_order(self.scene.model)

    @property
    def env_params(self) -> dict[str, torch.Tensor]:
        return self._env_params

    def terrain_height(self, xy_w: torch.Tensor) -> torch.Tensor:
        if xy_w.shape[-1] != 2:
            raise ValueError(f"terrain_height: points must have a last dimension of 2 (x, y), got {tuple(xy_w.shape)}")
        if self.scene.terrain is None:
            return torch.zeros(xy_w.shape[:-1], dtype=torch.float32, device=xy_w.device)
        return self.scene.terrain.height_at(xy_w)

    def _hinge_order(self, m: mujoco.MjModel) -> np.ndarray:
        """Column order taking project joint order to the model's hinge order (qpos[7:], qvel[6:])."""
        adr = [m.jnt_qposadr[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, j)] - 7 for j in self.robot.joint_names]
        order = np.empty(NUM_JOINTS, dtype=np.int64)
        order[np.asarray(adr)] = np.arange(NUM_JOINTS)
        return order

    def _default_pose(self, k: int) -> tuple[np.ndarray, ...]:
        """(pos, quat, lin_vel, ang_vel, joint_pos, joint_vel) of k robots standing at the origin above
        the ground at rest: a valid state before the caller's first reset."""
        pos = np.zeros((k, 3))
        pos[:, 2] = self.robot.nominal_base_height + float(self.terrain_height(torch.zeros(1, 2)).max())
        quat = np.tile([1.0, 0.0, 0.0, 0.0], (k, 1))
        q = np.tile(np.asarray(self.robot.default_joint_pos, dtype=np.float64), (k, 1))
        z3, z12 = np.zeros((k, 3)), np.zeros((k, NUM_JOINTS))
        return pos, quat, z3, z3, q, z12
