"""RT-1-style vision-language-action model (Brohan et al. 2022; the baseline of seed 003 Table III).

    tokens, valid, rank = FrontEnd(frames_{t-T+1..t}, instruction)      (B, T·S, D)   FiLM trunk + TokenLearner
    r_i = R_i                                       i = 0..d-1          (B, d, D)     learned read-out tokens, rank T
    H = Decoder([tokens, r])                        frame-causal mask   (B, T·S + d, D)
    logits_i = W_i · H[T·S + i] + b_i                                   (B, d, K)     one 256-bin head per dimension
    loss = mean_i CE(logits_i, bin_i(a_t))

The action of the newest frame is predicted for all d dimensions at once: the read-outs carry no action
content (non-autoregressive action tokens, as RT-1). Bins are decoded to their centres by the trainer's
``ActionBinner``. The decoder is dense (RT-1 has no MoE).
"""
from __future__ import annotations

import torch
from torch import nn

from quadforge.models.decoder import BinHeads, Decoder
from quadforge.models.vla import VLAConfig, VLAOutput, VisionLanguageFrontEnd, parameter_counts, rank_mask


class RT1(nn.Module):
    name = "rt1"

    def __init__(self, cfg: VLAConfig):
        super().__init__()
        cfg.validate()
        if cfg.moe:
            raise ValueError("RT-1 has a dense decoder; build it with moe=False")
        self.cfg = cfg
        self.frontend = VisionLanguageFrontEnd(cfg)
        self.readout = nn.Parameter(torch.zeros(cfg.action_dim, cfg.d_model))   # R_i
        nn.init.normal_(self.readout, std=0.02)
        self.decoder = Decoder(cfg)
        self.heads = BinHeads(cfg.action_dim, cfg.num_bins, cfg.d_model)

    def parameter_counts(self) -> dict[str, int]:
        return parameter_counts(self, self.decoder)

    def logits_from_tokens(self, tokens: torch.Tensor, valid: torch.Tensor, rank: torch.Tensor) -> VLAOutput:
        """Front-end tokens (B, T·S, D), valid (B, T·S), rank (T·S,) -> logits (B, d, K)."""
        b, d = tokens.shape[0], self.cfg.action_dim
        x = torch.cat([tokens, self.readout.expand(b, d, -1)], dim=1)                   # (B, T·S + d, D)
        valid = torch.cat([valid, valid.new_ones(b, d)], dim=1)
        rank = torch.cat([rank, rank.new_full((d,), self.cfg.history)])
        h, aux, _ = self.decoder(x, rank_mask(rank, valid, x.shape[1]))
        return VLAOutput(self.heads(h[:, -d:]), aux)

    def forward(self, frames: torch.Tensor, mask: torch.Tensor, instruction: torch.Tensor,
                prefix_bins: torch.Tensor | None = None) -> VLAOutput:
        """frames (B, T, 3, H, W) float, mask (B, T), prepared instruction (B, ...) -> logits (B, d, K).
        ``prefix_bins`` is accepted and not read: the read-outs are non-autoregressive, and the VLA
        trainer calls every VLA with the data's bins (GeRM's teacher forcing) through one signature."""
        return self.logits_from_tokens(*self.frontend(frames, mask, instruction))

    @torch.no_grad()
    def act_from_tokens(self, tokens: torch.Tensor, valid: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        """Most likely bin per dimension (B, d)."""
        return self.logits_from_tokens(tokens, valid, rank).logits.argmax(-1)
