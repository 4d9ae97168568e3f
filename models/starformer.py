"""StARformer (seed 004) for vector states.

Per step t, local tokens: every state dimension i -> s_t[i] * w + b + e_i (Linear(1, local_dim) plus a
learned per-dimension embedding), the previous action a_{t-1} (Linear(A, local_dim)) and, with
use_rtg, the return-to-go R_t. Layer l:

    local^l  = StepBlock(local^{l-1})                     (full attention within the step only)
    g_t^l    = Linear(flatten(local^l_t)) + pos_t          (one "step token" per step)
    [.., g_t^l, h_t^l, ..] = CausalBlock([.., g_t^l, h_t^{l-1}, ..])   (sequence layer, causal)

with h_t^0 = Linear(s_t) + pos_t, and actions decoded from h^L (the state positions). The sequence
mask is plainly causal over (g_1, h_1, g_2, h_2, ...): the official code's mask entry [0, -1] lets the
first token see the last one when the window is full - a future leak we do not copy (tested by the
causality test). Recurrent ``step``: the step transformer needs only the current step; the sequence
layers keep a KV cache of 2 * context slots.
"""
from __future__ import annotations

import torch
from torch import nn

from quadforge.models.base import Cache, Decoder, SequenceModel
from quadforge.models.transformer import Block, allowed_keys, empty_kv_cache


class StARformer(SequenceModel):
    name = "starformer"

    def __init__(self, obs_dim: int, action_dim: int = 12, context: int = 64, hidden: int = 128,
                 local_dim: int = 16, num_layers: int = 3, num_heads: int = 4, local_heads: int = 2,
                 ffn_mult: int = 4, decoder_hidden: int = 128, use_rtg: bool = False, use_actions: bool = True,
                 pos_init_std: float = 1.0):
        super().__init__(obs_dim, action_dim, context, use_rtg=use_rtg, use_actions=use_actions)
        if not pos_init_std >= 0:
            raise ValueError(f"starformer pos_init_std={pos_init_std}; must be >= 0")
        self.hidden, self.local_dim, self.num_layers = hidden, local_dim, num_layers
        self.num_heads, self.local_heads, self.ffn_mult, self.decoder_hidden = num_heads, local_heads, ffn_mult, decoder_hidden
        self.num_local = obs_dim + int(use_actions) + int(use_rtg)
        self.state_value = nn.Linear(1, local_dim)                       # shared over state dimensions
        self.dim_embed = nn.Parameter(torch.randn(obs_dim, local_dim) * 0.02)
        self.action_local = nn.Linear(action_dim, local_dim) if use_actions else None
        self.rtg_local = nn.Linear(1, local_dim) if use_rtg else None
        self.state_embed = nn.Linear(obs_dim, hidden)
        # torch's Embedding default N(0, 1): unlike the Transformer's, StARformer's sweep preferred it to
        # GPT-2's 0.02 (docs/models.md "Equal-budget tuning"); a knob so both can be swept alike
        self.pos_init_std = float(pos_init_std)
        self.pos_embed = nn.Embedding(context, hidden)
        nn.init.normal_(self.pos_embed.weight, std=self.pos_init_std)
        self.step_blocks = nn.ModuleList(Block(local_dim, local_heads, ffn_mult) for _ in range(num_layers))
        self.step_proj = nn.ModuleList(nn.Linear(self.num_local * local_dim, hidden) for _ in range(num_layers))
        self.seq_blocks = nn.ModuleList(Block(hidden, num_heads, ffn_mult) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden)
        self.decoder = Decoder(hidden, decoder_hidden, action_dim)

    @property
    def config(self) -> dict:
        return dict(obs_dim=self.obs_dim, action_dim=self.action_dim, context=self.context, hidden=self.hidden,
                    local_dim=self.local_dim, num_layers=self.num_layers, num_heads=self.num_heads,
                    local_heads=self.local_heads, ffn_mult=self.ffn_mult, decoder_hidden=self.decoder_hidden,
                    use_rtg=self.use_rtg, use_actions=self.use_actions, pos_init_std=self.pos_init_std)

    def _local_tokens(self, obs, action_prev, rtg) -> torch.Tensor:
        # obs (..., D) -> (..., N_local, local_dim)
        toks = [self.state_value(obs.unsqueeze(-1)) + self.dim_embed]
        if self.use_actions:
            toks.append(self.action_local(action_prev).unsqueeze(-2))
        if self.use_rtg:
            toks.append(self.rtg_local(rtg).unsqueeze(-2))
        return torch.cat(toks, dim=-2)

    def forward(self, obs, actions=None, rtg=None, mask=None) -> torch.Tensor:
        mask = self.check_window(obs, actions, rtg, mask)
        b, t = mask.shape
        action_prev = None
        if self.use_actions:   # a_{t-1}; zero at the window's (or episode's) first step
            shifted = actions * mask.unsqueeze(-1).to(actions.dtype)
            action_prev = torch.cat([torch.zeros_like(shifted[:, :1]), shifted[:, :-1]], dim=1)
        pos = self.pos_embed(self.positions(mask))                                  # (B, T, d)
        local = self._local_tokens(obs, action_prev, rtg).reshape(b * t, self.num_local, self.local_dim)
        h = self.state_embed(obs) + pos                                             # (B, T, d)
        valid = mask.repeat_interleave(2, dim=1)                                    # (B, 2T)
        slot = torch.arange(2 * t, device=obs.device)
        allowed = allowed_keys(valid, slot, slot.expand(b, -1))
        everyone = torch.ones(1, 1, self.num_local, self.num_local, dtype=torch.bool, device=obs.device)
        for step_block, proj, seq_block in zip(self.step_blocks, self.step_proj, self.seq_blocks):
            local = step_block(local, everyone)                                     # (B*T, N, e)
            g = proj(local.reshape(b, t, -1)) + pos                                 # (B, T, d)
            seq = torch.stack([g, h], dim=2).reshape(b, 2 * t, -1)                  # g_1, h_1, g_2, h_2 ...
            h = seq_block(seq, allowed)[:, 1::2]
        return self.decoder(self.norm(h))

    def _init_state(self, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        return empty_kv_cache(batch_size, 2 * self.context, self.num_layers, self.num_heads, self.hidden, device,
                              self._float_dtype())

    def _step(self, obs_t, cache: Cache, action_prev, rtg_t) -> torch.Tensor:
        b = obs_t.shape[0]
        pos = cache.pos
        if self.use_actions:   # the block's first step has no a_{t-1} in its window
            action_prev = action_prev * (pos > 0).unsqueeze(-1).to(action_prev.dtype)
        p = self.pos_embed(pos)                                                     # (B, d)
        local = self._local_tokens(obs_t, action_prev, rtg_t)                       # (B, N, e)
        h = self.state_embed(obs_t) + p
        slots = torch.stack([2 * pos, 2 * pos + 1], dim=1)                          # (B, 2)
        rows = torch.arange(b, device=obs_t.device).unsqueeze(1)
        cache.state["valid"][rows, slots] = True
        allowed = allowed_keys(cache.state["valid"], torch.arange(2 * self.context, device=obs_t.device), slots)
        everyone = torch.ones(1, 1, self.num_local, self.num_local, dtype=torch.bool, device=obs_t.device)
        for i, (step_block, proj, seq_block) in enumerate(zip(self.step_blocks, self.step_proj, self.seq_blocks)):
            local = step_block(local, everyone)
            g = proj(local.reshape(b, -1)) + p
            seq = torch.stack([g, h], dim=1)                                        # (B, 2, d)
            h = seq_block.step(seq, cache.state[f"k{i}"], cache.state[f"v{i}"], slots, allowed)[:, 1]
        return self.decoder(self.norm(h))
