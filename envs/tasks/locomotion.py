"""The locomotion task: command tracking over terrain. It composes commands, the gait clock, the reward
registry, terminations and the per-episode statistics; ``LeggedEnv`` owns the physics and the rsl_rl
plumbing and calls ``post_step`` after every physics step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from quadforge.envs.backends.base import RobotState
from quadforge.envs.commands import CommandManager
from quadforge.envs.config import EnvConfig
from quadforge.layout import COMMAND_NAMES
from quadforge.envs.observations import TaskView
from quadforge.envs.reward_manager import RewardManager
from quadforge.envs.rewards import FeetAirTime, RewardView
from quadforge.envs.terminations import Terminations, contact_body_indices
from quadforge.envs.view_cache import ViewCache
from quadforge.tensors import check_compiler, into

_FREQ = COMMAND_NAMES.index("gait_frequency")


def _as_slice(idx: torch.Tensor) -> torch.Tensor | slice:
    """Body indices as a slice when they are a non-empty consecutive run (a view, not a gather)."""
    i = idx.tolist()
    return slice(i[0], i[-1] + 1) if i and i == list(range(i[0], i[-1] + 1)) else idx


class _ScratchViews(NamedTuple):
    """The column views of the command and scratch buffers that a step reads and writes."""
    cmd_xy: torch.Tensor
    cmd_yaw_rate: torch.Tensor
    gait_frequency: torch.Tensor
    v_err: torch.Tensor          # (N, 2) of the (N, 3) velocity errors
    w_err: torch.Tensor          # (N,)
    vx_and_w_err: torch.Tensor   # (N, 2): columns 0 and 2
    cmd_dist: torch.Tensor       # (N,) columns of the (N, 4) statistics
    v_norm: torch.Tensor
    abs_err: torch.Tensor        # (N, 2)

    @classmethod
    def of(cls, commands: torch.Tensor, vel_err: torch.Tensor, stats: torch.Tensor) -> "_ScratchViews":
        return cls(commands[:, :2], commands[:, 2], commands[:, _FREQ], vel_err[:, :2], vel_err[:, 2],
                   vel_err[:, 0::2], stats[:, 0], stats[:, 1], stats[:, 2:4])


@dataclass
class StepResult:
    rewards: torch.Tensor        # (N,)
    reason: torch.Tensor         # (N,) int64 code into TERMINATION_REASONS, 0 = still running
    dones: torch.Tensor          # (N,) bool
    time_outs: torch.Tensor      # (N,) bool


class LocomotionTask:
    def __init__(self, cfg: EnvConfig, robot, body_names: tuple[str, ...], dt: float,
                 gen: torch.Generator, device: torch.device):
        n = cfg.num_envs
        self.cfg, self.robot, self.dt, self.device, self.num_envs = cfg, robot, dt, device, n
        self.commands = CommandManager(cfg.commands, n, dt, gen, device)
        self.gait_time = torch.zeros(n, device=device)
        self.air = FeetAirTime(n, device)
        rc = cfg.rewards
        self.rewards = RewardManager(rc.scales, dt, n, rc.only_positive_rewards, device)
        self.terminations = Terminations(cfg.terminations, robot.nominal_base_height, body_names, device)
        self.penalized = _as_slice(contact_body_indices(body_names, rc.penalized_contact_bodies,
                                                        "rewards.penalized_contact_bodies").to(device))
        feet = [i for i, b in enumerate(body_names) if b.endswith("_foot")]
        self.feet_bodies = _as_slice((torch.tensor(feet, dtype=torch.long) if feet else
                                      contact_body_indices(body_names, ("calf",), "feet bodies")).to(device))
        self.default_joint_pos = torch.tensor(robot.default_joint_pos, device=device)
        rng = torch.tensor(robot.joint_ranges, device=device)
        mid, half = rng.mean(dim=1), (rng[:, 1] - rng[:, 0]) / 2 * rc.soft_dof_pos_limit
        self.soft_pos = torch.stack((mid - half, mid + half), dim=1)
        self.soft_vel = torch.tensor(robot.velocity_limits, device=device) * rc.soft_dof_vel_limit
        self.soft_torque = torch.tensor(robot.torque_limits, device=device) * rc.soft_torque_limit
        self.base_height_target = (rc.base_height_target if rc.base_height_target is not None
                                   else robot.nominal_base_height)
        # per-episode accumulators; the four per-step error sums share one (N, 4) block (one add a step)
        self.ep_steps = torch.zeros(n, dtype=torch.long, device=device)
        self.ep_return = torch.zeros(n, device=device)
        self._ep_sums = torch.zeros(n, 4, device=device)
        self.ep_cmd_dist, self.ep_lin_err, self.ep_lin_x_err, self.ep_ang_err = self._ep_sums.unbind(1)
        self.start_xy = torch.zeros(n, 2, device=device)
        self.yaw: torch.Tensor | None = None  # (N,) base yaw after the last step, when the commands computed it
        # one |force| per tracked body a step serves the contact termination and the contact rewards
        self._needs_force_norm = bool(self.terminations.contact_idx.numel()) or any(
            t in self.rewards.scales for t in ("collision", "feet_contact_forces"))
        # per-step scratch: velocity errors (v_x, v_y, w_z) - commands, |cmd_xy|, the four statistics
        self._vel_err = torch.zeros(n, 3, device=device)
        self._cmd_speed = torch.zeros(n, device=device)
        self._stats = torch.zeros(n, 4, device=device)
        # column views read every step (a slice is a torch call each), made once: of the command buffer and
        # the scratch buffers, both updated in place and never replaced
        self._views = _ScratchViews.of(self.commands.commands, self._vel_err, self._stats)
        self._lin_vel_xy = ViewCache(lambda lin_vel_b: lin_vel_b[:, :2])
        self._yaw_rate = ViewCache(lambda ang_vel_b: ang_vel_b[:, 2])
        self._before_done = False
        self._score = self.score

    def view(self, state: RobotState, actions, last_actions, env_params, terrain_height, flat,
             yaw: torch.Tensor | None = None) -> TaskView:
        return TaskView(state=state, default_joint_pos=self.default_joint_pos, commands=self.commands.commands,
                        actions=actions, last_actions=last_actions, gait_time=self.gait_time,
                        env_params=env_params, terrain_height=terrain_height, flat=flat, yaw=yaw)

    def reset(self, env_ids: torch.Tensor, root_pos_w: torch.Tensor, root_quat_w: torch.Tensor) -> None:
        self.commands.reset(env_ids, root_quat_w)
        self.gait_time[env_ids] = 0.0
        self.air.reset(env_ids)
        self.ep_steps[env_ids] = 0
        self.ep_return[env_ids] = 0.0
        self._ep_sums[env_ids] = 0.0
        self.start_xy[env_ids] = root_pos_w[:, :2]

    def before_physics(self) -> None:
        """What ``post_step`` needs that only the commands decide (they change only in ``post_step`` and
        at resets): the LeggedEnv calls it while the backend simulates, before each ``post_step``."""
        cmd_speed = torch.linalg.vector_norm(self._views.cmd_xy, dim=1, out=self._cmd_speed)
        torch.mul(cmd_speed, self.dt, out=self._views.cmd_dist)
        self.ep_steps += 1
        self._before_done = True

    def post_step(self, view: TaskView, base_height: torch.Tensor, last_joint_vel: torch.Tensor,
                  non_finite: torch.Tensor, time_out: torch.Tensor) -> StepResult:
        if not self._before_done:  # a caller that does not overlap it with the physics
            self.before_physics()
        self._before_done = False
        rewards, reason, dones, time_outs = self._score(view, base_height, last_joint_vel, non_finite, time_out)
        # The commands that were in force during this step scored it; update them afterwards (host-side
        # resampling schedule: outside a compiled score).
        self.yaw = self.commands.step(view.state.root_quat_w, view.yaw)
        return StepResult(rewards=rewards, reason=reason, dones=dones, time_outs=time_outs)

    def compile_score(self) -> None:
        """Run ``score`` through ``torch.compile`` from now on (``EnvConfig.compile_task``). Its Python
        per step shrinks to the compiled call's guards and launch; the arithmetic is fused, so the results
        equal the eager step's within float rounding (tests/envs/test_compile_task.py). Without the
        device's kernel compiler (C++ on the CPU, Triton on a GPU) a clear error now, not a cryptic one at
        the first step."""
        check_compiler("EnvConfig.compile_task=True", self.device)
        self.rewards.prepare(self.cfg.rewards.tracking_sigma)
        self._score = torch.compile(self.score, dynamic=False, options={"size_asserts": False})

    def score(self, view: TaskView, base_height: torch.Tensor, last_joint_vel: torch.Tensor,
              non_finite: torch.Tensor, time_out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step's rewards and terminations, the episode statistics and the gait clock: (rewards,
        reason, dones, time_outs). Tensor arithmetic only, so ``torch.compile`` traces it whole."""
        s = view.state
        # Quantities the statistics, terminations and rewards share, computed once, into reused buffers.
        # Compiled, the views are traced afresh: views of one buffer handed in as separate inputs, some
        # written, would make torch.compile rebuild their common base on every call.
        cv = (_ScratchViews.of(self.commands.commands, self._vel_err, self._stats) if torch.compiler.is_compiling()
              else self._views)
        cmd_speed, v_err, w_err = self._cmd_speed, cv.v_err, cv.w_err
        into(torch.sub, self._lin_vel_xy(s.root_lin_vel_b), cv.cmd_xy, out=v_err)
        into(torch.sub, self._yaw_rate(s.root_ang_vel_b), cv.cmd_yaw_rate, out=w_err)
        force_norm = torch.linalg.vector_norm(s.contact_forces, dim=-1) if self._needs_force_norm else None  # (N, B)
        # statistics columns: commanded distance (before_physics), |v_xy err|, |v_x err|, |w_z err|
        into(torch.linalg.vector_norm, v_err, dim=1, out=cv.v_norm)
        into(torch.abs, cv.vx_and_w_err, out=cv.abs_err)
        self._ep_sums += self._stats

        ends = self.terminations.outcome(s, base_height, non_finite, time_out, force_norm)
        terminated = ends.terminated
        first, air = self.air.update(s.foot_contact, self.dt)
        rview = RewardView(
            task=view, dt=self.dt, tracking_sigma=self.cfg.rewards.tracking_sigma, last_joint_vel=last_joint_vel,
            terminated=terminated, feet_first_contact=first, feet_air_time=air,
            feet_air_time_target=self.cfg.rewards.feet_air_time_target, base_height=base_height,
            base_height_target=self.base_height_target, soft_dof_pos_limits=self.soft_pos,
            soft_dof_vel_limits=self.soft_vel, soft_torque_limits=self.soft_torque,
            penalized_bodies=self.penalized, feet_bodies=self.feet_bodies,
            max_contact_force=self.cfg.rewards.max_contact_force, lin_vel_err_xy=v_err, yaw_rate_err=w_err,
            vel_err=self._vel_err,
            cmd_speed=cmd_speed, contact_force_norm=force_norm)
        rew = self.rewards.compute(rview).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)  # a fresh (N,) total
        self.ep_return += rew

        # Advance the gait clock at the commanded frequency (walk-these-ways).
        # in place: a buffer the step replaced would be an inference tensor under rsl_rl's
        # ``torch.inference_mode``, which a reset outside that mode could not write
        torch.remainder(self.gait_time + cv.gait_frequency * self.dt, 1.0, out=self.gait_time)
        return rew, ends.reason, ends.dones, ends.time_outs

    def asked_distance(self, env_ids: torch.Tensor, commanded_distance: torch.Tensor,
                       max_episode_length: int) -> torch.Tensor:
        """What the commands ask for over a whole episode, for the curriculum's demotion: the commanded
        distance walked so far (``commanded_distance``, ∫|cmd_xy| dt) plus the last command's speed over
        the steps an episode that ended early did not run. legged_gym takes |cmd_xy| x the episode length,
        so a robot that falls goes down a level; the integral alone let one that fell after a second at
        its commanded speed keep its level. An episode that ran its full length asks its integral."""
        missed = (max_episode_length - self.ep_steps[env_ids]).clamp(min=0).to(commanded_distance.dtype)
        return commanded_distance + self._cmd_speed[env_ids] * missed * self.dt

    def episode_info(self, env_ids: torch.Tensor, reason: torch.Tensor, root_pos_w: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-episode statistics of the given (ending) envs, as (k,) tensors."""
        steps = self.ep_steps[env_ids].clamp(min=1).to(torch.float32)
        return {
            "termination_reason": reason[env_ids],
            "length": self.ep_steps[env_ids].clone(),
            "return": self.ep_return[env_ids].clone(),
            "distance": (root_pos_w[env_ids, :2] - self.start_xy[env_ids]).norm(dim=1),
            "commanded_distance": self.ep_cmd_dist[env_ids].clone(),
            "lin_vel_error": self.ep_lin_err[env_ids] / steps,
            "lin_vel_x_error": self.ep_lin_x_err[env_ids] / steps,
            "ang_vel_error": self.ep_ang_err[env_ids] / steps,
        }
