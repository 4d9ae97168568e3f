"""Sparse mixture-of-experts feed-forward layer (seed 003 §IV-B, Eq. 4-7; Shazeer et al. 2017).

Gating: ``H(x) = x·W_g + N(0,1)·softplus(x·W_noise)`` (noise only in training), keep the top-k entries
of H (the rest -inf), softmax over them: exactly k experts per token, gates summing to 1. The output is
``y = Σ_e G(x)_e · E_e(x)`` where only the k selected experts are evaluated.

Dispatch is batched: the (token, slot) assignments are sorted by expert and each expert runs ONE matmul
over all its tokens (a loop over the E experts, never over tokens), then the weighted results are
scattered back with ``index_add_``. With at most E (token, slot) pairs (batch-1 decoding) the selected
experts' weights are gathered instead and applied in one batched matmul, which skips the sort.

Load balancing (choose with ``balance``):
- ``"cv2"`` (GeRM's code, Shazeer 2017): ``cv²(importance) + cv²(load)`` where importance is the summed
  gate per expert and load the expected number of tokens per expert — with noise, the smooth estimate
  ``P(expert stays in the top-k under a fresh noise draw)`` (differentiable); without noise, the
  hard count. Zero under perfectly uniform routing.
- ``"switch"`` (Switch Transformer / Mixtral): ``E · Σ_e f_e · P_e`` with ``f_e`` the fraction of tokens
  routed to e (summing to k) and ``P_e`` the mean router probability (full softmax); it equals k under
  uniform routing and grows when routing concentrates.
Both are multiplied by ``balance_weight`` (1e-2 in GeRM). An optional router z-loss (ST-MoE,
``mean(logsumexp(logits)²)``) is added with ``z_loss_weight``.

W_g and W_noise start at zero (as GeRM's code): routing starts uniform and noise-driven.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

BALANCE_LOSSES = ("cv2", "switch")


@dataclass
class MoEConfig:
    dim: int                       # token width (input = output)
    hidden: int                    # hidden width of each expert's FFN
    num_experts: int = 8
    top_k: int = 2
    noisy: bool = True             # Eq. 6 noise (training only)
    balance: str = "cv2"
    balance_weight: float = 1e-2
    z_loss_weight: float = 0.0
    dropout: float = 0.0

    def validate(self) -> None:
        if self.num_experts < 1:
            raise ValueError(f"MoE num_experts must be >= 1, got {self.num_experts}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"MoE top_k must be in [1, num_experts={self.num_experts}], got {self.top_k}")
        if self.balance not in BALANCE_LOSSES:
            raise ValueError(f"MoE balance {self.balance!r} unknown; allowed: {BALANCE_LOSSES}")
        if self.dim < 1 or self.hidden < 1:
            raise ValueError(f"MoE dim and hidden must be >= 1, got dim={self.dim}, hidden={self.hidden}")


class MoEOutput(NamedTuple):
    y: torch.Tensor            # (..., dim)
    aux_loss: torch.Tensor     # () weighted balance (+ z) loss, to add to the training loss
    expert_index: torch.Tensor  # (T, k) long, the selected experts per flattened token
    gates: torch.Tensor        # (T, k) their weights (sum to 1 per token)


def cv_squared(x: torch.Tensor) -> torch.Tensor:
    """Squared coefficient of variation (var / mean²) of a 1-D tensor; 0 for a single entry."""
    if x.numel() <= 1:
        return x.new_zeros(())
    return x.float().var(unbiased=False) / (x.float().mean() ** 2 + 1e-10)


class SparseMoE(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        e, d, h = cfg.num_experts, cfg.dim, cfg.hidden
        self.w_gate = nn.Parameter(torch.zeros(d, e))
        self.w_noise = nn.Parameter(torch.zeros(d, e))
        # Experts as stacked weights: expert e is  x @ w1[e] + b1[e] -> GELU -> @ w2[e] + b2[e]
        self.w1 = nn.Parameter(torch.empty(e, d, h))
        self.b1 = nn.Parameter(torch.zeros(e, h))
        self.w2 = nn.Parameter(torch.empty(e, h, d))
        self.b2 = nn.Parameter(torch.zeros(e, d))
        self.dropout = nn.Dropout(cfg.dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's default init, per expert
        for w, fan_in in ((self.w1, self.cfg.dim), (self.w2, self.cfg.hidden)):
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(w, -bound, bound)

    # --- parameter counts -----------------------------------------------------------------------
    def expert_parameters(self) -> int:
        """Parameters of one expert."""
        return (self.w1[0].numel() + self.b1[0].numel() + self.w2[0].numel() + self.b2[0].numel())

    def total_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def active_parameters(self) -> int:
        """Parameters that touch one token: the router plus k experts."""
        return self.total_parameters() - (self.cfg.num_experts - self.cfg.top_k) * self.expert_parameters()

    # --- routing --------------------------------------------------------------------------------
    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x (T, dim) -> clean logits (T, E), noisy logits H (T, E), noise std (T, E) or None,
        top-k indices (T, k)."""
        clean = x @ self.w_gate                                        # (T, E)
        if self.cfg.noisy and self.training:
            std = F.softplus(x @ self.w_noise) + 1e-2                  # (T, E); floor keeps the CDF finite
            noisy = clean + torch.randn_like(clean) * std
        else:
            std, noisy = None, clean
            if self.training and torch.is_grad_enabled():   # keep W_noise in the graph for DDP
                noisy = clean + 0.0 * self.w_noise.sum()
        return clean, noisy, std, noisy.topk(self.cfg.top_k, dim=-1).indices

    def _load(self, clean: torch.Tensor, noisy: torch.Tensor, std: torch.Tensor | None,
              top_idx: torch.Tensor) -> torch.Tensor:
        """Expected tokens per expert (E,): Shazeer's smooth estimator when noisy, else hard counts."""
        e, k = self.cfg.num_experts, self.cfg.top_k
        if std is None or k >= e:
            return torch.zeros(e, device=clean.device).index_add_(
                0, top_idx.reshape(-1), torch.ones(top_idx.numel(), device=clean.device))
        top_vals = noisy.topk(k + 1, dim=-1).values                   # (T, k+1)
        threshold_in = top_vals[:, k:k + 1]    # an expert in the top-k must beat the (k+1)-th value
        threshold_out = top_vals[:, k - 1:k]   # an expert outside must beat the k-th value
        is_in = noisy > threshold_in
        normal = torch.distributions.Normal(0.0, 1.0)
        p_in = normal.cdf((clean - threshold_in) / std)
        p_out = normal.cdf((clean - threshold_out) / std)
        return torch.where(is_in, p_in, p_out).sum(0)

    def balance_loss(self, clean: torch.Tensor, noisy: torch.Tensor, std: torch.Tensor | None,
                     top_idx: torch.Tensor, gates_dense: torch.Tensor) -> torch.Tensor:
        e = self.cfg.num_experts
        if self.cfg.balance == "cv2":
            importance = gates_dense.sum(0)                             # (E,)
            return cv_squared(importance) + cv_squared(self._load(clean, noisy, std, top_idx))
        counts = torch.zeros(e, device=clean.device).index_add_(
            0, top_idx.reshape(-1), torch.ones(top_idx.numel(), device=clean.device))
        f = counts / clean.shape[0]                                     # (E,) sums to k
        p = torch.softmax(clean, dim=-1).mean(0)                        # (E,) sums to 1
        return e * (f * p).sum()

    # --- forward --------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> MoEOutput:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])                                 # (T, D)
        clean, noisy, std, top_idx = self.route(flat)
        gates = torch.softmax(noisy.gather(-1, top_idx), dim=-1)        # (T, k), softmax over the top-k
        if flat.shape[0] * self.cfg.top_k <= self.cfg.num_experts:
            out = self._dispatch_gathered(flat, top_idx, gates)
        else:
            out = self._dispatch_sorted(flat, top_idx, gates)
        aux = flat.new_zeros(())
        if self.training:  # the router losses only matter to the optimiser
            if self.cfg.balance_weight:
                gates_dense = torch.zeros_like(noisy).scatter(-1, top_idx, gates)  # (T, E)
                aux = aux + self.cfg.balance_weight * self.balance_loss(clean, noisy, std, top_idx, gates_dense)
            if self.cfg.z_loss_weight:
                aux = aux + self.cfg.z_loss_weight * torch.logsumexp(clean, dim=-1).pow(2).mean()
        return MoEOutput(out.reshape(shape), aux, top_idx, gates)

    def _dispatch_sorted(self, flat: torch.Tensor, top_idx: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """Many tokens: sort the T*k (token, slot) pairs by expert, one matmul per expert."""
        t, k, e = flat.shape[0], self.cfg.top_k, self.cfg.num_experts
        expert_of = top_idx.reshape(-1)                                 # (T*k,)
        token_of = torch.arange(t, device=flat.device).repeat_interleave(k)
        order = torch.argsort(expert_of, stable=True)
        # tokens per expert from the sorted ids: one host read (bincount's own range read made it three)
        bounds = torch.searchsorted(expert_of[order], torch.arange(e + 1, device=flat.device))
        counts = bounds.diff().tolist()
        tokens_sorted = token_of[order]
        weights_sorted = gates.reshape(-1)[order]
        out = flat.new_zeros(t, flat.shape[1])
        start = 0
        for ex, n in enumerate(counts):
            if n == 0:
                if torch.is_grad_enabled() and self.training:
                    # a zero-weight touch keeps every expert in the graph, so DDP's gradient all-reduce
                    # sees the same parameter set on every rank whatever the routing
                    out = out + 0.0 * (self.w1[ex].sum() + self.b1[ex].sum() + self.w2[ex].sum() + self.b2[ex].sum())
                continue
            idx = tokens_sorted[start:start + n]
            h = F.gelu(flat[idx] @ self.w1[ex] + self.b1[ex])           # (n, H)
            y = self.dropout(h) @ self.w2[ex] + self.b2[ex]             # (n, D)
            out.index_add_(0, idx, y * weights_sorted[start:start + n, None])
            start += n
        return out

    def _dispatch_gathered(self, flat: torch.Tensor, top_idx: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """Few tokens (batch-1 decoding): gather each slot's expert weights, one batched matmul, no loop."""
        t, k = top_idx.shape
        idx = top_idx.reshape(-1)                                       # (T*k,)
        x = flat.repeat_interleave(k, dim=0)[:, None, :]                # (T*k, 1, D)
        h = F.gelu(torch.bmm(x, self.w1[idx]) + self.b1[idx, None])     # (T*k, 1, H)
        y = torch.bmm(self.dropout(h), self.w2[idx]) + self.b2[idx, None]  # (T*k, 1, D)
        out = (y[:, 0] * gates.reshape(-1, 1)).view(t, k, -1).sum(1)    # (T, D)
        if torch.is_grad_enabled() and self.training:   # see _dispatch_sorted: every expert in the graph
            out = out + 0.0 * (self.w1.sum() + self.b1.sum() + self.w2.sum() + self.b2.sum())
        return out

    def expert_forward(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        """One expert on every token of x (..., D) — the dense reference the tests compare against."""
        return F.gelu(x @ self.w1[expert] + self.b1[expert]) @ self.w2[expert] + self.b2[expert]


class DenseFFN(nn.Module):
    """The GeRM w/o MoE feed-forward: one GELU MLP, same output type as SparseMoE (zero aux loss)."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def total_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    active_parameters = total_parameters

    def forward(self, x: torch.Tensor) -> MoEOutput:
        y = self.fc2(self.dropout(F.gelu(self.fc1(x))))
        empty = torch.zeros(0, 0, dtype=torch.long, device=x.device)
        return MoEOutput(y, x.new_zeros(()), empty, empty.float())


def matched_dense_hidden(cfg: MoEConfig) -> int:
    """Hidden width of a DenseFFN whose parameters equal the MoE's ACTIVE parameters (router + k experts).

    dense params = 2·D·h + h + D  ==  k·(2·D·H + H + D) + 2·D·E   (solved for h, rounded).
    """
    d, hdn, e, k = cfg.dim, cfg.hidden, cfg.num_experts, cfg.top_k
    active = k * (2 * d * hdn + hdn + d) + 2 * d * e
    return max(1, round((active - d) / (2 * d + 1)))


def upcycled_state(dense_state: dict[str, torch.Tensor], moe_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sparse upcycling (Komatsuzaki et al. 2023): the state of a network whose FFNs are DenseFFNs, mapped
    onto the same network with SparseMoE FFNs. Every expert is a copy of the dense FFN it replaces and the
    router keeps ``moe_state``'s (zero) weights, so the upcycled network computes exactly what the dense
    one did (the top-k gates sum to 1 over identical experts) until training makes the experts differ.

    ``moe_state`` is the target network's own state dict; its experts' width must equal the dense FFN's."""
    out: dict[str, torch.Tensor] = {}
    for key, value in dense_state.items():
        prefix, _, leaf = key.rpartition(".fc")
        if key in moe_state or leaf not in ("1.weight", "1.bias", "2.weight", "2.bias"):
            out[key] = value          # not a replaced FFN (other layers may also be named fc1/fc2)
            continue
        name = {"1.weight": "w1", "1.bias": "b1", "2.weight": "w2", "2.bias": "b2"}[leaf]
        target = moe_state.get(f"{prefix}.{name}")
        if target is None:
            raise ValueError(f"upcycling: {key} has no SparseMoE counterpart {prefix}.{name}")
        expert = value.t() if value.dim() == 2 else value                  # nn.Linear stores (out, in)
        if tuple(target.shape[1:]) != tuple(expert.shape):
            raise ValueError(f"upcycling: {prefix}'s experts are {tuple(target.shape[1:])}, the dense FFN's "
                             f"{name} is {tuple(expert.shape)}; the experts' width must equal the dense FFN's")
        out[f"{prefix}.{name}"] = expert.unsqueeze(0).expand_as(target).clone()
        for router in ("w_gate", "w_noise"):
            out.setdefault(f"{prefix}.{router}", moe_state[f"{prefix}.{router}"].clone())
    return out
