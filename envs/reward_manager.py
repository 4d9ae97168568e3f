"""``RewardManager``: the configured reward terms, scaled per step, summed per episode.

The sum-of-squares terms go through the fused block (``envs.rewards_fused.SquareTerms``), the others
through their reference functions (``envs.rewards.REWARD_TERMS``).
"""
from __future__ import annotations

import torch

from quadforge.envs.rewards import REWARD_TERMS, RewardView
from quadforge.envs.rewards_fused import SQUARE_TERMS, SquareTerms
from quadforge.envs.step_log import PendingLog, named


class RewardManager:
    def __init__(self, scales: dict[str, float], dt: float, num_envs: int, only_positive: bool,
                 device: torch.device | str = "cpu"):
        unknown = sorted(set(scales) - set(REWARD_TERMS))
        if unknown:
            raise ValueError(f"rewards.scales has unknown terms {unknown}; known terms: {sorted(REWARD_TERMS)}")
        # Scales are per second in the config; per step they are multiplied by dt (legged_gym).
        self.scales = {n: float(s) * dt for n, s in scales.items() if s != 0}
        self.only_positive = only_positive
        # column order: the sum-of-squares block, the other terms, termination last (it is added after
        # the only-positive clip)
        self._squares = SquareTerms([n for n in self.scales if n in SQUARE_TERMS])
        self._others = [n for n in self.scales if n not in SQUARE_TERMS and n != "termination"]
        self.names = self._squares.names + self._others
        self.has_termination = "termination" in self.scales
        if self.has_termination:
            self.names.append("termination")
        self._other_fns = [REWARD_TERMS[n] for n in self.names[len(self._squares.names):]]
        self._scale = torch.tensor([self.scales[n] for n in self.names], device=device)
        self._sums = torch.zeros(num_envs, len(self.names), device=device)  # (N, T) per-episode sums

    @property
    def episode_sums(self) -> dict[str, torch.Tensor]:
        return {n: self._sums[:, i] for i, n in enumerate(self.names)}

    def prepare(self, tracking_sigma: float) -> None:
        """Make the fused block's constant matrix now: a compiled step (``EnvConfig.compile_task``) must
        find it made, or the first call's trace would see it missing and the second recompile."""
        if self._squares.names:
            self._squares.weight_matrix(tracking_sigma, self._sums.device)

    def compute(self, view: RewardView) -> torch.Tensor:
        n = view.terminated.shape[0]
        if not self.names:
            return torch.zeros(n, device=self._sums.device)
        parts = [self._squares.compute(view)] if self._squares.names else []   # (N, T_sq)
        parts += [fn(view) for fn in self._other_fns]                          # (N,) each
        # column_stack copies even a lone (N, T) block, so the in-place scaling touches a fresh tensor
        scaled = torch.column_stack(parts).mul_(self._scale)                   # (N, T)
        self._sums += scaled
        if self.has_termination:
            total = scaled[:, :-1].sum(dim=1)
            if self.only_positive:
                total.clamp_(min=0.0)
            return total + scaled[:, -1]
        total = scaled.sum(dim=1)
        return total.clamp_(min=0.0) if self.only_positive else total

    def pop_episode(self, env_ids: torch.Tensor, episode_length_s: float) -> PendingLog:
        """Mean per-term episode sums over these envs per second of episode (``Episode_Reward/<term>``),
        still on the device (``envs.step_log``); clears their sums."""
        means = self._sums[env_ids].mean(dim=0) / episode_length_s
        self._sums[env_ids] = 0.0
        return named([f"Episode_Reward/{name}" for name in self.names], means)
