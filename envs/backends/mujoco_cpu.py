"""``mujoco_cpu``: native MuJoCo, one ``MjData`` per env, stepped on a thread pool.

The caller's thread and ``num_threads - 1`` persistent workers (``envs.backends.env_pool``) pull envs one
at a time from a shared counter, so the threads stay balanced when some envs are contact-heavy or a
thread starts late; MuJoCo releases the GIL inside its step functions, so the threads run the physics
in parallel and only the few Python statements per env are serialised.
A policy step is split so that the state the caller reads is current without an extra ``mj_forward``:

    mj_step2 (finish the substep begun by the last mj_step1, with the new ctrl)
    mj_step(nstep = decimation - 1)
    mj_step1 (position/velocity stages + their sensors at the new state)

which is the same arithmetic as ``decimation`` calls of ``mj_step``. After it, poses and velocities
(``sensordata``'s position/velocity sensors) describe the state after the step; joint torques and
contact forces (acceleration-stage sensors) are those that acted during the last substep. The calls
before the last ``mj_step`` skip the sensors (a sensor-less copy of the env's model,
``common.without_sensors``): nothing reads them, and the state is bit for bit the same.

The readout is one ``sensordata`` row per env copied into a preallocated (N, S) float64 array; every
``RobotState`` field is a float32 tensor sharing memory with a preallocated numpy array, refreshed in
place by a few vectorised numpy copies (MuJoCo's sensors already give the body-frame quantities).
Consumers must ``clone()`` a field they want to keep across steps.
"""
from __future__ import annotations

import os
from typing import Callable, Iterator

import mujoco
import numpy as np
import torch

from quadforge.envs.backends.base import BackendConfig, RobotState
from quadforge.envs.backends.common import FOOT_CONTACT_FORCE, MAX_ABS_STATE, SceneBackend, without_sensors
from quadforge.envs.backends.env_pool import EnvPool
from quadforge.layout import NUM_FEET, NUM_JOINTS
from quadforge.envs.scene import TRACKED


def rotation_matrices(q: np.ndarray) -> np.ndarray:
    """Rotation matrices (N, 3, 3) of wxyz unit quaternions (N, 4): body -> world."""
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    r = np.empty((len(q), 3, 3))
    r[:, 0, 0] = 1 - 2 * (y * y + z * z)
    r[:, 0, 1] = 2 * (x * y - w * z)
    r[:, 0, 2] = 2 * (x * z + w * y)
    r[:, 1, 0] = 2 * (x * y + w * z)
    r[:, 1, 1] = 1 - 2 * (x * x + z * z)
    r[:, 1, 2] = 2 * (y * z - w * x)
    r[:, 2, 0] = 2 * (x * z - w * y)
    r[:, 2, 1] = 2 * (y * z + w * x)
    r[:, 2, 2] = 1 - 2 * (x * x + y * y)
    return r


class MujocoCpuBackend(SceneBackend):
    """``envs.backends.base.PhysicsBackend`` on native MuJoCo (see the module docstring)."""

    sensors_every_substep = False   # True: every substep computes the sensors (benchmarks, tests)

    def __init__(self, cfg: BackendConfig):
        threads = (os.cpu_count() or 1) if cfg.num_threads is None else int(cfg.num_threads)
        if threads < 1:
            raise ValueError(f"BackendConfig.num_threads must be >= 1 or None, got {cfg.num_threads}")
        self._setup_scene(cfg, torch.device("cpu"))
        self.num_threads = min(threads, self.num_envs)
        self.models = [self.variants.models[v] for v in self.variants.env_variant]
        # the substeps whose sensors nobody reads step with a sensor-less copy of their variant
        # (common.without_sensors says why); ``sensors_every_substep`` turns that off (benchmarks, tests)
        quiet = [without_sensors(m) for m in self.variants.models]
        self._quiet_models = [quiet[v] for v in self.variants.env_variant]
        self.datas = [mujoco.MjData(m) for m in self.models]
        # cached numpy views of each env's MjData (a fresh attribute lookup per step costs more)
        self._ctrl_views = [d.ctrl for d in self.datas]
        self._sens_views = [d.sensordata for d in self.datas]

        n, s = self.num_envs, self.models[0].nsensordata  # the robot's sensors, then a scene addon's
        self._sens = np.zeros((n, s))                  # (N, S) readout, float64 as MuJoCo computes it
        self._targets = np.zeros((n, NUM_JOINTS))      # (N, 12) ctrl for the next step
        self._targets_t = torch.from_numpy(self._targets)
        self._reset_qpos = np.zeros((n, self.models[0].nq))  # each env's last reset state, to restore
        self._reset_qvel = np.zeros((n, self.models[0].nv))
        # the caller's thread steps envs too: a 1-thread backend starts no worker
        self._pool: EnvPool | None = EnvPool(self.num_threads, "mujoco-cpu")

        self._state = self._allocate_state()
        self._copies = tuple(self.scene.sensors.fields().items())
        self._kinematic = self.scene.sensors.kinematic
        k = self._kinematic
        self._div_scratch = np.empty((n, k.stop - k.start))  # preallocated for the divergence check
        self._div_peak = np.empty(n)
        self._reset_default(np.arange(n))

    # ------------------------------------------------------------------ protocol
    @property
    def state(self) -> RobotState:
        return self._state

    def reset(self, env_ids: torch.Tensor, root_pos_w: torch.Tensor, root_quat_w: torch.Tensor,
              root_lin_vel_w: torch.Tensor, root_ang_vel_w: torch.Tensor,
              joint_pos: torch.Tensor, joint_vel: torch.Tensor) -> None:
        ids = self._ids(env_ids)
        k = len(ids)
        parts = {"root_pos_w": (root_pos_w, 3), "root_quat_w": (root_quat_w, 4),
                 "root_lin_vel_w": (root_lin_vel_w, 3), "root_ang_vel_w": (root_ang_vel_w, 3),
                 "joint_pos": (joint_pos, NUM_JOINTS), "joint_vel": (joint_vel, NUM_JOINTS)}
        arr = {}
        for name, (value, dim) in parts.items():
            a = np.asarray(torch.as_tensor(value).detach().cpu(), dtype=np.float64)
            if a.shape != (k, dim):
                raise ValueError(f"reset: {name} must have shape ({k}, {dim}) for {k} env ids, got {tuple(a.shape)}")
            if not np.isfinite(a).all():
                raise ValueError(f"reset: {name} holds non-finite values")
            arr[name] = a
        quat = arr["root_quat_w"]
        norm = np.linalg.norm(quat, axis=1, keepdims=True)
        if (norm < 1e-9).any():
            raise ValueError("reset: root_quat_w rows must be non-zero (w, x, y, z) quaternions")
        quat = quat / norm
        self._reset_qpos[ids, 0:3] = arr["root_pos_w"]
        self._reset_qpos[ids, 3:7] = quat
        self._reset_qpos[ids, 7:] = arr["joint_pos"][:, self._qpos_order]
        self._reset_qvel[ids, 0:3] = arr["root_lin_vel_w"]
        # a free joint's angular velocity lives in the body frame: R^T w, as a row vector w^T R
        self._reset_qvel[ids, 3:6] = (arr["root_ang_vel_w"][:, None, :] @ rotation_matrices(quat))[:, 0]
        self._reset_qvel[ids, 6:] = arr["joint_vel"][:, self._qpos_order]
        self._targets[ids] = arr["joint_pos"]
        for i in ids:
            self._restore(int(i))
        self._refresh()

    def step(self, joint_targets: torch.Tensor, during: Callable[[], None] | None = None) -> torch.Tensor:
        if tuple(joint_targets.shape) != (self.num_envs, NUM_JOINTS):
            raise ValueError(f"step: joint_targets must have shape ({self.num_envs}, {NUM_JOINTS}), "
                             f"got {tuple(joint_targets.shape)}")
        self._targets_t.copy_(joint_targets.detach())  # float32 -> float64, any device
        # ``during`` runs once the caller's thread finds no env left to step, while the workers finish
        # theirs; it may read the state tensors: the workers write only MjData and the float64 readout,
        # which _refresh copies into the state after the run
        if self._pool is not None:
            self._pool.run(self._step_envs, self.num_envs, tail=during)
        else:  # closed: the caller's thread alone
            if during is not None:
                during()
            self._step_envs(iter(range(self.num_envs)))
        bad = self._diverged()
        if bad.any():
            ids = np.flatnonzero(bad)
            self.num_non_finite += len(ids)
            for i in ids:
                self._restore(int(i))
        self._refresh()
        return torch.from_numpy(bad)

    def push(self, env_ids: torch.Tensor, delta_lin_vel_w: torch.Tensor) -> None:
        ids = self._ids(env_ids)
        dv = np.asarray(torch.as_tensor(delta_lin_vel_w).detach().cpu(), dtype=np.float64)
        if dv.shape != (len(ids), 3):
            raise ValueError(f"push: delta_lin_vel_w must have shape ({len(ids)}, 3), got {tuple(dv.shape)}")
        for row, i in enumerate(ids):
            m, d = self.models[i], self.datas[i]
            d.qvel[0:3] += dv[row]
            # velocity-dependent quantities of the pending substep must see the new velocity
            mujoco.mj_forward(m, d)
            self._sens[i] = self._sens_views[i]
        self._refresh()

    # ------------------------------------------------------------------ task scenes (optional capabilities)
    def set_mocap(self, env_ids, pos: np.ndarray, quat: np.ndarray | None = None, forward: bool = False) -> None:
        """Place the scene's mocap bodies (task objects) of the given envs: ``pos`` (k, nmocap, 3),
        ``quat`` (k, nmocap, 4) wxyz or None to keep. ``forward`` recomputes the envs' derived
        quantities now (after a reset, so the first frame and contacts see the objects); otherwise the
        next step does."""
        ids = self._ids(env_ids)
        nm = self.models[0].nmocap
        pos = np.asarray(pos, dtype=np.float64)
        if pos.shape != (len(ids), nm, 3):
            raise ValueError(f"set_mocap: pos must have shape ({len(ids)}, {nm}, 3), got {pos.shape}")
        for row, i in enumerate(ids):
            d = self.datas[i]
            d.mocap_pos[:] = pos[row]
            if quat is not None:
                d.mocap_quat[:] = quat[row]
            if forward:
                mujoco.mj_forward(self.models[i], d)
                self._sens[i] = self._sens_views[i]

    def sensor_columns(self, cols: slice) -> np.ndarray:
        """(N, k) float64 view of the last readout's sensordata columns (e.g. a scene addon's sensors)."""
        return self._sens[:, cols]

    def make_camera(self, cfg):
        """A batched camera over this backend's envs (``envs.quard.camera.MujocoCamera``): a backend
        capability, so a GPU backend can supply its own renderer behind the same interface."""
        from quadforge.envs.quard.camera import MujocoCamera

        return MujocoCamera(self.models, self.datas, cfg)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __del__(self):  # the pool's threads would otherwise outlive a forgotten backend
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ internals
    def _ids(self, env_ids: torch.Tensor) -> np.ndarray:
        ids = np.asarray(torch.as_tensor(env_ids).detach().cpu(), dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_envs):
            raise ValueError(f"env_ids must lie in [0, {self.num_envs}), got min {ids.min()} max {ids.max()}")
        return ids

    def _step_envs(self, envs: Iterator[int]) -> None:
        """Step every env drawn from ``envs`` (shared with the other threads) and copy out its readout."""
        models, datas, ctrl, sens, targets = self.models, self.datas, self._ctrl_views, self._sens_views, self._targets
        quiet_models = self.models if self.sensors_every_substep else self._quiet_models
        extra = self.decimation - 1
        step1, step2, step = mujoco.mj_step1, mujoco.mj_step2, mujoco.mj_step
        out = self._sens
        for i in envs:
            m, d = models[i], datas[i]
            ctrl[i][:] = targets[i]
            if extra:   # only the last full step and step1 compute sensors (common.without_sensors)
                quiet = quiet_models[i]
                step2(quiet, d)
                if extra > 1:
                    step(quiet, d, extra - 1)
                step(m, d)
            else:
                step2(m, d)
            step1(m, d)
            out[i] = sens[i]

    def _diverged(self) -> np.ndarray:
        scratch, peak = self._div_scratch, self._div_peak
        np.abs(self._sens[:, self._kinematic], out=scratch)
        np.max(scratch, axis=1, out=peak)  # NaN propagates through max ...
        return ~(peak <= MAX_ABS_STATE)    # ... and compares False

    def _restore(self, i: int) -> None:
        """Put env i into its last reset state (fresh MjData contents: no warmstart, time 0)."""
        m, d = self.models[i], self.datas[i]
        mujoco.mj_resetData(m, d)
        d.qpos[:] = self._reset_qpos[i]
        d.qvel[:] = self._reset_qvel[i]
        d.ctrl[:] = self._targets[i]
        mujoco.mj_forward(m, d)
        self._sens[i] = self._sens_views[i]

    def _reset_default(self, ids: np.ndarray) -> None:
        """Standing pose at the origin, above the ground: a valid state before the caller's first reset."""
        self.reset(torch.from_numpy(ids), *(torch.from_numpy(a) for a in self._default_pose(len(ids))))

    def _allocate_state(self) -> RobotState:
        """RobotState tensors share memory with float32 numpy arrays (``self._np``), which the readout
        fills: numpy's per-call cost on these small arrays is a fraction of torch's."""
        n = self.num_envs
        shapes = {"root_pos_w": (n, 3), "root_quat_w": (n, 4), "root_lin_vel_w": (n, 3), "root_ang_vel_w": (n, 3),
                  "root_lin_vel_b": (n, 3), "root_ang_vel_b": (n, 3), "projected_gravity_b": (n, 3),
                  "joint_pos": (n, NUM_JOINTS), "joint_vel": (n, NUM_JOINTS), "joint_torque": (n, NUM_JOINTS),
                  "foot_pos_w": (n, NUM_FEET, 3), "contact_forces": (n, len(TRACKED), 3)}
        self._np = {k: np.zeros(shape, dtype=np.float32) for k, shape in shapes.items()}
        self._np["foot_contact"] = np.zeros((n, NUM_FEET), dtype=bool)
        return RobotState(body_names=TRACKED, **{k: torch.from_numpy(v) for k, v in self._np.items()})

    def _refresh(self) -> None:
        """Fill every RobotState field in place from the (N, S) readout (plain copies, no math)."""
        s, L, a = self._sens, self.scene.sensors, self._np
        for name, cols in self._copies:
            a[name][:] = s[:, cols]
        a["foot_pos_w"].reshape(-1, 3 * NUM_FEET)[:] = s[:, L.foot_pos]
        np.negative(s[:, L.up_b], out=a["projected_gravity_b"], casting="same_kind")
        # contact sensors report the force the tracked object exerts on the rest: negate; then the calf
        # link alone is its whole body (foot sphere included) minus the foot
        cf = a["contact_forces"]
        np.negative(s[:, L.contacts], out=cf.reshape(-1, 3 * len(TRACKED)), casting="same_kind")
        cf[:, 5:9] -= cf[:, 9:13]
        foot = cf[:, 9:13]
        np.greater(np.einsum("nfi,nfi->nf", foot, foot), FOOT_CONTACT_FORCE ** 2, out=a["foot_contact"])
