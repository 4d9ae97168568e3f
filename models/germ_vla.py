"""GeRM over images and instructions (seed 003 §IV-B/C): the shared vision-language tokens, a decoder
whose FFNs are sparse MoE (8 experts, top-2, noisy gating; ``moe=False`` is GeRM w/o MoE), and
Q-Transformer's autoregressive discretised Q-function over the d = 12 command dimensions.

    tokens, valid, rank = FrontEnd(frames_{t-T+1..t}, instruction)       (B, T·S, D)
    x = [tokens, s, u_0(a^0), .., u_{d-2}(a^{d-2})]                      (B, T·S + d, D)
        s: learned start token (rank T); u_i(b) = ActionEmbed[i·K + b] + DimPos_i (rank T+1+i)
    H = Decoder(x)                                                       rank mask: frames causal, then
                                                                         each action token sees the
                                                                         frames, s and the dims before it
    Q_i(s_t, a^{<i}, ·) = sigmoid(W_i · H[T·S + i] + b_i)                (B, d, K)    dimension i's 256 bins

Training teacher-forces the dataset bins a^{<i} (one pass gives every dimension's logits); the Q
objective (conservative term, MC bound, next-step target for the last dimension) is the one in
``training.qlearning``; GeRM w/o RL trains the same network by cross-entropy. The 7th frame of a
transition enters only the target network's next-step window. Acting decodes greedily, one dimension
at a time, reusing the decoder's key/value cache (each extra dimension costs one token).
"""
from __future__ import annotations

import torch
from torch import nn

from quadforge.models.greedy import greedy_bins
from quadforge.models.decoder import BinHeads, Decoder
from quadforge.models.vla import VLAConfig, VLAOutput, VisionLanguageFrontEnd, parameter_counts, rank_mask


class GeRMVLA(nn.Module):
    name = "germ"

    def __init__(self, cfg: VLAConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        d, a, k = cfg.d_model, cfg.action_dim, cfg.num_bins
        self.frontend = VisionLanguageFrontEnd(cfg)
        self.start = nn.Parameter(torch.zeros(1, d))                                   # s
        self.action_embed = nn.Embedding(max(1, (a - 1) * k), d)                       # bin b of dim i -> i*K + b
        self.dim_pos = nn.Parameter(torch.zeros(max(1, a - 1), d))
        for p in (self.start, self.dim_pos):
            nn.init.normal_(p, std=0.02)
        self.decoder = Decoder(cfg)
        self.heads = BinHeads(a, k, d)

    def parameter_counts(self) -> dict[str, int]:
        return parameter_counts(self, self.decoder)

    def _action_tokens(self, bins: torch.Tensor, first: int = 0) -> torch.Tensor:
        """bins (B, m) of dims first..first+m-1 -> (B, m, D)."""
        dims = torch.arange(first, first + bins.shape[1], device=bins.device)
        return self.action_embed(dims * self.cfg.num_bins + bins) + self.dim_pos[first:first + bins.shape[1]]

    def _prefix(self, tokens, valid, rank, prefix_bins):
        """The decoder input up to the given action prefix: tokens (B, L, D), valid (B, L), rank (L,)."""
        b = tokens.shape[0]
        parts = [tokens, self.start.expand(b, 1, -1)]
        m = 0 if prefix_bins is None else prefix_bins.shape[1]
        if m > self.cfg.action_dim - 1:
            raise ValueError(f"prefix_bins has {m} dimensions; at most action_dim-1 = {self.cfg.action_dim - 1}")
        if m:
            parts.append(self._action_tokens(prefix_bins))
        x = torch.cat(parts, dim=1)
        valid = torch.cat([valid, valid.new_ones(b, 1 + m)], dim=1)
        rank = torch.cat([rank, torch.arange(self.cfg.history, self.cfg.history + 1 + m, device=rank.device)])
        return x, valid, rank

    def logits_from_tokens(self, tokens: torch.Tensor, valid: torch.Tensor, rank: torch.Tensor,
                           prefix_bins: torch.Tensor | None = None) -> VLAOutput:
        """Q-logits (B, m+1, K) of dims 0..m given the bins (B, m) of dims 0..m-1 (teacher forcing)."""
        x, valid, rank = self._prefix(tokens, valid, rank, prefix_bins)
        m1 = x.shape[1] - tokens.shape[1]
        h, aux, _ = self.decoder(x, rank_mask(rank, valid, x.shape[1]))
        return VLAOutput(self.heads(h[:, -m1:]), aux)

    def forward(self, frames: torch.Tensor, mask: torch.Tensor, instruction: torch.Tensor,
                prefix_bins: torch.Tensor | None = None) -> VLAOutput:
        """frames (B, T, 3, H, W), mask (B, T), prepared instruction (B, ...), prefix_bins (B, m) -> (B, m+1, K)."""
        return self.logits_from_tokens(*self.frontend(frames, mask, instruction), prefix_bins)

    @torch.no_grad()
    def greedy_from_tokens(self, tokens: torch.Tensor, valid: torch.Tensor, rank: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Argmax bins (B, d) and their Q values (B, d), dimension i chosen after dimensions < i."""
        x, valid, rank = self._prefix(tokens, valid, rank, None)
        h, _, caches = self.decoder(x, rank_mask(rank, valid, x.shape[1]))
        state = {"valid": valid, "rank": rank, "caches": caches}

        def advance(best: torch.Tensor, i: int) -> torch.Tensor:
            state["valid"] = torch.cat([state["valid"], state["valid"].new_ones(best.shape[0], 1)], dim=1)
            state["rank"] = torch.cat([state["rank"], state["rank"].new_full((1,), self.cfg.history + 1 + i)])
            h, _, state["caches"] = self.decoder(self._action_tokens(best[:, None], i),
                                                 rank_mask(state["rank"], state["valid"], 1), state["caches"])
            return self.heads(h, i + 1)[:, 0]

        return greedy_bins(self.heads(h[:, -1:], 0)[:, 0], advance, self.cfg.action_dim)

    def act_from_tokens(self, tokens: torch.Tensor, valid: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        return self.greedy_from_tokens(tokens, valid, rank)[0]
