"""Commands: the 15-D walk-these-ways vector per env, drawn, resampled, steered by heading, or pinned.

Joystick mode draws (vx, vy, yaw rate) - or a heading whose error becomes the yaw command, legged_gym
style - and fills entries 3.. with the default trot. Gait mode draws every entry from its range, the
(phase, offset, bound) triple from one of the configured gaits. ``command_sampler`` (a callable
``(env_ids, generator) -> (k, 15)``) overrides the draw entirely - collection uses it for skills; with
a sampler set, commands are drawn only at reset (one skill per episode) and heading steering is off.
"""
from __future__ import annotations

import collections
import math
from typing import Callable

import torch

from quadforge.envs.config import COMMAND_LIMITS, GAITS, CommandsConfig, command_outside_limits
from quadforge.envs.fast_paths import numpy_path
from quadforge.envs.rotations import yaw_from_quat
from quadforge.layout import COMMAND_NAMES

_NEVER = 2**62  # a due step no episode reaches
CommandSampler = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
NUM_COMMANDS = len(COMMAND_NAMES)
_IDX = {n: i for i, n in enumerate(COMMAND_NAMES)}


class CommandManager:
    def __init__(self, cfg: CommandsConfig, num_envs: int, dt: float, generator: torch.Generator,
                 device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.gen = generator
        self.commands = torch.zeros(num_envs, NUM_COMMANDS, device=self.device)
        self.heading = torch.zeros(num_envs, device=self.device)
        self.pinned = torch.zeros(num_envs, dtype=torch.bool, device=self.device)
        self.resample_steps = max(1, int(round(cfg.resampling_time / dt)))
        # Resampling clock: per-env due step (pinned envs are due "never"), and on the host every step
        # some env was scheduled for, each once, in order (a due step is always now + resample_steps, and
        # now only grows). Only those steps look for due envs, and no step reads the device to find out
        # whether one is due (on a GPU that read is a sync). A scheduled step may find nobody due (the
        # env was reset or pinned since): a wasted look only.
        self._t = 0
        self.due_at = torch.full((num_envs,), _NEVER, dtype=torch.long, device=self.device)
        self._scheduled: collections.deque[int] = collections.deque()
        self.command_sampler: CommandSampler | None = None
        lo, hi = zip(*(cfg.range(n) for n in COMMAND_NAMES))
        self._lo = torch.tensor(lo, device=self.device)
        self._hi = torch.tensor(hi, device=self.device)
        default = [0.0, 0.0, 0.0] + [cfg.default_gait.get(n, _trot_default(n)) for n in COMMAND_NAMES[3:]]
        self._default = torch.tensor(default, device=self.device)
        self._gaits = torch.tensor([GAITS[g] for g in cfg.gaits] or [GAITS["trot"]], device=self.device)
        self._uses_heading = cfg.mode == "joystick" and cfg.heading_command
        self._yaw_limits = cfg.range("ang_vel_yaw")
        self._yaw_col = self.commands[:, 2]          # a view: the steering writes the yaw command in place
        limits = torch.tensor([COMMAND_LIMITS[n] for n in COMMAND_NAMES], device=self.device)
        self._limit_lo, self._limit_hi = limits[:, 0], limits[:, 1]

    # --- drawing -------------------------------------------------------------------------------------
    def _uniform(self, k: int, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        u = torch.rand(k, lo.numel(), generator=self.gen, device=self.device)
        return lo + (hi - lo) * u

    def draw(self, env_ids: torch.Tensor) -> torch.Tensor:
        """(k, 15) fresh commands for these envs (does not store them)."""
        k = env_ids.numel()
        if self.command_sampler is not None:
            cmd = torch.as_tensor(self.command_sampler(env_ids, self.gen), dtype=torch.float32, device=self.device)
            if cmd.shape != (k, NUM_COMMANDS):
                raise ValueError(f"command_sampler returned shape {tuple(cmd.shape)}; expected ({k}, {NUM_COMMANDS})")
            return cmd
        if self.cfg.mode == "joystick":
            cmd = self._default.expand(k, -1).clone()
            cmd[:, :3] = self._uniform(k, self._lo[:3], self._hi[:3])
        else:
            cmd = self._uniform(k, self._lo, self._hi)
            pick = torch.randint(len(self._gaits), (k,), generator=self.gen, device=self.device)
            cmd[:, _IDX["gait_phase"]:_IDX["gait_bound"] + 1] = self._gaits[pick]
        # legged_gym: tiny xy commands become "stand still" so the policy learns to stop.
        small = cmd[:, :2].norm(dim=1) < self.cfg.small_xy_threshold
        cmd[:, :2] *= (~small).unsqueeze(1)
        return cmd

    def resample(self, env_ids: torch.Tensor) -> None:
        if env_ids.numel() == 0:
            return
        self.commands[env_ids] = self.draw(env_ids)
        if self._uses_heading and self.command_sampler is None:
            lo, hi = self.cfg.heading_range
            self.heading[env_ids] = lo + (hi - lo) * torch.rand(env_ids.numel(), generator=self.gen, device=self.device)
        due = self._t + self.resample_steps
        self.due_at[env_ids] = due
        if not self._scheduled or self._scheduled[-1] != due:
            self._scheduled.append(due)

    # --- episode / step hooks --------------------------------------------------------------------------
    def reset(self, env_ids: torch.Tensor, root_quat_w: torch.Tensor | None = None) -> None:
        """A new episode: unpin and draw; with the spawn orientation (k, 4) the first observation already
        carries the heading-derived yaw command."""
        self.pinned[env_ids] = False
        self.resample(env_ids)
        if root_quat_w is not None and self._uses_heading and self.command_sampler is None:
            self.commands[env_ids, 2] = self._heading_yaw(env_ids, root_quat_w)

    def _heading_yaw(self, env_ids, root_quat_w: torch.Tensor) -> torch.Tensor:
        return yaw_command(torch, self.heading[env_ids], yaw_from_quat(root_quat_w), self.cfg.heading_gain,
                           *self._yaw_limits)

    def set_commands(self, env_ids: torch.Tensor, commands: torch.Tensor) -> None:
        """Fix these envs' commands until their episode ends (no resampling, no heading steering)."""
        commands = torch.as_tensor(commands, dtype=torch.float32, device=self.device)
        if commands.shape != (env_ids.numel(), NUM_COMMANDS):
            raise ValueError(f"set_commands: commands shape {tuple(commands.shape)}; "
                             f"expected ({env_ids.numel()}, {NUM_COMMANDS}) in quadforge.layout.COMMAND_NAMES order")
        # the limits the config's ranges are held to: a typo (vx 30, a NaN) is an error, not a flying robot
        outside = ~((commands >= self._limit_lo) & (commands <= self._limit_hi))
        if outside.any():
            row, col = outside.nonzero()[0].tolist()
            why = command_outside_limits(COMMAND_NAMES[col], commands[row, col].item())
            raise ValueError(f"set_commands: row {row}: {why}")
        self.commands[env_ids] = commands
        self.pinned[env_ids] = True
        self.due_at[env_ids] = _NEVER

    def step(self, root_quat_w: torch.Tensor, yaw: torch.Tensor | None = None) -> torch.Tensor | None:
        """After a physics step: resample the envs that are due, steer yaw towards the heading. ``yaw``:
        the (N,) base yaw of ``root_quat_w`` when the caller has it. Returns that yaw, or the one computed
        for the steering (None when neither exists), so the caller can reuse it while the orientations
        stay unchanged."""
        self._t += 1
        # A command_sampler defines what an episode is asked to do (a skill): it draws only at reset.
        if self._scheduled and self._scheduled[0] <= self._t:
            while self._scheduled and self._scheduled[0] <= self._t:
                self._scheduled.popleft()
            if self.cfg.resample and self.command_sampler is None:
                due = (self.due_at <= self._t).nonzero(as_tuple=False).flatten()
                if due.numel():
                    self.resample(due)
        if self._uses_heading and self.command_sampler is None:
            if yaw is None:
                yaw = yaw_from_quat(root_quat_w)
            buffers = (self.heading, yaw, self._yaw_col, self.pinned)
            args = (self.cfg.heading_gain, *self._yaw_limits)
            # elementwise arithmetic and a selection: the same bits in numpy, faster on the CPU
            if numpy_path(self._steer_reference, buffers, *args) is None:
                self._steer_reference(torch, *buffers, *args)
        return yaw

    @staticmethod
    def _steer_reference(xp, heading, yaw, yaw_col, pinned, gain, lo, hi) -> tuple:
        """The per-step heading steering, written once for torch or numpy (``envs.fast_paths.numpy_path``):
        the yaw command of every unpinned env becomes ``yaw_command(heading, yaw)``, in place."""
        yaw_col[...] = xp.where(pinned, yaw_col, yaw_command(xp, heading, yaw, gain, lo, hi))  # pinned keep theirs
        return ()


def yaw_command(xp, heading, yaw, gain: float, lo: float, hi: float):
    """legged_gym's heading steering, ``gain * wrap_to_pi(heading - yaw)`` clamped to [lo, hi], for torch
    or numpy arrays (``xp``): the same single-rounded float32 operations in either, so the same bits."""
    e = xp.remainder(heading - yaw + math.pi, 2 * math.pi) - math.pi
    return xp.clip(e * gain, lo, hi)


def _trot_default(name: str) -> float:
    from quadforge.envs.config import DEFAULT_GAIT_COMMAND
    return DEFAULT_GAIT_COMMAND[name]
