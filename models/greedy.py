"""Greedy decoding of discretised action dimensions one after another (GeRM, Q-Transformer).

Dimension i's bin is chosen after dimensions < i: the argmax of head i's logits, then that bin enters the
decoder as a token (reusing the key/value cache) and head i+1 reads the new position. The proprioceptive
GeRM (``germ.py``) and the vision-language GeRM (``germ_vla.py``) differ only in how a chosen bin becomes
the next logits, which they pass in as ``advance``.
"""
from __future__ import annotations

from typing import Callable

import torch


@torch.no_grad()
def greedy_bins(first_logits: torch.Tensor, advance: Callable[[torch.Tensor, int], torch.Tensor],
                action_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``first_logits`` (B, K) of dimension 0; ``advance(best, i)`` feeds dimension i's chosen bins (B,)
    and returns dimension i+1's logits (B, K). Returns the bins (B, d) and their Q values σ(logit) (B, d)."""
    logits, chosen, values = first_logits, [], []
    for i in range(action_dim):
        best = logits.argmax(-1)                                       # (B,)
        chosen.append(best)
        values.append(torch.sigmoid(logits.gather(-1, best[:, None])[:, 0]))
        if i < action_dim - 1:
            logits = advance(best, i)
    return torch.stack(chosen, 1), torch.stack(values, 1)
