"""The physics-backend protocol: everything above it is batched torch over N environments.

A backend owns the physics of N robots on one terrain. It is stepped with joint *position targets*
(radians, absolute) for ``decimation`` physics substeps under a PD law with torque limits, and hands
back the batched state as torch tensors (``RobotState``). ``mujoco_cpu`` is the embedded default; a
MuJoCo Warp backend (thousands of worlds on one GPU) or an Isaac Gym adapter implements the same
protocol with tensors living on the GPU.

Conventions: quaternions are (w, x, y, z); "_w" is the world frame, "_b" the base (body) frame; joint
order is ``quadforge.layout.JOINT_NAMES``; foot order is ``quadforge.layout.LEGS``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import torch


@dataclass
class RandomizationConfig:
    """Per-env physics parameters drawn at construction (a pool of model variants)."""

    friction_range: tuple[float, float] | None = (0.5, 1.25)   # legged_gym
    added_mass_range: tuple[float, float] | None = (-1.0, 1.0)  # kg on the base
    motor_strength_range: tuple[float, float] | None = (0.9, 1.1)  # scales Kp, Kd and torque limits
    num_variants: int = 8  # size of the model-variant pool envs are spread over


OVERFLOW_POLICIES = ("raise", "terminate")
RESET_RECOMPUTE = ("forward", "step1")   # WarpConfig.reset_recompute: MuJoCo Warp's functions by name


@dataclass
class WarpConfig:
    """Options of the ``mujoco_warp`` backend (ignored by the others)."""

    device: str | None = None        # a Warp device ("cuda:0", "cpu"); None -> the first CUDA GPU, else "cpu"
    # Per-world contact and constraint-row buffers. None measures them: a settled MuJoCo C rollout of
    # the same scene times a safety margin (envs.backends.mujoco_warp.measure_contact_load, buffers_for).
    nconmax: int | None = None
    njmax: int | None = None
    # A world whose contacts or constraint rows did not fit lost contacts during that step: "raise" stops
    # with an error naming the buffer to enlarge; "terminate" restores those worlds, flags them in
    # step()'s mask (the env ends their episodes) and counts them in backend.num_overflow.
    on_overflow: str = "raise"
    cuda_graph: bool = True          # capture one policy step as a CUDA graph (GPU only)
    # The constraint solver's budget: Newton iterations and line-search iterations per physics step.
    # None keeps the scene's (MuJoCo's defaults, 100 and 50). On a GPU every world of a batch waits for
    # the slowest to converge (one graph-conditional loop for all worlds), so a cap bounds the step's
    # cost; mjlab's velocity tasks use 10 and 20.
    solver_iterations: int | None = None
    ls_iterations: int | None = None
    # What a reset recomputes for the reset worlds' readout. "forward": MuJoCo's whole forward pass, as
    # mujoco_cpu's mj_forward (every sensor; collision and the constraint solve of every world included).
    # "step1": the position and velocity stages only (kinematics, collision, pose and velocity sensors);
    # the reset worlds' acceleration-stage readouts (contact forces, joint torques) read zero until their
    # next step. The next step's physics is the same either way (its step2 recomputes what forward would
    # have). None picks by device: "step1" on a GPU, where an H100 measured the reset's forward of every
    # world at 4.0 ms of a 28 ms env step at 4096 worlds against 2.3 ms for step1 (env 144k -> 162k
    # steps/s, PPO's iteration 0.76 -> 0.60 s; docs/scale.md); "forward" on Warp's CPU device, whose
    # readout then equals mujoco_cpu's mj_forward at a reset (tests, development).
    reset_recompute: str | None = None


@dataclass
class BackendConfig:
    robot: str = "go1"
    num_envs: int = 16
    sim_dt: float = 0.005
    decimation: int = 4
    num_threads: int | None = None   # None -> os.cpu_count()
    seed: int = 0
    randomization: RandomizationConfig | None = None  # None -> nominal physics in every env
    # terrain: an envs.terrain.TerrainConfig, or None for a flat plane
    terrain: object | None = None
    # scene_addon: adds task objects (and their sensors) to the scene, e.g. envs.quard.objects.ObjectLibrary;
    # an object with ``add_to(spec, first_sensor) -> dict[str, slice]`` (its sensordata columns by name)
    scene_addon: object | None = None
    warp: WarpConfig = field(default_factory=WarpConfig)


@dataclass
class RobotState:
    """Batched robot state after the last step/reset (all tensors on the backend's device)."""

    root_pos_w: torch.Tensor        # (N, 3)
    root_quat_w: torch.Tensor       # (N, 4) wxyz
    root_lin_vel_w: torch.Tensor    # (N, 3)
    root_ang_vel_w: torch.Tensor    # (N, 3)
    root_lin_vel_b: torch.Tensor    # (N, 3)
    root_ang_vel_b: torch.Tensor    # (N, 3)
    projected_gravity_b: torch.Tensor  # (N, 3)
    joint_pos: torch.Tensor         # (N, 12) absolute, rad
    joint_vel: torch.Tensor         # (N, 12) rad/s
    joint_torque: torch.Tensor      # (N, 12) N·m actually applied (after limits)
    foot_pos_w: torch.Tensor        # (N, 4, 3)
    foot_contact: torch.Tensor      # (N, 4) bool
    contact_forces: torch.Tensor    # (N, num_bodies, 3) world-frame contact force on each tracked body
    body_names: tuple[str, ...] = field(default=())  # names of the tracked bodies, in order


@runtime_checkable
class PhysicsBackend(Protocol):
    num_envs: int
    num_joints: int
    device: torch.device
    sim_dt: float
    decimation: int

    @property
    def state(self) -> RobotState: ...

    @property
    def env_params(self) -> dict[str, torch.Tensor]:
        """Per-env physics parameters (friction (N,), added_mass (N,), motor_strength (N,))."""

    def reset(self, env_ids: torch.Tensor, root_pos_w: torch.Tensor, root_quat_w: torch.Tensor,
              root_lin_vel_w: torch.Tensor, root_ang_vel_w: torch.Tensor,
              joint_pos: torch.Tensor, joint_vel: torch.Tensor) -> None:
        """Put the given envs into the given states (k rows each) and refresh ``state``."""

    def step(self, joint_targets: torch.Tensor, during: Callable[[], None] | None = None) -> torch.Tensor:
        """Advance every env by ``decimation`` substeps towards (N, 12) targets.

        Returns an (N,) bool mask of envs whose physics went non-finite during this step; those envs
        have already been restored to a finite state (their last reset state) and must be terminated by
        the caller. Never propagates NaN into ``state``.

        ``during`` (optional): the caller's work that does not depend on this step's physics. It runs on
        the caller's thread exactly once before ``step`` returns - a threaded backend runs it while its
        workers still simulate - and may read ``state``, which still describes the state before the
        step; it must not call the backend."""

    def push(self, env_ids: torch.Tensor, delta_lin_vel_w: torch.Tensor) -> None:
        """Add a velocity impulse to the base of the given envs (domain randomization pushes)."""

    def terrain_height(self, xy_w: torch.Tensor) -> torch.Tensor:
        """Terrain height (m) under world points (..., 2) -> (...)."""

    def close(self) -> None: ...
