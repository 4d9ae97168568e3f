"""GPT-style causal Transformer (the seed 000 baseline), optional Decision-Transformer token layout.

Pre-LN blocks ``x + Attn(LN(x))``, ``x + MLP(LN(x))`` (4x GELU MLP), a final LN and FCNet's decoder Q
on the state tokens. A learned embedding of the step's index within the window (counted from the first
real step, so left padding changes nothing) is added to all of a step's tokens, as in DT.

Recurrent ``step`` keeps a KV cache per layer, (B, S+1, H, dh) with S = context * k slots; every
token's keys/values are written at its slot, and attention looks at valid slots up to the query's.
Slot S is a scratch slot for tokens that do not exist (the a_{t-1} token at a block's first step).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from quadforge.models.base import Cache, Decoder, FeedForward, SequenceModel
from quadforge.models.step_plans import block_plan, block_step, ffn_step, live_params
from quadforge.models.tokens import StepTokens


def allowed_keys(key_valid: torch.Tensor, key_slot: torch.Tensor, query_slot: torch.Tensor) -> torch.Tensor:
    """(B, 1, Q, K) attention mask: valid keys at or before the query, and always the query itself
    (so a padding query never sees an empty row)."""
    earlier = key_slot[None, None, :] <= query_slot[:, :, None]                    # (B, Q, K)
    same = key_slot[None, None, :] == query_slot[:, :, None]
    return ((key_valid[:, None, :] & earlier) | same).unsqueeze(1)


def empty_kv_cache(batch_size: int, slots: int, num_layers: int, num_heads: int, hidden: int,
                   device: torch.device, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A KV cache with ``slots`` empty positions per layer (``valid`` says which hold a key), in ``dtype``
    (the model's precision)."""
    shape = (batch_size, slots, num_heads, hidden // num_heads)
    state = {"valid": torch.zeros(batch_size, slots, dtype=torch.bool, device=device)}
    for i in range(num_layers):
        state[f"k{i}"] = torch.zeros(shape, dtype=dtype, device=device)
        state[f"v{i}"] = torch.zeros(shape, dtype=dtype, device=device)
    return state


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"transformer hidden={hidden} must be divisible by num_heads={heads}")
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, l, _ = x.shape
        return self.qkv(x).view(b, l, 3, self.heads, self.head_dim).unbind(2)      # 3 x (B, L, H, dh)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        b, l, d = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._split(x))                      # (B, H, L, dh)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.proj(y.transpose(1, 2).reshape(b, l, d))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn_mult: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads)
        self.mlp = FeedForward(hidden, ffn_mult * hidden)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), allowed)
        return x + self.mlp(self.norm2(x))

    def step(self, x, keys, values, slots, allowed) -> torch.Tensor:
        rows = torch.arange(x.shape[0], device=x.device).unsqueeze(1)
        return block_step(x, block_plan(self), keys, values, rows, slots, allowed)


class Transformer(SequenceModel):
    name = "transformer"

    def __init__(self, obs_dim: int, action_dim: int = 12, context: int = 64, hidden: int = 128,
                 num_layers: int = 4, num_heads: int = 4, ffn_mult: int = 4, decoder_hidden: int = 128,
                 use_rtg: bool = False, use_actions: bool = False, pos_init_std: float = 0.02):
        super().__init__(obs_dim, action_dim, context, use_rtg=use_rtg, use_actions=use_actions)
        if not pos_init_std >= 0:
            raise ValueError(f"transformer pos_init_std={pos_init_std}; must be >= 0")
        self.hidden, self.num_layers, self.num_heads = hidden, num_layers, num_heads
        self.ffn_mult, self.decoder_hidden = ffn_mult, decoder_hidden
        self.tokens = StepTokens(obs_dim, action_dim, hidden, use_rtg, use_actions)
        # N(0, 0.02) as GPT-2/nanoGPT: torch's Embedding default N(0, 1) is ~2x the state tokens' scale
        # (a Linear of normalised obs) and cost this baseline the seed 000 comparison (issue 17 sweep)
        self.pos_init_std = float(pos_init_std)
        self.pos_embed = nn.Embedding(context, hidden)
        nn.init.normal_(self.pos_embed.weight, std=self.pos_init_std)
        self.blocks = nn.ModuleList(Block(hidden, num_heads, ffn_mult) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden)
        self.decoder = Decoder(hidden, decoder_hidden, action_dim)
        self._plan: tuple | None = None   # built by the first step; holds live references only

    @property
    def config(self) -> dict:
        return dict(obs_dim=self.obs_dim, action_dim=self.action_dim, context=self.context, hidden=self.hidden,
                    num_layers=self.num_layers, num_heads=self.num_heads, ffn_mult=self.ffn_mult,
                    decoder_hidden=self.decoder_hidden, use_rtg=self.use_rtg, use_actions=self.use_actions,
                    pos_init_std=self.pos_init_std)

    def forward(self, obs, actions=None, rtg=None, mask=None) -> torch.Tensor:
        mask = self.check_window(obs, actions, rtg, mask)
        b, t = mask.shape
        k = self.tokens.k
        x, valid, step_idx = self.tokens.window(obs, actions, rtg, mask)             # (B, T*k, d)
        x = x + self.pos_embed(self.positions(mask)).repeat_interleave(k, dim=1)
        slot = torch.arange(t * k, device=obs.device)
        allowed = allowed_keys(valid, slot, slot.expand(b, -1))
        for block in self.blocks:
            x = block(x, allowed)
        states = x[:, self.tokens.state_offset::k]                                    # (B, T, d)
        return self.decoder(self.norm(states))

    def _init_state(self, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        return empty_kv_cache(batch_size, self.context * self.tokens.k + 1, self.num_layers, self.num_heads,
                              self.hidden, device, self._float_dtype())

    def _step(self, obs_t, cache: Cache, action_prev, rtg_t) -> torch.Tensor:
        if self._plan is None or self._plan[-2].device != obs_t.device:
            q1, _, q2 = self.decoder
            scratch = self.context * self.tokens.k
            self._plan = ([block_plan(b) for b in self.blocks],
                          [(f"k{i}", f"v{i}") for i in range(self.num_layers)],
                          (self.norm.normalized_shape, self.norm.eps, live_params(self.norm)),
                          live_params(q1), live_params(q2), live_params(self.pos_embed),
                          torch.arange(scratch + 1, device=obs_t.device), scratch)
        blocks, names, (shape, eps, norm), q1, q2, pos_embed, slot_ids, scratch = self._plan
        x, valid, slots, types = self.tokens.chunk(obs_t, action_prev, rtg_t, cache.pos)  # (B, c, d)
        slots = torch.where(valid, slots, scratch)      # absent tokens write to the scratch slot
        x = x + F.embedding(slots.clamp_max(scratch - 1) // self.tokens.k, pos_embed["weight"])
        rows = torch.arange(x.shape[0], device=x.device).unsqueeze(1)
        key_valid = cache.state["valid"]
        key_valid[rows, slots] = valid
        allowed = allowed_keys(key_valid, slot_ids, slots)
        for plan, (k, v) in zip(blocks, names):
            x = block_step(x, plan, cache.state[k], cache.state[v], rows, slots, allowed)
        h = torch.layer_norm(x[:, -1], shape, norm["weight"], norm["bias"], eps)            # state token is last
        return ffn_step(h, q1, q2)
