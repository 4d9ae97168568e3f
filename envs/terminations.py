"""Why an episode ended, as an int code per env into ``TERMINATION_REASONS``.

Priority when several hold at once: non_finite > base_collision > fall > time_out. A time-out is not a
terminal state (rsl_rl bootstraps through it via ``extras["time_outs"]``); the others are.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from quadforge.envs.backends.base import RobotState
from quadforge.envs.config import TerminationsConfig
from quadforge.envs.fast_paths import numpy_path
from quadforge.envs.view_cache import ViewCache

# "task_end": a task's own rule ended the episode (QUARD tasks: success, wrong target, obstacle
# collision; the task's outcome says which). Locomotion never emits it.
TERMINATION_REASONS = ("none", "time_out", "fall", "base_collision", "non_finite", "task_end")
NONE, TIME_OUT, FALL, BASE_COLLISION, NON_FINITE, TASK_END = range(len(TERMINATION_REASONS))


class Outcome(NamedTuple):
    reason: torch.Tensor       # (N,) int64 code into TERMINATION_REASONS
    terminated: torch.Tensor   # (N,) bool: a terminal state (not a time-out)
    dones: torch.Tensor        # (N,) bool: the episode ended (any reason)
    time_outs: torch.Tensor    # (N,) bool: ended by the time limit alone


def contact_body_indices(body_names: tuple[str, ...], names: tuple[str, ...], what: str) -> torch.Tensor:
    """Indices of the tracked bodies whose name equals, or ends with ``_<name>``, one of ``names``."""
    idx = [i for i, b in enumerate(body_names) if any(b == n or b.endswith("_" + n) for n in names)]
    if names and not idx:
        raise ValueError(f"{what}={names!r} matches none of the backend's tracked bodies {body_names}")
    return torch.tensor(idx, dtype=torch.long)


class Terminations:
    def __init__(self, cfg: TerminationsConfig, nominal_base_height: float, body_names: tuple[str, ...],
                 device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.min_height = cfg.min_base_height * nominal_base_height
        self.contact_idx = contact_body_indices(body_names, cfg.contact_bodies, "terminations.contact_bodies").to(device)
        # one body (the base, by default): a column view, no gather and no any() over one column
        self._one_body = int(self.contact_idx[0]) if self.contact_idx.numel() == 1 else None
        self._gz = ViewCache(lambda gravity: gravity[:, 2])  # z of the (backend's) projected gravity
        self._contact_idx_np = self.contact_idx.cpu().numpy()

    def compute(self, state: RobotState, base_height: torch.Tensor, non_finite: torch.Tensor,
                time_out: torch.Tensor, contact_force_norm: torch.Tensor | None = None) -> torch.Tensor:
        """(N,) int64 reason codes (0 = none). ``contact_force_norm`` (N, B): |contact force| of every
        tracked body when the caller has it already (the rewards use it too)."""
        return self.outcome(state, base_height, non_finite, time_out, contact_force_norm).reason

    def outcome(self, state: RobotState, base_height: torch.Tensor, non_finite: torch.Tensor,
                time_out: torch.Tensor, contact_force_norm: torch.Tensor | None = None) -> "Outcome":
        """The reason codes and the (N,) bool masks the step returns, from the same inputs as ``compute``."""
        force = None
        if self.contact_idx.numel():
            force = (contact_force_norm if contact_force_norm is not None
                     else torch.linalg.vector_norm(state.contact_forces, dim=-1))
        gz = self._gz(state.projected_gravity_b)
        args = (gz, base_height, non_finite, time_out, force)
        # comparisons and selections: the same result in either library; numpy is faster on the CPU
        fast = numpy_path(self._outcome, args)
        return Outcome(*(fast if fast is not None else self._outcome(torch, *args)))

    def _outcome(self, xp, gz, base_height, non_finite, time_out, force) -> tuple:
        """The reference: ``xp`` is torch, or numpy on the CPU (``envs.fast_paths.numpy_path``)."""
        # later codes override earlier ones (priority); where() keeps it free of host syncs
        reason = xp.where(time_out, TIME_OUT, NONE)
        reason = xp.where((gz > self.cfg.max_gravity_z) | (base_height < self.min_height), FALL, reason)
        if force is not None:
            if self._one_body is not None:
                hit = force[:, self._one_body] > self.cfg.contact_force
            else:
                idx = self.contact_idx if xp is torch else self._contact_idx_np
                hit = (force[:, idx] > self.cfg.contact_force).any(1)
            reason = xp.where(hit, BASE_COLLISION, reason)
        reason = xp.where(non_finite, NON_FINITE, reason)
        return reason, reason > TIME_OUT, reason != NONE, reason == TIME_OUT
