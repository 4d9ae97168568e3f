"""Decision ConvFormer (seed 002): a MetaFormer whose token mixer is a causal depthwise convolution.

Blocks ``x + Conv(LN(x))``, ``x + MLP(LN(x))`` (4x GELU MLP) over the DT token sequence (R, s, a).
The convolution has three filters per hidden channel (kernel L = 6: the current and previous step's
tokens) - the RTG, state and action filters - and the output at a position uses the filter of that
position's token type. Left zero padding as in the paper; padded (masked) tokens are zeroed at every
conv input so left padding equals zero history. No positional embedding (the paper: the convolution
over neighbouring tokens carries position). Actions are predicted from the state tokens.

Recurrent ``step``: per layer a buffer of the last L-1 conv inputs, O(L d) per token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from quadforge.models.base import Cache, Decoder, FeedForward, SequenceModel
from quadforge.models.tokens import StepTokens


class TypedCausalConv(nn.Module):
    """Depthwise causal conv with one filter per token type: weight (types=3, d, L)."""

    def __init__(self, hidden: int, kernel: int):
        super().__init__()
        self.hidden, self.kernel = hidden, kernel
        self.weight = nn.Parameter(torch.randn(3, hidden, kernel) / kernel)
        self.bias = nn.Parameter(torch.zeros(3, hidden))

    def forward(self, x: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        # x (B, L, d), types (L,) -> (B, L, d)
        b, l, d = x.shape
        w = self.weight.permute(1, 0, 2).reshape(3 * d, 1, self.kernel)            # channel q -> rows 3q..3q+2
        y = F.conv1d(F.pad(x.transpose(1, 2), (self.kernel - 1, 0)), w, groups=d)   # (B, 3d, L)
        y = y.view(b, d, 3, l)
        idx = types.view(1, 1, 1, l).expand(b, d, 1, l)
        out = y.gather(2, idx).squeeze(2).transpose(1, 2)                           # (B, L, d)
        return out + self.bias[types]

    def step(self, x: torch.Tensor, buf: torch.Tensor, types: list[int]) -> torch.Tensor:
        # x (B, c, d); buf (B, L-1, d) holds the previous inputs, updated in place
        full = torch.cat([buf, x], dim=1)                                           # (B, L-1+c, d)
        outs = [torch.einsum("bjd,dj->bd", full[:, i:i + self.kernel], self.weight[kind]) + self.bias[kind]
                for i, kind in enumerate(types)]
        if self.kernel > 1:
            buf.copy_(full[:, full.shape[1] - (self.kernel - 1):])
        return torch.stack(outs, 1)


class ConvBlock(nn.Module):
    def __init__(self, hidden: int, kernel: int, ffn_mult: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.conv = TypedCausalConv(hidden, kernel)
        self.mlp = FeedForward(hidden, ffn_mult * hidden)

    def forward(self, x: torch.Tensor, valid: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        x = x + self.conv(self.norm1(x) * valid.unsqueeze(-1), types)
        return x + self.mlp(self.norm2(x))

    def step(self, x, valid, buf, types) -> torch.Tensor:
        x = x + self.conv.step(self.norm1(x) * valid.unsqueeze(-1), buf, types)
        return x + self.mlp(self.norm2(x))


class DecisionConvFormer(SequenceModel):
    name = "convformer"

    def __init__(self, obs_dim: int, action_dim: int = 12, context: int = 20, hidden: int = 128,
                 num_layers: int = 3, kernel: int = 6, ffn_mult: int = 4, decoder_hidden: int = 128,
                 use_rtg: bool = False, use_actions: bool = True):
        super().__init__(obs_dim, action_dim, context, use_rtg=use_rtg, use_actions=use_actions)
        if kernel < 1:
            raise ValueError(f"convformer kernel={kernel}; must be >= 1")
        self.hidden, self.num_layers, self.kernel = hidden, num_layers, kernel
        self.ffn_mult, self.decoder_hidden = ffn_mult, decoder_hidden
        self.tokens = StepTokens(obs_dim, action_dim, hidden, use_rtg, use_actions)
        self.blocks = nn.ModuleList(ConvBlock(hidden, kernel, ffn_mult) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden)
        self.decoder = Decoder(hidden, decoder_hidden, action_dim)

    @property
    def config(self) -> dict:
        return dict(obs_dim=self.obs_dim, action_dim=self.action_dim, context=self.context, hidden=self.hidden,
                    num_layers=self.num_layers, kernel=self.kernel, ffn_mult=self.ffn_mult,
                    decoder_hidden=self.decoder_hidden, use_rtg=self.use_rtg, use_actions=self.use_actions)

    def forward(self, obs, actions=None, rtg=None, mask=None) -> torch.Tensor:
        mask = self.check_window(obs, actions, rtg, mask)
        x, valid, _ = self.tokens.window(obs, actions, rtg, mask)                    # (B, T*k, d)
        types = self.tokens.type_ids(x.shape[1], x.device)
        valid = valid.to(x.dtype)
        for block in self.blocks:
            x = block(x, valid, types)
        states = x[:, self.tokens.state_offset::self.tokens.k]                        # (B, T, d)
        return self.decoder(self.norm(states))

    def _init_state(self, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        return {f"buf{i}": torch.zeros(batch_size, self.kernel - 1, self.hidden, dtype=self._float_dtype(),
                                       device=device)
                for i in range(self.num_layers)}

    def _step(self, obs_t, cache: Cache, action_prev, rtg_t) -> torch.Tensor:
        x, valid, _, types = self.tokens.chunk(obs_t, action_prev, rtg_t, cache.pos)  # (B, c, d)
        # an absent a_{t-1} token (block start) enters as a zero = the left padding it stands for
        valid = valid.to(x.dtype)
        for i, block in enumerate(self.blocks):
            x = block.step(x, valid, cache.state[f"buf{i}"], types)
        return self.decoder(self.norm(x[:, -1]))
