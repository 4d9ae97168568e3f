"""Task-level domain randomization: pushes and action latency (physics parameters - friction, added
mass, motor strength - are drawn by the backend from ``RandomizationConfig.physics``).
"""
from __future__ import annotations

import torch

from quadforge.envs.config import RandomizationConfig


class Pushes:
    """legged_gym: every ``push_interval_s`` all envs get a base velocity kick U(-v, v) in x and y."""

    def __init__(self, cfg: RandomizationConfig, dt: float, generator: torch.Generator):
        self.enabled = cfg.push_robots and cfg.max_push_vel_xy > 0
        self.interval = max(1, int(round(cfg.push_interval_s / dt)))
        self.max_vel = cfg.max_push_vel_xy
        self.gen = generator

    def maybe_push(self, backend, step_counter: int) -> bool:
        if not self.enabled or step_counter % self.interval != 0:
            return False
        n = backend.num_envs
        dv = torch.zeros(n, 3, device=backend.device)
        dv[:, :2] = (2 * torch.rand(n, 2, generator=self.gen, device=backend.device) - 1) * self.max_vel
        backend.push(torch.arange(n, device=backend.device), dv)
        return True


class ActionLatency:
    """Per-env delay of 0 or 1 control steps, drawn at reset: a delayed env applies the previous action."""

    def __init__(self, cfg: RandomizationConfig, num_envs: int, generator: torch.Generator,
                 device: torch.device | str = "cpu"):
        self.lo, self.hi = cfg.action_latency_steps
        self.gen = generator
        self.delay = torch.zeros(num_envs, dtype=torch.bool, device=device)

    @property
    def active(self) -> bool:
        return self.hi > 0

    def reset(self, env_ids: torch.Tensor) -> None:
        if not self.active or env_ids.numel() == 0:
            return
        d = torch.randint(self.lo, self.hi + 1, (env_ids.numel(),), generator=self.gen, device=self.delay.device)
        self.delay[env_ids] = d.to(torch.bool)

    def apply(self, actions: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return actions
        return torch.where(self.delay[:, None], previous, actions)
