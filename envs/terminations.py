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
        # one body (the base, by default): a column view, no gather and no any() over one column
        self._one_body = int(self.contact_idx[0]) if self.contact_idx.numel() == 1 else None
        self._gravity_z: tuple[torch.Tensor, torch.Tensor] | None = None  # (buffer, its z column view)

    def compute(self, state: RobotState, base_height: torch.Tensor, non_finite: torch.Tensor,
                time_out: torch.Tensor, contact_force_norm: torch.Tensor | None = None) -> torch.Tensor:
        """(N,) int64 reason codes (0 = none). ``contact_force_norm`` (N, B): |contact force| of every
        tracked body when the caller has it already (the rewards use it too)."""
        # later codes override earlier ones (priority); torch.where keeps it free of host syncs
        reason = time_out.long()  # TIME_OUT == 1
        fall = (self._gz(state.projected_gravity_b) > self.cfg.max_gravity_z) | (base_height < self.min_height)
        reason = torch.where(fall, FALL, reason)
        if self.contact_idx.numel():
            if contact_force_norm is None:
                contact_force_norm = torch.norm(state.contact_forces, dim=-1)
            if self._one_body is not None:
                hit = contact_force_norm[:, self._one_body] > self.cfg.contact_force
            else:
                hit = torch.any(contact_force_norm[:, self.contact_idx] > self.cfg.contact_force, dim=1)
            reason = torch.where(hit, BASE_COLLISION, reason)
        return torch.where(non_finite, NON_FINITE, reason)

    def _gz(self, gravity: torch.Tensor) -> torch.Tensor:
        """The z column of the projected gravity; a persistent (backend) buffer keeps its view."""
        if self._gravity_z is None or self._gravity_z[0] is not gravity:
            self._gravity_z = (gravity, gravity[:, 2])
        return self._gravity_z[1]
