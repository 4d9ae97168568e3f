"""History MLP, the floor: the flattened window of the last ``context`` steps -> MLP -> actions.

The input at step t is [x_{t-n+1}, m_{t-n+1}, ..., x_t, m_t] (x = obs [+ rtg], m = 1 for a real step,
0 for padding/absent history, whose x is zeroed), so a left-padded window equals zero history.
``step`` keeps the same n-step buffer per env.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from quadforge.models.base import Cache, Decoder, SequenceModel


class HistoryMLP(SequenceModel):
    name = "mlp"

    def __init__(self, obs_dim: int, action_dim: int = 12, context: int = 8, hidden: int = 256,
                 num_layers: int = 2, decoder_hidden: int = 128, use_rtg: bool = False):
        super().__init__(obs_dim, action_dim, context, use_rtg=use_rtg, use_actions=False)
        if num_layers < 1:
            raise ValueError(f"mlp num_layers={num_layers}; must be >= 1")
        self.hidden, self.num_layers, self.decoder_hidden = hidden, num_layers, decoder_hidden
        self.frame = obs_dim + int(use_rtg) + 1
        dims = [context * self.frame] + [hidden] * num_layers
        self.body = nn.Sequential(*[m for a, b in zip(dims[:-1], dims[1:]) for m in (nn.Linear(a, b), nn.GELU())])
        self.decoder = Decoder(hidden, decoder_hidden, action_dim)

    @property
    def config(self) -> dict:
        return dict(obs_dim=self.obs_dim, action_dim=self.action_dim, context=self.context, hidden=self.hidden,
                    num_layers=self.num_layers, decoder_hidden=self.decoder_hidden, use_rtg=self.use_rtg)

    def _frames(self, obs, rtg, mask) -> torch.Tensor:
        x = torch.cat([obs, rtg], dim=-1) if self.use_rtg else obs
        m = mask.to(x.dtype).unsqueeze(-1)
        return torch.cat([x * m, m], dim=-1)                                    # (..., frame)

    def forward(self, obs, actions=None, rtg=None, mask=None) -> torch.Tensor:
        mask = self.check_window(obs, actions, rtg, mask)
        b, t = mask.shape
        frames = F.pad(self._frames(obs, rtg, mask), (0, 0, self.context - 1, 0))  # (B, n-1+T, F)
        windows = frames.unfold(1, self.context, 1)                              # (B, T, F, n)
        flat = windows.transpose(2, 3).reshape(b, t, self.context * self.frame)
        return self.decoder(self.body(flat))

    def _init_state(self, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        return {"frames": torch.zeros(batch_size, self.context, self.frame, dtype=self._float_dtype(), device=device)}

    def _step(self, obs_t, cache: Cache, action_prev, rtg_t) -> torch.Tensor:
        buf = cache.state["frames"]
        new = self._frames(obs_t, rtg_t, torch.ones(obs_t.shape[0], dtype=torch.bool, device=obs_t.device))
        buf.copy_(torch.cat([buf[:, 1:], new.unsqueeze(1)], dim=1))
        return self.decoder(self.body(buf.reshape(obs_t.shape[0], -1)))
