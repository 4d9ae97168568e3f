"""The loss terms both GeRM trainers share (the proprioceptive one, ``training.qlearning``, and the
vision-language one, ``training.vla``): conservative discretised Q-learning (seed 003 Eq. 2-3,
Q-Transformer) and cross-entropy on action bins. Pure functions of tensors; the trainers supply the
networks and the batches. The maths is documented in ``training.qlearning``'s module docstring.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MC_BOUND_DIMS = ("last", "all")
SEED003_SUCCESS_RATIO = 0.7569   # seed 003: 75.69 % demonstrations, 24.31 % failures per batch


def bellman_targets(q_same: torch.Tensor, q_next_first: torch.Tensor, reward: torch.Tensor,
                    discount: torch.Tensor, bootstrap: torch.Tensor) -> torch.Tensor:
    """Eq. 2 targets (B, d).

    q_same (B, d, K): target-net Q at step t, dimension j conditioned on the dataset bins of dims < j;
    q_next_first (B, K): target-net Q of dimension 0 at the next step; reward, discount (B,);
    bootstrap (B,): 0 where the value after the transition is 0 or unknown (terminal / not stored).
    """
    intra = q_same[:, 1:].max(dim=-1).values                                 # (B, d-1) next dim, same step
    last = reward + discount * bootstrap.float() * q_next_first.max(dim=-1).values  # (B,) next step, dim 0
    return torch.cat([intra, last[:, None]], dim=1)


def with_mc_lower_bound(targets: torch.Tensor, mc_return: torch.Tensor, dims: str = "last") -> torch.Tensor:
    """max(Bellman target, Monte-Carlo return) per sample: on the last dimension (``"last"``, where the
    Bellman backup meets the reward) or on every dimension (``"all"``)."""
    if dims not in MC_BOUND_DIMS:
        raise ValueError(f"mc_bound_dims {dims!r} unknown; allowed: {MC_BOUND_DIMS}")
    mc = mc_return.to(targets)
    if dims == "all":
        return torch.maximum(targets, mc[:, None])
    return torch.cat([targets[:, :-1], torch.maximum(targets[:, -1:], mc[:, None])], dim=1)


def td_loss(q: torch.Tensor, bins: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """½ mean (Q(s, a_data) − target)² with q (B, d, K), bins (B, d), targets (B, d)."""
    q_data = q.gather(-1, bins[..., None])[..., 0]
    return 0.5 * (q_data - targets.detach()).pow(2).mean()


def conservative_loss(q: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """Eq. 3's regulariser: ½ mean over (B, d) of Σ_{b ≠ data bin} Q(s, b)² / (K − 1)."""
    k = q.shape[-1]
    data = F.one_hot(bins, k).bool()                                         # (B, d, K)
    return 0.5 * (q.masked_fill(data, 0.0).pow(2).sum(-1) / (k - 1)).mean()


def q_learning_terms(logits: torch.Tensor, bins: torch.Tensor, targets: torch.Tensor, aux: torch.Tensor,
                     alpha: float) -> dict[str, torch.Tensor]:
    """The Q objective's terms from teacher-forced Q-logits (B, d, K), the dataset bins (B, d) and the
    targets (B, d): ``loss`` = TD + α·conservative + the MoE balance loss ``aux``."""
    q = torch.sigmoid(logits)
    td, cons = td_loss(q, bins, targets), conservative_loss(q, bins)
    q_data = q.gather(-1, bins[..., None])[..., 0]
    return {"loss": td + alpha * cons + aux, "td": td, "conservative": cons, "aux": aux,
            "q_data": q_data.mean().detach(), "target": targets.mean()}


def gaussian_bin_targets(bins: torch.Tensor, num_bins: int, sigma: float) -> torch.Tensor:
    """(N,) data bins -> (N, K) target distributions: a Gaussian of std ``sigma`` bins around each, cut to
    the K bins and renormalised (an end bin keeps its one-sided mass)."""
    k = torch.arange(num_bins, device=bins.device, dtype=torch.float32)
    w = torch.exp(-0.5 * ((k[None, :] - bins[:, None].float()) / sigma) ** 2)
    return w / w.sum(-1, keepdim=True)


def bin_imitation_terms(logits: torch.Tensor, bins: torch.Tensor, aux: torch.Tensor,
                        label_sigma: float = 0.0) -> dict[str, torch.Tensor]:
    """Cross-entropy of logits (B, d, K) on the dataset bins (B, d) (against a Gaussian over neighbouring
    bins when ``label_sigma`` > 0), plus the MoE balance loss ``aux``; teacher-forced bin accuracy."""
    flat = logits.reshape(-1, logits.shape[-1])                               # (B*d, K)
    if label_sigma > 0:
        ce = -(gaussian_bin_targets(bins.reshape(-1), flat.shape[-1], label_sigma)
               * F.log_softmax(flat, -1)).sum(-1).mean()
    else:
        ce = F.cross_entropy(flat, bins.reshape(-1))
    acc = (logits.argmax(-1) == bins).float().mean()
    return {"loss": ce + aux, "ce": ce, "aux": aux, "bin_accuracy": acc.detach()}


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target ← τ·target + (1 − τ)·online for parameters; buffers (normalisation stats) copied."""
    for t, o in zip(target.parameters(), online.parameters()):
        t.lerp_(o, 1.0 - tau)
    for t, o in zip(target.buffers(), online.buffers()):
        t.copy_(o)
