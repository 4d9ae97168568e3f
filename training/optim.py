"""Optimizers and learning-rate schedules shared by every trainer (imitation, GeRM).

- AdamW (torch's) with the seeds' betas/eps, and Lion (Chen et al. 2023, "Symbolic Discovery of
  Optimization Algorithms": update = sign(β1·m + (1−β1)·g), decoupled weight decay, m ← β2·m + (1−β2)·g),
  which torch does not ship.
- Cosine decay with linear warmup, as a ``LambdaLR`` so its state is saved with the checkpoint.
- Weight decay only on matrices: biases, norm gains and embeddings-as-vectors (ndim < 2) are exempt.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

OPTIMIZERS = ("adamw", "lion")


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-4
    warmup_frac: float = 0.1       # fraction of total steps spent in linear warmup
    min_lr_ratio: float = 0.0      # final lr = lr * min_lr_ratio
    grad_clip: float | None = 1.0  # max global grad norm; None disables clipping

    def validate(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer name {self.name!r} unknown; allowed: {OPTIMIZERS}")
        if not self.lr > 0:
            raise ValueError(f"optimizer lr must be > 0, got {self.lr}")
        if not 0.0 <= self.warmup_frac < 1.0:
            raise ValueError(f"optimizer warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optimizer min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if len(tuple(self.betas)) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optimizer betas must be two numbers in [0, 1), got {self.betas}")


class Lion(torch.optim.Optimizer):
    """Lion: sign of an interpolated momentum, decoupled weight decay. Complex parameters are updated
    through their real view (the sign is taken per real/imaginary component)."""

    def __init__(self, params: Iterable, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0):
        if not lr > 0:
            raise ValueError(f"Lion lr must be > 0, got {lr}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                param, grad, m = p, p.grad, state["exp_avg"]
                if p.is_complex():
                    param, grad, m = (torch.view_as_real(t) for t in (p, p.grad, m))
                if wd:
                    param.mul_(1.0 - lr * wd)
                update = (m * b1 + grad * (1.0 - b1)).sign_()
                param.add_(update, alpha=-lr)
                m.mul_(b2).add_(grad, alpha=1.0 - b2)
        return loss


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed matrices (ndim >= 2) and undecayed vectors/scalars."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    cfg.validate()
    groups = param_groups(model, cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    return Lion(groups, lr=cfg.lr, betas=tuple(cfg.betas))


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_lr_ratio: float = 0.0) -> float:
    """Multiplier of the base lr at ``step``: linear 1/w .. 1 over warmup, then cosine to min_lr_ratio."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1 for the lr schedule, got {total_steps}")
    warmup = int(round(cfg.warmup_frac * total_steps))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, total_steps, warmup, cfg.min_lr_ratio))


def clip_gradients(model: nn.Module, max_norm: float | None) -> torch.Tensor:
    """Clip the global grad norm (when ``max_norm``) and return the norm before clipping, a 0-dim tensor on
    the gradients' device: reading it (``float``) waits for a GPU, so the caller does that only when it logs."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return torch.zeros(())
    if max_norm is None:
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
    return torch.nn.utils.clip_grad_norm_(params, max_norm)
