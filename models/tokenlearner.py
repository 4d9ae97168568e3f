"""TokenLearner (Ryoo et al. 2021, as RT-1 uses it): a feature map of h·w tokens -> S learned tokens.

For a feature map X (N, D, h, w), S spatial attention maps are computed from X itself,

    A = softmax_over_space( conv1x1_S( GELU( conv1x1_hidden( LayerNorm_D(X) ) ) ) )     (N, S, h·w)

and each output token is the attention-weighted sum of the map's feature vectors,

    Z_s = Σ_p A[s, p] · X[:, p]                                                           (N, S, D)

RT-1 reduces 81 EfficientNet tokens per frame to S = 8 (hidden 64); so does our default.
"""
from __future__ import annotations

import torch
from torch import nn


class TokenLearner(nn.Module):
    def __init__(self, dim: int, num_tokens: int = 8, hidden: int = 64):
        super().__init__()
        if num_tokens < 1 or hidden < 1:
            raise ValueError(f"TokenLearner num_tokens={num_tokens}, hidden={hidden}; both must be >= 1")
        self.num_tokens = int(num_tokens)
        self.norm = nn.LayerNorm(dim)
        self.attention = nn.Sequential(nn.Conv2d(dim, hidden, 1), nn.GELU(), nn.Conv2d(hidden, num_tokens, 1))

    def attention_maps(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, D, h, w) -> A (N, S, h·w), each row a softmax over the h·w positions."""
        normed = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)   # LayerNorm over channels
        logits = self.attention(normed)                                 # (N, S, h, w)
        return torch.softmax(logits.flatten(2), dim=-1)                 # (N, S, h·w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, D, h, w) -> tokens (N, S, D)."""
        a = self.attention_maps(x)                                       # (N, S, hw)
        return torch.einsum("nsp,ndp->nsd", a, x.flatten(2))             # (N, S, D)
