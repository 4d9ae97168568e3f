"""The decoder both GeRMs and RT-1 run: pre-norm transformer blocks whose FFN is a sparse MoE or dense,
a key/value cache for greedy decoding one dimension at a time, and one bin head per action dimension.

    x (B, L, D) ──[LN → attention(allowed) → +]──[LN → FFN (MoE | dense) → +]── × num_layers ── LN ── h
    logits_i = W_i · h_i + b_i                                          (B, m, K) per action dimension

The proprioceptive GeRM (``models.germ``, a causal mask over observation then action tokens) and the
vision-language models (``models.vla``: RT-1, GeRM over frames, a rank mask) differ only in their tokens
and the mask they pass in; a config for either needs ``d_model``, ``num_heads``, ``dropout``, ``moe``,
``ffn_hidden``, ``num_layers`` and ``moe_config()``.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from quadforge.models.moe import DenseFFN, SparseMoE


class KVCache(NamedTuple):
    k: torch.Tensor  # (B, heads, S, head_dim)
    v: torch.Tensor


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, dropout: float):
        super().__init__()
        self.h = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, allowed: torch.Tensor,
                past: KVCache | None) -> tuple[torch.Tensor, KVCache]:
        """x (B, L, D) new tokens; allowed (B, 1, L, S) over past + new keys -> (B, L, D) and the cache."""
        b, l, d = x.shape
        q, k, v = self.qkv(x).view(b, l, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)  # each (B, h, L, hd)
        if past is not None:
            k, v = torch.cat([past.k, k], dim=2), torch.cat([past.v, v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, l, d)), KVCache(k, v)


class DecoderBlock(nn.Module):
    """Pre-norm transformer block whose FFN is a sparse MoE (GeRM) or dense (RT-1, GeRM w/o MoE)."""

    def __init__(self, cfg: Any):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.num_heads, cfg.dropout)
        self.ffn = SparseMoE(cfg.moe_config()) if cfg.moe else DenseFFN(cfg.d_model, cfg.ffn_hidden, cfg.dropout)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: KVCache | None
                ) -> tuple[torch.Tensor, torch.Tensor, KVCache]:
        a, cache = self.attn(self.ln1(x), allowed, past)
        x = x + a
        f = self.ffn(self.ln2(x))
        return x + f.y, f.aux_loss, cache


class Decoder(nn.Module):
    def __init__(self, cfg: Any):
        super().__init__()
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, caches: list[KVCache] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, list[KVCache]]:
        """x (B, L, D) new tokens, allowed (B, 1, L, K) -> (B, L, D) normed, summed MoE aux loss, caches."""
        aux = x.new_zeros(())
        new = []
        for i, block in enumerate(self.blocks):
            x, a, c = block(x, allowed, caches[i] if caches is not None else None)
            aux = aux + a
            new.append(c)
        return self.ln_f(x), aux, new

    def inactive_parameters(self) -> int:
        """Parameters a token never touches: the experts each MoE layer leaves unselected."""
        return sum((b.ffn.cfg.num_experts - b.ffn.cfg.top_k) * b.ffn.expert_parameters()
                   for b in self.blocks if isinstance(b.ffn, SparseMoE))


class BinHeads(nn.Module):
    """One linear head per action dimension: h (B, m, D) for dims first..first+m-1 -> logits (B, m, K)."""

    def __init__(self, action_dim: int, num_bins: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(action_dim, num_bins, d_model))
        self.bias = nn.Parameter(torch.zeros(action_dim, num_bins))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, h: torch.Tensor, first: int = 0) -> torch.Tensor:
        m = h.shape[1]
        return torch.einsum("bmd,mkd->bmk", h, self.weight[first:first + m]) + self.bias[first:first + m]
