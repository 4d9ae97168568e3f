"""legged_gym's reward terms as a registry: the readable reference, one function per term.

Each term maps a ``RewardView`` to an (N,) tensor *before* scaling; the manager
(``envs.reward_manager.RewardManager``) multiplies by
``scale * dt`` (legged_gym), clips the total at zero when ``only_positive_rewards`` and adds the
termination term after the clip (as legged_gym does). Zero-scale terms are accepted and skipped; an
unknown term is a construction error listing the known ones.

The manager does not call every registry function: the terms that are sums of squares of a few state
quantities (``envs.rewards_fused.SQUARE_TERMS``: the velocity tracking kernels, the body-rate, torque, joint-velocity,
-acceleration and action-rate penalties, ...) are computed together, one square and one matmul over
their concatenated inputs, because a step's cost at small N is the number of torch calls. The matmul
sums in a different order than ``torch.sum``: those terms agree with the registry functions to float32
rounding (a few ulp, tested), not bit for bit; every other term is its registry function.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from quadforge.envs.fast_paths import numpy_path
from quadforge.envs.observations import TaskView


@dataclass
class RewardView:
    task: TaskView
    dt: float
    tracking_sigma: float
    last_joint_vel: torch.Tensor         # (N, 12) before this step
    terminated: torch.Tensor             # (N,) bool, terminal (not time-out) this step
    feet_first_contact: torch.Tensor     # (N, 4) bool: touchdown this step
    feet_air_time: torch.Tensor          # (N, 4) s in the air before this step's touchdown
    feet_air_time_target: float
    base_height: torch.Tensor            # (N,) m above the terrain
    base_height_target: float
    soft_dof_pos_limits: torch.Tensor    # (12, 2)
    soft_dof_vel_limits: torch.Tensor    # (12,)
    soft_torque_limits: torch.Tensor     # (12,)
    penalized_bodies: torch.Tensor | slice  # indices into state.contact_forces (a slice when consecutive)
    feet_bodies: torch.Tensor | slice       # indices into state.contact_forces
    max_contact_force: float
    # Per-step quantities that the task's episode statistics and terminations compute too; the task
    # passes them in so each is computed once per step. None: the terms compute them themselves.
    lin_vel_err_xy: torch.Tensor | None = None       # (N, 2) v_xy - cmd_xy (body frame)
    yaw_rate_err: torch.Tensor | None = None         # (N,) w_z - cmd_wz
    cmd_speed: torch.Tensor | None = None            # (N,) |cmd_xy|
    vel_err: torch.Tensor | None = None              # (N, 3) (lin_vel_err_xy, yaw_rate_err) as one block
    contact_force_norm: torch.Tensor | None = None   # (N, B) |contact force| per tracked body


def _sq(x: torch.Tensor) -> torch.Tensor:
    return torch.sum(torch.square(x), dim=1)


def _lin_vel_err_xy(v: RewardView) -> torch.Tensor:
    if v.lin_vel_err_xy is not None:
        return v.lin_vel_err_xy
    return v.task.state.root_lin_vel_b[:, :2] - v.task.commands[:, :2]


def _yaw_rate_err(v: RewardView) -> torch.Tensor:
    if v.yaw_rate_err is not None:
        return v.yaw_rate_err
    return v.task.state.root_ang_vel_b[:, 2] - v.task.commands[:, 2]


def _cmd_speed(v: RewardView) -> torch.Tensor:
    return v.cmd_speed if v.cmd_speed is not None else torch.norm(v.task.commands[:, :2], dim=1)


def tracking_lin_vel(v: RewardView) -> torch.Tensor:
    err = _sq(_lin_vel_err_xy(v))  # the sign of the error does not change its square
    return torch.exp(err * (-1.0 / v.tracking_sigma))


def tracking_ang_vel(v: RewardView) -> torch.Tensor:
    return torch.exp(torch.square(_yaw_rate_err(v)) * (-1.0 / v.tracking_sigma))


def lin_vel_z(v: RewardView) -> torch.Tensor:
    return torch.square(v.task.state.root_lin_vel_b[:, 2])


def ang_vel_xy(v: RewardView) -> torch.Tensor:
    return _sq(v.task.state.root_ang_vel_b[:, :2])


def orientation(v: RewardView) -> torch.Tensor:
    return _sq(v.task.state.projected_gravity_b[:, :2])


def torques(v: RewardView) -> torch.Tensor:
    return _sq(v.task.state.joint_torque)


def dof_vel(v: RewardView) -> torch.Tensor:
    return _sq(v.task.state.joint_vel)


def dof_acc(v: RewardView) -> torch.Tensor:
    return _sq((v.last_joint_vel - v.task.state.joint_vel) / v.dt)


def base_height(v: RewardView) -> torch.Tensor:
    return torch.square(v.base_height - v.base_height_target)


def feet_air_time(v: RewardView) -> torch.Tensor:
    # Reward long steps at touchdown, only while asked to move (legged_gym).
    rew = torch.sum((v.feet_air_time - v.feet_air_time_target) * v.feet_first_contact, dim=1)
    return rew * (_cmd_speed(v) > 0.1)


def _force_norm(v: RewardView, idx: torch.Tensor) -> torch.Tensor:
    if v.contact_force_norm is not None:
        return v.contact_force_norm[:, idx]
    return torch.norm(v.task.state.contact_forces[:, idx, :], dim=-1)


def collision(v: RewardView) -> torch.Tensor:
    return torch.sum(_force_norm(v, v.penalized_bodies) > 0.1, dim=1, dtype=torch.float32)  # a count: exact


def feet_stumble(v: RewardView) -> torch.Tensor:
    f = v.task.state.contact_forces[:, v.feet_bodies, :]
    return torch.any(torch.norm(f[..., :2], dim=-1) > 5 * torch.abs(f[..., 2]), dim=1).to(torch.float32)


def feet_contact_forces(v: RewardView) -> torch.Tensor:
    return torch.sum((_force_norm(v, v.feet_bodies) - v.max_contact_force).clamp(min=0.0), dim=1)


def action_rate(v: RewardView) -> torch.Tensor:
    return _sq(v.task.last_actions - v.task.actions)


def stand_still(v: RewardView) -> torch.Tensor:
    moving = _cmd_speed(v) < 0.1
    return torch.sum(torch.abs(v.task.state.joint_pos - v.task.default_joint_pos), dim=1) * moving


def dof_pos_limits(v: RewardView) -> torch.Tensor:
    q = v.task.state.joint_pos
    lo, hi = v.soft_dof_pos_limits.unbind(1)
    below = (lo - q).clamp(min=0.0)
    above = (q - hi).clamp(min=0.0)
    return torch.sum(below + above, dim=1)


def dof_vel_limits(v: RewardView) -> torch.Tensor:
    excess = torch.abs(v.task.state.joint_vel) - v.soft_dof_vel_limits
    return torch.sum(excess.clamp(min=0.0, max=1.0), dim=1)


def torque_limits(v: RewardView) -> torch.Tensor:
    return torch.sum((torch.abs(v.task.state.joint_torque) - v.soft_torque_limits).clamp(min=0.0), dim=1)


def termination(v: RewardView) -> torch.Tensor:
    return v.terminated.to(torch.float32)



REWARD_TERMS: dict[str, Callable[[RewardView], torch.Tensor]] = {f.__name__: f for f in (
    tracking_lin_vel, tracking_ang_vel, lin_vel_z, ang_vel_xy, orientation, torques, dof_vel, dof_acc,
    base_height, feet_air_time, collision, feet_stumble, feet_contact_forces, action_rate, stand_still,
    dof_pos_limits, dof_vel_limits, torque_limits, termination,
)}


class FeetAirTime:
    """legged_gym's air-time bookkeeping, with its contact filter (MuJoCo contacts flicker on rough
    ground too): a touchdown is the first filtered contact after time in the air."""

    def __init__(self, num_envs: int, device: torch.device | str):
        self.air_time = torch.zeros(num_envs, 4, device=device)
        self.last_contact = torch.zeros(num_envs, 4, dtype=torch.bool, device=device)

    def update(self, contact: torch.Tensor, dt: float) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (first_contact (N, 4) bool, air time (N, 4) s including this step; the caller may keep it)."""
        buffers = (self.air_time, self.last_contact, contact)
        # bool logic and one float add: the same bits in either library; numpy is faster on the CPU
        fast = numpy_path(self._update, buffers, np.float32(dt))
        return fast if fast is not None else self._update(torch, *buffers, dt)

    @staticmethod
    def _update(xp, air_time, last_contact, contact, dt):
        """The reference: ``xp`` is torch, or numpy on the CPU (``envs.fast_paths.numpy_path``)."""
        filt = contact | last_contact
        last_contact[...] = contact
        first = (air_time > 0) & filt
        air = air_time + dt
        xp.multiply(air, ~filt, out=air_time)  # the clock restarts on (filtered) contact
        return first, air

    def reset(self, env_ids: torch.Tensor) -> None:
        self.air_time[env_ids] = 0.0
        self.last_contact[env_ids] = False
