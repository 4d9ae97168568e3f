"""Decision-Transformer token layout shared by the Transformer and Decision ConvFormer.

Each step t contributes k = 1 + use_rtg + use_actions tokens in the order (R_t, s_t, a_t); the action
is predicted from the state token, so a_t's token only influences later steps. Token j of step t
sits at slot t*k + j. In recurrent ``step`` mode a step's chunk is (a_{t-1}, R_t, s_t): the previous
action's token can only be made once that action is known. At a block's first step there is no
a_{t-1} in the window, so that token is marked invalid (the models treat it as absent).
"""
from __future__ import annotations

import torch
from torch import nn

RTG, STATE, ACTION = 0, 1, 2   # token types (DC uses one conv filter per type)


class StepTokens(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, hidden: int, use_rtg: bool, use_actions: bool):
        super().__init__()
        self.use_rtg, self.use_actions = use_rtg, use_actions
        self.types = ([RTG] if use_rtg else []) + [STATE] + ([ACTION] if use_actions else [])
        self.k = len(self.types)
        self.state_offset = self.types.index(STATE)
        self.embed_state = nn.Linear(obs_dim, hidden)
        self.embed_rtg = nn.Linear(1, hidden) if use_rtg else None
        self.embed_action = nn.Linear(action_dim, hidden) if use_actions else None

    def _embed(self, kind: int, obs, actions, rtg) -> torch.Tensor:
        if kind == STATE:
            return self.embed_state(obs)
        if kind == RTG:
            return self.embed_rtg(rtg)
        return self.embed_action(actions)

    def window(self, obs: torch.Tensor, actions: torch.Tensor | None, rtg: torch.Tensor | None,
               mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Interleaved tokens (B, T*k, d), their validity (B, T*k) and step index (B, T*k)."""
        b, t = mask.shape
        parts = [self._embed(kind, obs, actions, rtg) for kind in self.types]          # k x (B, T, d)
        tokens = torch.stack(parts, dim=2).reshape(b, t * self.k, -1)
        valid = mask.repeat_interleave(self.k, dim=1)
        return tokens, valid, torch.arange(t, device=obs.device).repeat_interleave(self.k)

    def type_ids(self, length: int, device: torch.device) -> torch.Tensor:
        """(L,) token type of every slot of an interleaved window."""
        return torch.as_tensor(self.types, device=device).repeat(length // self.k)

    def chunk(self, obs_t: torch.Tensor, action_prev: torch.Tensor, rtg_t: torch.Tensor | None,
              pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
        """One step's tokens (B, c, d), validity (B, c), slots (B, c) and types (c) for ``step``."""
        toks, valid, slots, types = [], [], [], []
        ones = torch.ones_like(pos, dtype=torch.bool)
        if self.use_actions:
            toks.append(self.embed_action(action_prev))
            valid.append(pos > 0)
            slots.append((pos - 1) * self.k + (self.k - 1))
            types.append(ACTION)
        for j, kind in enumerate(self.types):
            if kind == ACTION:
                continue
            toks.append(self._embed(kind, obs_t, None, rtg_t))
            valid.append(ones)
            slots.append(pos * self.k + j)
            types.append(kind)
        return torch.stack(toks, 1), torch.stack(valid, 1), torch.stack(slots, 1), types
