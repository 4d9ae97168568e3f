"""Why an episode ended, as an int code per env into ``TERMINATION_REASONS``.

Priority when several hold at once: non_finite > base_collision > fall > time_out. A time-out is not a
terminal state (rsl_rl bootstraps through it via ``extras["time_outs"]``); the others are.
"""
from __future__ import annotations

import torch

from envs.backends.base import RobotState
from envs.config import TerminationsConfig

TERMINATION_REASONS = ("none", "time_out", "fall", "base_collision", "non_finite")
REASON_CODE = {name: i for i, name in enumerate(TERMINATION_REASONS)}
NONE, TIME_OUT, FALL, BASE_COLLISION, NON_FINITE = range(len(TERMINATION_REASONS))


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

    def compute(self, state: RobotState, base_height: torch.Tensor, non_finite: torch.Tensor,
                time_out: torch.Tensor, contact_force_norm: torch.Tensor | None = None) -> torch.Tensor:
        """(N,) int64 reason codes (0 = none). ``contact_force_norm`` (N, B): |contact force| of every
        tracked body when the caller has it already (the rewards use it too)."""
        # later codes override earlier ones (priority); torch.where keeps it free of host syncs
        reason = time_out.long()  # TIME_OUT == 1
        fall = (state.projected_gravity_b[:, 2] > self.cfg.max_gravity_z) | (base_height < self.min_height)
        reason = torch.where(fall, FALL, reason)
        if self.contact_idx.numel():
            f = (contact_force_norm[:, self.contact_idx] if contact_force_norm is not None
                 else torch.norm(state.contact_forces[:, self.contact_idx, :], dim=-1))
            reason = torch.where(torch.any(f > self.cfg.contact_force, dim=1), BASE_COLLISION, reason)
        return torch.where(non_finite, NON_FINITE, reason)
