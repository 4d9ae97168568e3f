"""Batched leg kinematics of a quadruped in its base frame (torch, any batch shape).

Each leg: an abduction joint about x at ``hip_offsets[leg]``, a thigh joint about y offset by
``side * abduction_length`` along y, a knee (calf) joint about y ``thigh_length`` below it, and the
foot-sphere centre ``calf_length`` below the knee. With the thigh angle q1 and knee q2 the foot in the
(unabducted) leg frame is

    x = -l1 sin q1 - l2 sin(q1 + q2),   y = side * a,   z = -l1 cos q1 - l2 cos(q1 + q2)

and the abduction rotates (y, z) by q0 about x. The inverse picks the knee-backward branch (q2 < 0,
as Unitree's knee ranges require), keeps the foot below the hip, clamps to the joint ranges, and maps
unreachable targets to the nearest reachable point along the same direction (never NaN).
"""
from __future__ import annotations

import math

import torch

from quadforge.envs.robots import RobotSpec

_EPS = 1e-6
JACOBIAN_STEP = 1e-4   # rad, the central differences' half step: float32 FK keeps ~4 digits of the derivative


class LegKinematics:
    """FK/IK for one robot: ``forward(q (..., 12)) -> (..., 4, 3)``, ``inverse((..., 4, 3)) -> (..., 12)``."""

    def __init__(self, robot: RobotSpec, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        self.robot = robot
        self.hip_offsets = torch.tensor(robot.hip_offsets, device=device, dtype=dtype)      # (4, 3)
        self.side = torch.tensor(robot.leg_side, device=device, dtype=dtype)                # (4,)
        self.a = robot.abduction_length
        self.l1 = robot.thigh_length
        self.l2 = robot.calf_length
        ranges = torch.tensor(robot.joint_ranges, device=device, dtype=dtype).view(4, 3, 2)
        self.lower, self.upper = ranges[..., 0], ranges[..., 1]                             # (4, 3)
        self._jacobian_steps = _jacobian_steps(JACOBIAN_STEP, device, dtype)                # (7, 12)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """Joint angles (..., 12) -> foot-sphere centres in the base frame (..., 4, 3)."""
        q = q.reshape(*q.shape[:-1], 4, 3)
        q0, q1, q2 = q.unbind(-1)
        x = -self.l1 * torch.sin(q1) - self.l2 * torch.sin(q1 + q2)
        y = (self.side * self.a).expand_as(x)
        z = -self.l1 * torch.cos(q1) - self.l2 * torch.cos(q1 + q2)
        c, s = torch.cos(q0), torch.sin(q0)
        foot = torch.stack((x, y * c - z * s, y * s + z * c), dim=-1)
        return foot + self.hip_offsets

    def forward_and_jacobian(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Joint angles (N, 12) -> feet (N, 4, 3) as ``forward`` gives them, and per-leg Jacobians
        (N, 4, 3, 3) d foot_xyz / d (hip, thigh, calf) by central differences of the FK.

        A leg's foot depends only on its own three joints, so perturbing one joint slot of every leg at
        once gives every block: q and its six perturbations go through one FK pass (one call per
        operation instead of seven on a GPU; each element's arithmetic is the same either way)."""
        feet = self.forward(q.unsqueeze(0) + self._jacobian_steps.unsqueeze(1))       # (7, N, 4, 3)
        slopes = (feet[1:4] - feet[4:7]) / (2 * JACOBIAN_STEP)                          # (3, N, 4, 3)
        return feet[0], torch.stack(slopes.unbind(0), dim=-1)

    def inverse(self, foot: torch.Tensor) -> torch.Tensor:
        """Foot positions in the base frame (..., 4, 3) -> joint angles (..., 12), knee backward."""
        d = foot - self.hip_offsets
        px, py, pz = d.unbind(-1)
        # abduction: |(py, pz)| must cover the fixed lateral offset a; the rest is the leg's depth L
        r2 = (py * py + pz * pz).clamp_min((self.a + _EPS) ** 2)
        depth = torch.sqrt(r2 - self.a * self.a)
        q0 = torch.atan2(pz, py) - torch.atan2(-depth, self.side * self.a)
        q0 = torch.remainder(q0 + math.pi, 2 * math.pi) - math.pi
        # sagittal two-link: reach D = |(px, -L)| clamped to the annulus the links can span
        dist = torch.sqrt(px * px + depth * depth)
        dist_c = dist.clamp(abs(self.l1 - self.l2) + 1e-4, self.l1 + self.l2 - 1e-4)
        cos_knee = (dist_c ** 2 - self.l1 ** 2 - self.l2 ** 2) / (2 * self.l1 * self.l2)
        q2 = -torch.acos(cos_knee.clamp(-1.0, 1.0))
        # in (X, Y) = (-z, -x) the leg is a standard planar 2-link with angles q1, q1 + q2
        q1 = torch.atan2(-px, depth) - torch.atan2(self.l2 * torch.sin(q2), self.l1 + self.l2 * torch.cos(q2))
        # the thigh range extends past pi: below it, take the 2*pi-equivalent angle when that one is
        # inside the range or closer to it (so clamping lands on the nearer limit)
        lo, hi = self.lower[:, 1], self.upper[:, 1]
        wrapped = q1 + 2 * math.pi
        q1 = torch.where((q1 < lo) & ((wrapped - hi) < (lo - q1)), wrapped, q1)
        q = torch.stack((q0, q1, q2), dim=-1)
        q = torch.maximum(torch.minimum(q, self.upper), self.lower)
        return q.reshape(*q.shape[:-2], 12)


def _jacobian_steps(step: float, device, dtype: torch.dtype) -> torch.Tensor:
    """(7, 12) additions to q: none, then +step and -step on joint slot j = 0, 1, 2 of every leg. Row 0
    and the zeros of the -step rows are -0.0, since q + (-0.0) is q for every q (q + 0.0 would turn a
    -0.0 angle into +0.0) and q + (-0.0) is q - 0.0: the same bits as ``forward(q)`` and ``q - dq``."""
    rows = torch.full((7, 4, 3), -0.0, dtype=dtype, device=device)
    for j in range(3):
        rows[1 + j] = 0.0
        rows[1 + j, :, j] = step
        rows[4 + j, :, j] = -step
    return rows.view(7, 12)


def forward_kinematics(robot: RobotSpec, q: torch.Tensor) -> torch.Tensor:
    """One-off FK; build a ``LegKinematics`` once for repeated calls."""
    return LegKinematics(robot, q.device, q.dtype).forward(q)


def inverse_kinematics(robot: RobotSpec, foot: torch.Tensor) -> torch.Tensor:
    """One-off IK; build a ``LegKinematics`` once for repeated calls."""
    return LegKinematics(robot, foot.device, foot.dtype).inverse(foot)
