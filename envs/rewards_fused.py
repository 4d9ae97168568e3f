"""Speed only: the sum-of-squares reward terms computed together (one concat, one square, one matmul).

The readable reference is ``envs.rewards.REWARD_TERMS`` (one function per term);
``tests/envs/test_rewards.py`` checks that ``SquareTerms`` gives the same values. Change a term there
first, then here.
"""
from __future__ import annotations

from typing import Callable

import torch

from quadforge.envs.rewards import RewardView, _lin_vel_err_xy, _yaw_rate_err
from quadforge.layout import NUM_JOINTS


# Sum-of-squares terms: term = sum of x^2 over some columns of one input block, the tracking kernels
# exp(-that / tracking_sigma). ``SquareTerms`` computes any subset of them together. Each source is a
# whole (N, width) block - contiguous, so that concatenating them is a plain row copy - and names the
# columns each term sums; unused columns get weight 0.
_J = NUM_JOINTS
_SOURCES: dict[str, tuple[Callable[[RewardView], torch.Tensor], int, dict[str, tuple[int, ...]]]] = {
    "vel_err": (lambda v: _vel_err(v), 3, {"tracking_lin_vel": (0, 1), "tracking_ang_vel": (2,)}),
    "lin_vel_b": (lambda v: v.task.state.root_lin_vel_b, 3, {"lin_vel_z": (2,)}),
    "ang_vel_b": (lambda v: v.task.state.root_ang_vel_b, 3, {"ang_vel_xy": (0, 1)}),
    "gravity_b": (lambda v: v.task.state.projected_gravity_b, 3, {"orientation": (0, 1)}),
    "joint_torque": (lambda v: v.task.state.joint_torque, _J, {"torques": tuple(range(_J))}),
    "joint_vel": (lambda v: v.task.state.joint_vel, _J, {"dof_vel": tuple(range(_J))}),
    "dof_acc": (lambda v: (v.last_joint_vel - v.task.state.joint_vel) / v.dt, _J, {"dof_acc": tuple(range(_J))}),
    "action_rate": (lambda v: v.task.last_actions - v.task.actions, _J, {"action_rate": tuple(range(_J))}),
    "base_height": (lambda v: (v.base_height - v.base_height_target)[:, None], 1, {"base_height": (0,)}),
}
SQUARE_TERMS = frozenset(t for _, _, cols in _SOURCES.values() for t in cols)
_EXP_TERMS = ("tracking_lin_vel", "tracking_ang_vel")  # exp(-sum / sigma) kernels, first in the output


def _vel_err(v: RewardView) -> torch.Tensor:
    """(N, 3) v_x, v_y, w_z errors: the task's buffer when given, else computed."""
    if v.vel_err is not None:
        return v.vel_err
    return torch.cat((_lin_vel_err_xy(v), _yaw_rate_err(v)[:, None]), dim=1)


class SquareTerms:
    """The given ``SQUARE_TERMS`` as one (N, T) block, tracking kernels first (``names``): concatenate
    their source blocks (N, K), square in place, one (K, T) matmul whose entries are 1 (or
    -1/tracking_sigma for the kernels) where a column belongs to a term, one exp for the kernels."""

    def __init__(self, names: list[str]):
        unknown = sorted(set(names) - SQUARE_TERMS)
        if unknown:
            raise ValueError(f"SquareTerms: {unknown} are not sum-of-squares terms; those are {sorted(SQUARE_TERMS)}")
        self.names = [n for n in _EXP_TERMS if n in names] + [n for n in names if n not in _EXP_TERMS]
        self.num_exp = sum(n in _EXP_TERMS for n in self.names)
        self._sources = [(fn, width, cols) for fn, width, cols in _SOURCES.values()
                         if any(t in self.names for t in cols)]
        self._weights: torch.Tensor | None = None
        self._sigma: float | None = None

    def weight_matrix(self, sigma: float, device: torch.device | str) -> torch.Tensor:
        """(K, T): 1 (or -1/sigma for the kernels) where input column k belongs to term t, else 0; made
        once per sigma (a task makes it before its first step, so that a compiled step finds it made)."""
        if self._weights is None or self._sigma != sigma:
            w = torch.zeros(sum(width for _, width, _ in self._sources), len(self.names))
            row = 0
            for _, width, cols in self._sources:
                for term, idx in cols.items():
                    if term in self.names:
                        t = self.names.index(term)
                        w[[row + i for i in idx], t] = -1.0 / sigma if t < self.num_exp else 1.0
                row += width
            self._weights, self._sigma = w.to(device), sigma
        return self._weights

    def compute(self, v: RewardView) -> torch.Tensor:
        """(N, T) unscaled term values in ``names`` order."""
        x = torch.cat([fn(v) for fn, _, _ in self._sources], dim=1).square_()   # (N, K), a fresh tensor
        y = x @ self.weight_matrix(v.tracking_sigma, x.device)                 # (N, T)
        if self.num_exp:
            y[:, :self.num_exp].exp_()
        return y
