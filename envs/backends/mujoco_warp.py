"""``mujoco_warp``: MuJoCo Warp, all N envs as the worlds of one batched ``Data`` on a Warp device.

The same scene as ``mujoco_cpu`` (``envs.scene.build_scene``: robot MJCF, ground plane or terrain
heightfield, the sensor readout) is moved to the device once (``mujoco_warp.put_model`` /
``put_data(nworld=N)``); every ``RobotState`` field, every reset and push is torch on that device,
sharing memory with Warp's arrays (``wp.to_torch``), so no state crosses to the host per step.

A policy step mirrors ``mujoco_cpu``'s split, so the two backends compute the same quantities:

    step2 (finish the substep begun by the last step1, with the new ctrl)
    step x (decimation - 1)
    step1 (position/velocity stages + their sensors at the new state)

and, as there, the calls before the last ``step`` skip the sensors nobody reads (the same model arrays
under options with MuJoCo's sensor flag off; ``common.without_sensors``).

On a CUDA device that sequence is captured once as a CUDA graph and replayed (one launch per policy
step instead of hundreds of kernel launches); on Warp's CPU device (development, tests) it runs as is.
Every Warp call and the torch work between them run on the backend's own ``torch.cuda.Stream``
(``step_stream``): CUDA cannot capture a graph on the legacy default stream, which is torch's current
stream unless the caller chose another. That stream waits for the caller's stream on entry, and the
caller's stream waits for it on exit, so the caller sees ordinary stream semantics.

Per-world randomisation: the model fields the variant pool changes (friction, masses and the
constants derived from them, actuator gains and force ranges) get a leading world dimension
(``put_model(batch_sizes=...)``) filled with each env's variant, drawn by the same seeded
``envs.scene.make_variants`` as ``mujoco_cpu``: the same seed gives the same per-env parameters.

Buffers: contacts (``nconmax`` per world) and constraint rows (``njmax`` per world) are fixed at
construction. Warp flags a world whose contacts or rows did not fit (``Data.overflow``); this backend
checks the flags after every step and never goes on silently: it raises ``WarpBufferOverflow`` naming
the buffer to enlarge, or (``on_overflow="terminate"``) restores and flags those worlds like diverged
ones. Host synchronisation: one scalar pair per step (the divergence/overflow flags) and one per reset
(the id range and the inputs, checked together); no state is copied to the host.

``mujoco-warp`` is an optional dependency (``pip install quadforge[gpu]``); without it building this
backend is a one-line ``ImportError`` that says so.
"""
from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Callable

import mujoco
import numpy as np
import torch

from quadforge.envs.backends.base import OVERFLOW_POLICIES, RESET_RECOMPUTE, BackendConfig, RobotState, WarpConfig
from quadforge.envs.backends.common import FOOT_CONTACT_FORCE, MAX_ABS_STATE, SceneBackend
from quadforge.layout import NUM_FEET, NUM_JOINTS
from quadforge.envs.scene import TRACKED

INSTALL_HINT = "pip install 'quadforge[gpu]' (or: pip install mujoco-warp==4.0.0)"
# Warp's overflow bits (mujoco_warp.OverflowType) that mean contacts or constraints were dropped. The
# solver's iteration limits (ITERATIONS, LS_ITERATIONS) are not: the step is still a valid, if less
# converged, solution, as in MuJoCo C.
_DROPPING = {"NEFC": "njmax", "NJMAX_NNZ": "njmax", "BROADPHASE": "nconmax", "NARROWPHASE": "nconmax",
             "CCD": "nconmax", "HFIELD": "the heightfield resolution", "CONTACT_MATCH": "contact sensor matches"}
# Model fields make_variants may change, in Warp's names; each is batched per world when it differs.
_VARIANT_FIELDS = ("geom_friction", "body_mass", "body_subtreemass", "body_inertia", "body_invweight0",
                   "dof_invweight0", "actuator_gainprm", "actuator_biasprm", "actuator_forcerange",
                   "actuator_acc0")


class WarpBufferOverflow(RuntimeError):
    """Contacts or constraint rows of some worlds did not fit their per-world buffers."""


def import_warp():
    """``(warp, mujoco_warp)``, or an ImportError that says how to install them."""
    try:
        import warp as wp

        # before anything initialises Warp: no banner, no line per kernel module loaded (warnings stay)
        wp.config.quiet = True
        wp.config.log_level = wp.LOG_WARNING
        import mujoco_warp as mjw
    except ImportError as err:
        raise ImportError(f"backend 'mujoco_warp' needs the optional packages mujoco-warp and warp-lang "
                          f"({err}); install them with: {INSTALL_HINT}") from None
    return wp, mjw


def available() -> bool:
    """Whether mujoco-warp is installed here (tests skip the Warp path when not); imports nothing."""
    from quadforge.envs.backends import backend_spec

    return backend_spec("mujoco_warp").installed()


# Buffer sizing (see measure_contact_load): the settled load measured on the CPU times these margins,
# (contacts, constraint rows). Why: MuJoCo Warp builds its own heightfield contacts per prism, so its
# counts differ from MuJoCo C's for the same pose, and an episode reaches poses the probes do not (a
# stumble, a robot on its knees, a spawn on a stair edge). Contacts are one pool shared by all worlds
# (naconmax = nconmax x nworld), so a world may exceed its share while others are below: 2x the measured
# peak. Constraint rows are a hard per-world limit, so the rare world decides: on an H100 (2026-11-26)
# 2x (150 rows, Go1 on the mixed terrain) held at 4096 worlds but one of 16384 standing robots
# overflowed it within 13 steps, so rows get 3x (225; 5 % more memory per world). An overflow is never
# silent either way (WarpConfig.on_overflow).
BUFFER_SAFETY = (2.0, 3.0)
# The floor of each buffer (contacts, rows): a scene whose probes touch little still gets room for four
# feet on a heightfield prism corner each.
MIN_BUFFERS = (32, 128)
# The probes' settling time: 100 policy steps (2 s), long enough for a dropped robot to come to rest.
PROBE_STEPS = 100


@dataclass(frozen=True)
class ContactLoad:
    """The most contacts and constraint rows one world of a scene held over the probe rollouts."""

    ncon: int
    nefc: int
    probes: int       # rollouts run (spawn points x poses)


def _probe_spawns(scene, k: int) -> np.ndarray:
    """(k', 3) ground points under the probes: the origin on a plane; on a terrain, tile centres spread
    over the levels and columns (the same platforms the env spawns on), k at most."""
    if scene.terrain is None:
        return np.zeros((1, 3))
    origins = scene.terrain.origins.numpy().astype(np.float64)       # (levels, cols, 3)
    rows, cols = origins.shape[:2]
    return np.stack([origins[(i * rows) // k % rows, i % cols] for i in range(min(k, rows * cols))])


def measure_contact_load(scene, decimation: int, num_spawns: int = 8,
                         steps: int = PROBE_STEPS) -> ContactLoad:
    """Contacts and constraint rows of ``scene`` measured with MuJoCo C: from each probe spawn point, a
    robot standing in its default pose under default targets, and one dropped on its side (the sprawled
    worst case: trunk, thighs and calves on the ground), each settled for ``steps`` policy steps of
    ``decimation`` substeps; the maxima over every substep of every rollout."""
    robot = scene.robot
    m = scene.model
    d = mujoco.MjData(m)
    q0 = np.asarray(robot.default_joint_pos, dtype=np.float64)
    adr = [int(m.jnt_qposadr[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, j)]) for j in robot.joint_names]
    act = [int(mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_ACTUATOR, a)) for a in robot.actuator_names]
    side = np.array([np.cos(np.pi / 4), np.sin(np.pi / 4), 0.0, 0.0])       # 90 degrees about x
    poses = ((np.array([1.0, 0.0, 0.0, 0.0]), robot.nominal_base_height + 0.02), (side, 0.3))
    ncon = nefc = probes = 0
    for ground in _probe_spawns(scene, num_spawns):
        for quat, height in poses:
            mujoco.mj_resetData(m, d)
            d.qpos[0:3] = ground + [0.0, 0.0, height]
            d.qpos[3:7] = quat
            d.qpos[adr] = q0
            d.ctrl[act] = q0
            for _ in range(steps * decimation):
                mujoco.mj_step(m, d)
                ncon, nefc = max(ncon, int(d.ncon)), max(nefc, int(d.nefc))
            probes += 1
    return ContactLoad(ncon=ncon, nefc=nefc, probes=probes)


def buffers_for(load: ContactLoad, safety: tuple[float, float] = BUFFER_SAFETY) -> tuple[int, int]:
    """(nconmax, njmax) per world from a measured load: each times its margin in ``safety`` (contacts,
    rows), at least ``MIN_BUFFERS``."""
    if not (len(safety) == 2 and all(f >= 1.0 for f in safety)):
        raise ValueError(f"buffer safety factors (contacts, rows) must both be >= 1, got {safety!r}")
    return (max(MIN_BUFFERS[0], math.ceil(safety[0] * load.ncon)),
            max(MIN_BUFFERS[1], math.ceil(safety[1] * load.nefc)))


# CUDA refuses to capture a graph on the legacy default stream: torch's default stream (handle 0) and the
# special handles cudaStreamLegacy (1) and cudaStreamPerThread (2) ("Warp error: unknown stream").
UNCAPTURABLE_STREAM_HANDLES = (0, 1, 2)


def check_capturable(stream) -> None:
    """RuntimeError unless a CUDA graph can be captured on ``stream`` (anything with ``cuda_stream``)."""
    handle = int(getattr(stream, "cuda_stream", 0) or 0)   # Warp's default-stream wrapper holds None
    if handle in UNCAPTURABLE_STREAM_HANDLES:
        raise RuntimeError(f"mujoco_warp: stream handle {handle:#x} is a default CUDA stream, on which a CUDA "
                           f"graph cannot be captured; the step must run on a stream of its own")


def step_stream(device: torch.device, new_stream: Callable | None = None):
    """The stream the backend runs its physics on: None on the CPU; on a GPU a dedicated stream (never
    torch's current one, which is the legacy default stream unless the caller chose another), checked
    capturable. ``new_stream(device=...)`` makes it (torch.cuda.Stream; a test passes a stand-in)."""
    if torch.device(device).type != "cuda":
        return None
    stream = (new_stream or torch.cuda.Stream)(device=device)
    check_capturable(stream)
    return stream


def _rotate_inverse(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """R(q)^T v for unit wxyz quaternions q (k, 4) and vectors v (k, 3): world -> body frame."""
    w, u = q[:, :1], q[:, 1:]
    return v * (2 * w * w - 1) - 2 * w * torch.cross(u, v, dim=1) + 2 * u * (u * v).sum(1, keepdim=True)


class MujocoWarpBackend(SceneBackend):
    """``envs.backends.base.PhysicsBackend`` on MuJoCo Warp (see the module docstring)."""

    sensors_every_substep = False   # True: every substep computes the sensors (benchmarks, tests)

    def __init__(self, cfg: BackendConfig):
        wcfg: WarpConfig = cfg.warp if cfg.warp is not None else WarpConfig()
        for name, allowed in (("on_overflow", OVERFLOW_POLICIES), ("reset_recompute", RESET_RECOMPUTE + (None,))):
            if getattr(wcfg, name) not in allowed:
                raise ValueError(f"WarpConfig.{name}={getattr(wcfg, name)!r}; allowed: {allowed}")
        for name in ("nconmax", "njmax", "solver_iterations", "ls_iterations"):
            v = getattr(wcfg, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"WarpConfig.{name}={v!r}; allowed: None or an integer >= 1")
        self.check_config(cfg)
        wp, mjw = import_warp()
        self._wp, self._mjw = wp, mjw
        wp.init()
        self.wp_device = self._pick_device(wcfg.device)
        device = torch.device("cuda", self.wp_device.ordinal) if self.wp_device.is_cuda else torch.device("cpu")
        self._setup_scene(cfg, device)
        self._stream = step_stream(self.device)
        self._wp_stream = wp.stream_from_torch(self._stream) if self._stream is not None else None
        self.on_overflow = wcfg.on_overflow
        # None: step1 on a GPU (measured cheaper there), forward on the CPU device (WarpConfig says why)
        self.reset_recompute = wcfg.reset_recompute or ("step1" if self.wp_device.is_cuda else "forward")
        self.num_overflow = 0
        n = self.num_envs
        mjm = copy.deepcopy(self.scene.model)
        # MuJoCo Warp never auto-resets (and rejects the flag): divergence is detected below, as on the CPU
        mjm.opt.disableflags &= ~int(mujoco.mjtDisableBit.mjDSBL_AUTORESET)
        if wcfg.solver_iterations is not None:
            mjm.opt.iterations = wcfg.solver_iterations
        if wcfg.ls_iterations is not None:
            mjm.opt.ls_iterations = wcfg.ls_iterations
        self.mjm = mjm
        self.contact_load = None
        if wcfg.nconmax is None or wcfg.njmax is None:   # measured on the CPU, not guessed (buffers_for)
            self.contact_load = measure_contact_load(self.scene, self.decimation)
            con, rows = buffers_for(self.contact_load)
        self.nconmax = int(wcfg.nconmax or con)
        self.njmax = int(wcfg.njmax or rows)

        with self._scope():
            batched = self._variant_fields(mjm)
            self.m = mjw.put_model(mjm, batch_sizes={f: n for f in batched})
            # report overflows ourselves, once, instead of a printf from every device thread
            self.m.opt.warn_overflow = 0
            self._fill_variants(batched)
            # the substeps whose sensors nobody reads (common.without_sensors) run with the same model
            # arrays under options that skip the sensors: MuJoCo Warp reads the flags on the host
            self._m_quiet = copy.copy(self.m)
            self._m_quiet.opt = copy.copy(self.m.opt)
            self._m_quiet.opt.disableflags = int(self.m.opt.disableflags) | int(mjw.DisableBit.SENSOR)
            # a fresh MjData (no contacts yet: put_data refuses buffers smaller than the host's contacts);
            # the first reset below runs forward on the device
            mjd = mujoco.MjData(mjm)
            self.d = mjw.put_data(mjm, mjd, nworld=n, nconmax=self.nconmax, njmax=self.njmax)
        t = wp.to_torch
        self._qpos, self._qvel, self._ctrl = t(self.d.qpos), t(self.d.qvel), t(self.d.ctrl)
        self._dsens = t(self.d.sensordata)                      # (N, S) float32, Warp's own
        # Warp's step1 zeroes all of sensordata before its position/velocity sensors (MuJoCo C keeps the
        # acceleration-stage ones): the physics saves them after the last substep, before step1
        self._acc_saved_wp = wp.zeros_like(self.d.sensordata)
        self._acc_saved = t(self._acc_saved_wp)
        self._acc_cols = torch.as_tensor(self._acc_columns(mjm), device=self.device)
        self._overflow = t(self.d.overflow)                     # (N,) int32 bitmask
        # task objects (a scene addon's mocap bodies), per world: (N, nmocap, 3) and (N, nmocap, 4) wxyz
        self._mocap_pos, self._mocap_quat = t(self.d.mocap_pos), t(self.d.mocap_quat)
        self._reset_mask = torch.zeros(n, dtype=torch.bool, device=self.device)
        self._reset_mask_wp = wp.from_torch(self._reset_mask, dtype=wp.bool)
        self._dropping_bits = sum(int(getattr(mjw.OverflowType, k)) for k in _DROPPING)

        s = mjm.nsensordata                                      # the robot's sensors, then a scene addon's
        dev = self.device
        self._sens = torch.zeros(n, s, device=dev)             # our readout: the state views it (_allocate_state)
        self._reset_qpos = torch.zeros(n, mjm.nq, device=dev)   # each env's last reset state, to restore
        self._reset_qvel = torch.zeros(n, mjm.nv, device=dev)
        self._reset_ctrl = torch.zeros(n, mjm.nu, device=dev)
        self._reset_sens = torch.zeros(n, s, device=dev)        # the readout right after that reset
        self._qpos_order = torch.as_tensor(self._qpos_order, device=dev)
        self._state = self._allocate_state()
        self._graphs: dict[str, object] = {}   # "step", "reset", "forward": CUDA graphs, captured at first use
        self._use_graph = bool(wcfg.cuda_graph) and self.wp_device.is_cuda
        self._reset_default(torch.arange(n, device=dev))

    # ------------------------------------------------------------------ protocol
    @property
    def state(self) -> RobotState:
        return self._state

    def reset(self, env_ids: torch.Tensor, root_pos_w: torch.Tensor, root_quat_w: torch.Tensor,
              root_lin_vel_w: torch.Tensor, root_ang_vel_w: torch.Tensor,
              joint_pos: torch.Tensor, joint_vel: torch.Tensor) -> None:
        ids = self._ids(env_ids, check=False)    # checked below, with the inputs, in the one host read
        k = ids.numel()
        parts = {"root_pos_w": (root_pos_w, 3), "root_quat_w": (root_quat_w, 4),
                 "root_lin_vel_w": (root_lin_vel_w, 3), "root_ang_vel_w": (root_ang_vel_w, 3),
                 "joint_pos": (joint_pos, NUM_JOINTS), "joint_vel": (joint_vel, NUM_JOINTS)}
        arr = {}
        for name, (value, dim) in parts.items():
            a = torch.as_tensor(value).detach().to(self.device, torch.float32)
            if tuple(a.shape) != (k, dim):
                raise ValueError(f"reset: {name} must have shape ({k}, {dim}) for {k} env ids, got {tuple(a.shape)}")
            arr[name] = a
        quat = arr["root_quat_w"]
        norm = quat.norm(dim=1, keepdim=True)
        # One host sync checks the ids and every input (on a GPU each check's own sync would drain the
        # queue): the ids' range, each input finite (a row-wise check over all of them at once), the
        # quaternions non-zero. Only a failed check spends more, to say which.
        rows = torch.cat(list(arr.values()), dim=1)
        checks = torch.stack([((ids >= 0) & (ids < self.num_envs)).all(), torch.isfinite(rows).all(),
                              (norm >= 1e-9).all()]).tolist() if k else [True, True, True]
        if not all(checks):
            self._reject_reset(ids, arr, checks)
        quat = quat / norm
        qpos = torch.cat([arr["root_pos_w"], quat, arr["joint_pos"][:, self._qpos_order]], dim=1)
        # a free joint's angular velocity lives in the body frame
        qvel = torch.cat([arr["root_lin_vel_w"], _rotate_inverse(quat, arr["root_ang_vel_w"]),
                          arr["joint_vel"][:, self._qpos_order]], dim=1)
        self._reset_qpos[ids] = qpos
        self._reset_qvel[ids] = qvel
        self._reset_ctrl[ids] = arr["joint_pos"]   # actuators are in project joint order (as on the CPU)
        self._reset_mask.zero_()
        self._reset_mask[ids] = True
        self._restore_masked()
        self._reset_sens[ids] = self._sens[ids]

    def step(self, joint_targets: torch.Tensor, during: Callable[[], None] | None = None) -> torch.Tensor:
        if tuple(joint_targets.shape) != (self.num_envs, NUM_JOINTS):
            raise ValueError(f"step: joint_targets must have shape ({self.num_envs}, {NUM_JOINTS}), "
                             f"got {tuple(joint_targets.shape)}")
        self._ctrl.copy_(joint_targets.detach())
        self._physics()
        # the caller's work overlaps the device's (a GPU runs the step asynchronously); state still
        # describes the state before the step until the readout below (the state views it)
        if during is not None:
            during()
        self._sens.copy_(torch.where(self._acc_cols, self._acc_saved, self._dsens))
        kin = self._sens[:, self.scene.sensors.kinematic]
        bad = ~(kin.abs().amax(dim=1) <= MAX_ABS_STATE)         # NaN compares False
        dropped = (self._overflow & self._dropping_bits) != 0
        any_bad, any_dropped = torch.stack([bad.any(), dropped.any()]).tolist()   # the step's one sync
        if any_dropped:
            self.num_overflow += int(dropped.sum())
            if self.on_overflow == "raise":
                raise WarpBufferOverflow(self._overflow_message(dropped))
            bad = bad | dropped
            any_bad = True
        if any_bad:
            self.num_non_finite += int((bad & ~dropped).sum())
            self._reset_mask.copy_(bad)
            self._restore_masked()
            # the restored worlds read exactly their reset readout (as a fresh mj_forward gives on the CPU)
            self._sens.copy_(torch.where(bad[:, None], self._reset_sens, self._sens))
        self._refresh()
        return bad

    def push(self, env_ids: torch.Tensor, delta_lin_vel_w: torch.Tensor) -> None:
        ids = self._ids(env_ids)
        dv = torch.as_tensor(delta_lin_vel_w).detach().to(self.device, torch.float32)
        if tuple(dv.shape) != (ids.numel(), 3):
            raise ValueError(f"push: delta_lin_vel_w must have shape ({ids.numel()}, 3), got {tuple(dv.shape)}")
        self._qvel[ids, 0:3] += dv
        self._reset_mask.zero_()
        self._reset_mask[ids] = True
        # velocity-dependent quantities of the pending substep must see the new velocity
        self._forward_masked()
        self._refresh()

    # ------------------------------------------------------------------ task scenes (optional capabilities)
    def set_mocap(self, env_ids, pos: np.ndarray, quat: np.ndarray | None = None, forward: bool = False) -> None:
        """Place the scene's mocap bodies (task objects) of the given worlds: ``pos`` (k, nmocap, 3),
        ``quat`` (k, nmocap, 4) wxyz or None to keep. ``forward`` recomputes those worlds' derived
        quantities and readout now (after a reset, so the first frame and contacts see the objects);
        otherwise the next step does - the same rule as ``mujoco_cpu``."""
        ids = self._ids(env_ids)
        nm = self.mjm.nmocap
        pos = torch.as_tensor(np.asarray(pos), dtype=torch.float32, device=self.device)
        if tuple(pos.shape) != (ids.numel(), nm, 3):
            raise ValueError(f"set_mocap: pos must have shape ({ids.numel()}, {nm}, 3), got {tuple(pos.shape)}")
        self._mocap_pos[ids] = pos
        if quat is not None:
            q = torch.as_tensor(np.asarray(quat), dtype=torch.float32, device=self.device)
            if tuple(q.shape) != (ids.numel(), nm, 4):
                raise ValueError(f"set_mocap: quat must have shape ({ids.numel()}, {nm}, 4), got {tuple(q.shape)}")
            self._mocap_quat[ids] = q
        if forward:
            self._reset_mask.zero_()
            self._reset_mask[ids] = True
            self._forward_masked()
            self._refresh()

    def sensor_columns(self, cols: slice) -> np.ndarray:
        """(N, k) float64 host copy of the last readout's sensordata columns (e.g. a scene addon's
        sensors): the task rules that read them run on the host."""
        return self._sens[:, cols].to(torch.float64).cpu().numpy()

    def make_camera(self, cfg):
        """A batched camera over the worlds (``envs.backends.warp_camera.WarpCamera``): MuJoCo Warp's
        batch ray-tracing renderer, one call renders every world."""
        from quadforge.envs.backends.warp_camera import WarpCamera

        return WarpCamera(self, cfg)

    def solver_iterations_used(self) -> torch.Tensor:
        """(N,) int: the Newton iterations each world's last physics substep took (``Data.solver_niter``);
        on a GPU the step waits for the largest."""
        return self._wp.to_torch(self.d.solver_niter)

    def memory_per_world(self) -> dict[str, float]:
        """Device bytes per world: ``data`` (every array of Warp's ``Data``, measured here), ``ccd`` (the
        convex-collision workspace MuJoCo Warp allocates in each step for its ``naccdmax`` contact slots:
        EPA polytope vertices, faces, projections and horizon, by its allocation rule) and ``total``."""
        wp = self._wp
        seen, data = set(), 0

        def walk(obj) -> None:
            nonlocal data
            for v in vars(obj).values():
                if isinstance(v, wp.array) and id(v) not in seen:
                    seen.add(id(v))
                    data += v.size * wp.types.type_size_in_bytes(v.dtype)
                elif hasattr(v, "__dataclass_fields__"):
                    walk(v)
        walk(self.d)
        k = int(self.mjm.opt.ccd_iterations)
        slot = (10 + 2 * k) * (12 + 4) + (6 + 5 * k) * (4 + 12 + 4) + 24 * 4   # vec3 12 B, int/float 4 B
        ccd = slot * int(self.d.naccdmax)
        n = self.num_envs
        return {"data": data / n, "ccd": ccd / n, "total": (data + ccd) / n}

    def close(self) -> None:
        self._graphs = {}

    # ------------------------------------------------------------------ internals
    def _pick_device(self, name: str | None):
        wp = self._wp
        if name is None:
            return wp.get_cuda_device(0) if wp.get_cuda_device_count() > 0 else wp.get_device("cpu")
        try:
            return wp.get_device(name)
        except Exception as err:
            have = [str(d) for d in wp.get_devices()]
            raise ValueError(f"WarpConfig.device={name!r} is not available here ({err}); devices: {have}") from None

    @contextlib.contextmanager
    def _scope(self):
        """Warp calls on our device; on a GPU, torch and Warp both on the backend's own step stream,
        ordered after the caller's stream on entry and before it on exit (no cross-stream races)."""
        wp = self._wp
        with wp.ScopedDevice(self.wp_device):
            if self._stream is None:
                yield
                return
            caller = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(caller)          # what the caller queued (targets, resets) comes first
            with torch.cuda.stream(self._stream), wp.ScopedStream(self._wp_stream, sync_enter=False):
                yield
            caller.wait_stream(self._stream)          # the caller's next reads see this step's results

    def _variant_fields(self, mjm: mujoco.MjModel) -> list[str]:
        """The Warp model fields whose value differs between the envs' variants."""
        models = self.variants.models
        if len(models) == 1:
            return []
        out = []
        for name in _VARIANT_FIELDS:
            ref = getattr(mjm, name)
            if any(not np.array_equal(getattr(m, name), ref) for m in models):
                out.append(name)
        # a field make_variants changes that this list misses would silently stay nominal: refuse
        for name in dir(mjm):
            a = getattr(mjm, name, None)
            if name.startswith("_") or not isinstance(a, np.ndarray) or name in out:
                continue
            if name in ("dof_M0",):  # MuJoCo C's own cache, not a MuJoCo Warp model field
                continue
            if any(getattr(m, name).shape == a.shape and not np.array_equal(getattr(m, name), a) for m in models):
                raise NotImplementedError(f"mujoco_warp: the randomisation changes model field {name!r}, "
                                          f"which this backend does not batch per world")
        return out

    def _fill_variants(self, fields: list[str]) -> None:
        models, idx = self.variants.models, self.variants.env_variant
        for name in fields:
            per_variant = np.stack([getattr(m, name) for m in models])            # (V, ...)
            dst = self._wp.to_torch(getattr(self.m, name))                       # (N, ...) per world
            dst.copy_(torch.from_numpy(per_variant[idx].astype(np.float32)).reshape(dst.shape))

    @staticmethod
    def _acc_columns(m: mujoco.MjModel) -> np.ndarray:
        """(S,) bool: the sensordata columns of acceleration-stage sensors (torques, contact forces)."""
        cols = np.zeros(m.nsensordata, dtype=bool)
        for i in range(m.nsensor):
            if m.sensor_needstage[i] == mujoco.mjtStage.mjSTAGE_ACC:
                cols[m.sensor_adr[i]:m.sensor_adr[i] + m.sensor_dim[i]] = True
        return cols

    def _reject_reset(self, ids: torch.Tensor, arr: dict[str, torch.Tensor], checks: list[bool]) -> None:
        """The ValueError of a reset whose fused check failed (``reset``), naming the first bad input."""
        ids_ok, finite_ok, _ = checks
        if not ids_ok:
            self._ids(ids)     # raises, naming the range
        if not finite_ok:
            bad = next(name for name, a in arr.items() if not bool(torch.isfinite(a).all()))
            raise ValueError(f"reset: {bad} holds non-finite values")
        raise ValueError("reset: root_quat_w rows must be non-zero (w, x, y, z) quaternions")

    def _ids(self, env_ids: torch.Tensor, check: bool = True) -> torch.Tensor:
        """env_ids as a flat long tensor on the device; ``check`` reads their range back (a host sync)."""
        ids = torch.as_tensor(env_ids).detach().to(self.device, torch.long).reshape(-1)
        if check and ids.numel():
            lo, hi = torch.stack([ids.min(), ids.max()]).tolist()
            if lo < 0 or hi >= self.num_envs:
                raise ValueError(f"env_ids must lie in [0, {self.num_envs}), got min {lo} max {hi}")
        return ids

    def _run_physics(self) -> None:
        mjw, full = self._mjw, self.m
        quiet = full if self.sensors_every_substep else self._m_quiet
        if self.decimation > 1:   # only the last full step and step1 compute sensors (common.without_sensors)
            mjw.step2(quiet, self.d)
            for _ in range(self.decimation - 2):
                mjw.step(quiet, self.d)
            mjw.step(full, self.d)
        else:
            mjw.step2(full, self.d)
        self._wp.copy(self._acc_saved_wp, self.d.sensordata)
        mjw.step1(full, self.d)

    def _graphed(self, key: str, run: Callable[[], None]) -> None:
        """``run`` (Warp launches only, on arrays that keep their addresses) on the backend's stream. On a
        GPU it becomes a CUDA graph at its first call, replayed after: one launch instead of the hundreds
        of kernel launches (and, for reset_data, the kernel definitions) Python would issue per call. Why
        resets too: at 4096 worlds some world ends its episode nearly every step, so every env step paid
        an uncaptured reset_data + forward. With only the step captured an H100 gave env 77k vs backend
        175k steps/s (Go1 rough, 4096 worlds); with resets captured too, 145k vs 204k (docs/scale.md)."""
        wp = self._wp
        with self._scope():
            if not self._use_graph:
                run()
                return
            graph = self._graphs.get(key)
            if graph is None:
                run()      # loads every kernel module first: a capture cannot compile
                check_capturable(wp.get_stream(self.wp_device))
                with wp.ScopedCapture(device=self.wp_device) as capture:
                    run()
                self._graphs[key] = capture.graph
                return     # a capture records without executing: the uncaptured run was this call's
            wp.capture_launch(graph)

    def _physics(self) -> None:
        self._graphed("step_all_sensors" if self.sensors_every_substep else "step", self._run_physics)

    def _forward_masked(self) -> None:
        """Recompute the derived quantities and readout of the masked worlds; the others keep theirs."""
        mjw, how = self._mjw, self.reset_recompute
        # step1's acceleration-stage sensors come out zero (it clears sensordata first): WarpConfig says so
        self._graphed(how, lambda: getattr(mjw, how)(self.m, self.d))
        # every world was recomputed; an unmasked world's pose/velocity sensors come out the same,
        # its torque/contact sensors must stay those that acted during its last substep
        self._sens.copy_(torch.where(self._reset_mask[:, None], self._dsens, self._sens))

    def _restore_masked(self) -> None:
        """Put the masked worlds into their stored reset state (fresh Data: no warmstart, time 0)."""
        mask = self._reset_mask[:, None]
        self._graphed("reset", lambda: self._mjw.reset_data(self.m, self.d, self._reset_mask_wp))
        self._qpos.copy_(torch.where(mask, self._reset_qpos, self._qpos))
        self._qvel.copy_(torch.where(mask, self._reset_qvel, self._qvel))
        self._ctrl.copy_(torch.where(mask, self._reset_ctrl, self._ctrl))
        self._forward_masked()
        self._refresh()

    def _overflow_message(self, dropped: torch.Tensor) -> str:
        bits = _or_all(self._overflow[dropped])
        kinds = [k for k in _DROPPING if bits & int(getattr(self._mjw.OverflowType, k))]
        fixes = sorted({_DROPPING[k] for k in kinds})
        return (f"mujoco_warp: {int(dropped.sum())} of {self.num_envs} worlds overflowed {'/'.join(kinds)} "
                f"(nconmax={self.nconmax}, njmax={self.njmax} per world): contacts or constraints were "
                f"dropped; raise {' and '.join(fixes)} (WarpConfig / --warp-nconmax, --warp-njmax), or set "
                f"WarpConfig.on_overflow='terminate' to end those episodes instead")

    def _reset_default(self, ids: torch.Tensor) -> None:
        """Standing pose at the origin, above the ground: a valid state before the caller's first reset."""
        self.reset(ids, *(torch.as_tensor(a, dtype=torch.float32) for a in self._default_pose(ids.numel())))

    def _allocate_state(self) -> RobotState:
        """The fields that are plain sensordata columns (poses, velocities, joints, feet) are views of the
        readout ``_sens``, not copies of it: every write to the readout updates them, and a refresh
        launches ten fewer kernels on a GPU (counted in docs/benchmarks.md). They are strided (a row
        steps over the whole readout); the derived fields are tensors of their own."""
        n, dev, s, L = self.num_envs, self.device, self._sens, self.scene.sensors
        z = lambda *shape: torch.zeros(*shape, device=dev)  # noqa: E731
        views = {name: s[:, cols] for name, cols in L.fields().items()}
        return RobotState(
            **views, foot_pos_w=s[:, L.foot_pos].view(n, NUM_FEET, 3), projected_gravity_b=z(n, 3),
            foot_contact=torch.zeros(n, NUM_FEET, dtype=torch.bool, device=dev),
            contact_forces=z(n, len(TRACKED), 3), body_names=TRACKED)

    def _refresh(self) -> None:
        """Compute the derived RobotState fields from the (N, S) readout (same rules as mujoco_cpu); the
        others are views of it (``_allocate_state``)."""
        s, L, st = self._sens, self.scene.sensors, self._state
        torch.neg(s[:, L.up_b], out=st.projected_gravity_b)
        cf = st.contact_forces
        torch.neg(s[:, L.contacts].reshape(-1, len(TRACKED), 3), out=cf)
        cf[:, 5:9] -= cf[:, 9:13]   # the calf body without its foot sphere
        foot = cf[:, 9:13]
        torch.gt((foot * foot).sum(-1), FOOT_CONTACT_FORCE ** 2, out=st.foot_contact)


def _or_all(x: torch.Tensor) -> int:
    out = 0
    for v in x.tolist():
        out |= int(v)
    return out
