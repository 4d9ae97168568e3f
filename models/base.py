"""The one interface every imitation sequence model meets.

Training: ``forward(obs (B,T,D), actions=None, rtg=None, mask=None) -> actions (B,T,A)``, parallel over
a window of T <= context steps; the output at position t depends only on inputs at positions <= t
(``actions`` only at positions < t: a model with action tokens sees a_t only when predicting later
steps). ``mask`` (B,T) bool marks real steps; the samplers pad windows on the LEFT with mask False,
and every model treats masked steps as absent history, so a left-padded window gives the same
outputs at its real positions as the truncated window.

Deployment: ``init_cache(B)``, ``reset_cache(cache, env_ids)``, ``step(obs_t (B,D), cache) -> (B,A)``.
Deployment runs in blocks of ``context`` steps: a row's cache resets at episode start and after every
``context`` steps, so each action equals the forward pass over the window since the block started -
exactly the zero-history windows the model was trained on (FCNet's evaluation protocol). ``step`` and
``forward`` agree to float tolerance on the same window (tested for every model).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class Cache:
    """Recurrent state for a batch of envs. Every tensor in ``state`` has the batch first and is
    zeroed for the rows being reset; ``pos`` counts steps since each row's block started."""

    batch_size: int
    pos: torch.Tensor                                   # (B,) long
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    # an upper bound of max(pos) kept in Python, so the per-step "is any block full?" check needs no
    # tensor reduction until a block can actually be full
    max_pos: int = 0


class SequenceModel(nn.Module):
    """Base class: shape checks, block resets and the previous-action bookkeeping live here; a model
    implements ``forward``, ``_init_state`` and ``_step``."""

    name: str = "base"

    def __init__(self, obs_dim: int, action_dim: int, context: int, use_rtg: bool = False,
                 use_actions: bool = False):
        super().__init__()
        for key, value in (("obs_dim", obs_dim), ("action_dim", action_dim), ("context", context)):
            if int(value) < 1:
                raise ValueError(f"{self.name}: {key}={value}; must be >= 1")
        self.obs_dim, self.action_dim, self.context = int(obs_dim), int(action_dim), int(context)
        self.use_rtg, self.use_actions = bool(use_rtg), bool(use_actions)

    # --- config ------------------------------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        """kwargs that rebuild this model with ``build_model(self.name, **config)``."""
        raise NotImplementedError

    def num_parameters(self) -> int:
        """Trainable real parameters (a complex weight counts twice, as in the papers)."""
        return sum(p.numel() * (2 if p.is_complex() else 1) for p in self.parameters() if p.requires_grad)

    # --- parallel forward --------------------------------------------------------------------------
    def check_window(self, obs: torch.Tensor, actions: torch.Tensor | None, rtg: torch.Tensor | None,
                     mask: torch.Tensor | None) -> torch.Tensor:
        """Validate a window's shapes; return the (B,T) bool mask (all True when not given)."""
        if obs.ndim != 3 or obs.shape[-1] != self.obs_dim:
            raise ValueError(f"{self.name}: obs must be (B, T, {self.obs_dim}), got {tuple(obs.shape)}")
        b, t = obs.shape[:2]
        if t > self.context:
            raise ValueError(f"{self.name}: window length {t} exceeds the model context {self.context}")
        if self.use_actions:
            if actions is None or actions.shape != (b, t, self.action_dim):
                raise ValueError(f"{self.name}: use_actions=True needs actions (B, T, {self.action_dim}), "
                                 f"got {None if actions is None else tuple(actions.shape)}")
        if self.use_rtg:
            if rtg is None or rtg.shape != (b, t, 1):
                raise ValueError(f"{self.name}: use_rtg=True needs rtg (B, T, 1), "
                                 f"got {None if rtg is None else tuple(rtg.shape)}")
        if mask is None:
            return torch.ones(b, t, dtype=torch.bool, device=obs.device)
        if mask.shape != (b, t):
            raise ValueError(f"{self.name}: mask must be (B, T) = {(b, t)}, got {tuple(mask.shape)}")
        return mask.bool()

    @staticmethod
    def positions(mask: torch.Tensor) -> torch.Tensor:
        """(B,T) index of each step since the first real step (0 on the padding)."""
        return (mask.long().cumsum(1) - 1).clamp_min(0)

    # --- recurrent deployment ----------------------------------------------------------------------
    def init_cache(self, batch_size: int, device: torch.device | str | None = None) -> Cache:
        if int(batch_size) < 1:
            raise ValueError(f"{self.name}: batch_size={batch_size}; must be >= 1")
        device = torch.device(device) if device is not None else self._device()
        state = self._init_state(int(batch_size), device)
        state["last_action"] = torch.zeros(batch_size, self.action_dim, dtype=self._float_dtype(), device=device)
        return Cache(int(batch_size), torch.zeros(batch_size, dtype=torch.long, device=device), state)

    def reset_cache(self, cache: Cache, env_ids: torch.Tensor) -> None:
        """Forget the history of these rows (indices or a (B,) bool mask)."""
        if env_ids.dtype == torch.bool and env_ids.device.type != "cpu":
            # off the CPU a mask is written through, not gathered: indexing by a mask reads its count
            # back from the device (a GPU sync per control step once the envs' blocks are staggered)
            for t in cache.state.values():
                t.masked_fill_(env_ids.view(-1, *(1,) * (t.dim() - 1)), 0)
            cache.pos.masked_fill_(env_ids, 0)
            return
        for t in cache.state.values():
            t[env_ids] = 0
        cache.pos[env_ids] = 0

    @torch.inference_mode()
    def step(self, obs_t: torch.Tensor, cache: Cache, action_prev: torch.Tensor | None = None,
             rtg_t: torch.Tensor | None = None) -> torch.Tensor:
        """One control step for the batch: obs_t (B, D) -> action (B, A).

        ``action_prev`` (B, A) is the action applied at the previous step (default: this model's own
        previous output); ``rtg_t`` (B, 1) the return-to-go target when ``use_rtg``.
        """
        if obs_t.ndim != 2 or obs_t.shape[-1] != self.obs_dim:
            raise ValueError(f"{self.name}: obs_t must be (B, {self.obs_dim}), got {tuple(obs_t.shape)}")
        if obs_t.shape[0] != cache.batch_size:
            raise ValueError(f"{self.name}: cache was built for batch size {cache.batch_size}, "
                             f"got obs for {obs_t.shape[0]} envs; call init_cache({obs_t.shape[0]})")
        if self.use_rtg and (rtg_t is None or rtg_t.shape != (cache.batch_size, 1)):
            raise ValueError(f"{self.name}: use_rtg=True needs rtg_t (B, 1), "
                             f"got {None if rtg_t is None else tuple(rtg_t.shape)}")
        if cache.max_pos >= self.context:
            self.reset_cache(cache, cache.pos >= self.context)
            # off the CPU the exact max would be a read back per step: every row is below the context
            # now, so context - 1 bounds it (the check runs every step, as it does once blocks stagger)
            cache.max_pos = int(cache.pos.max()) if cache.pos.device.type == "cpu" else self.context - 1
        if action_prev is None:
            action_prev = cache.state["last_action"]
        # oneDNN serves float32 exact GELU with a ~5 us primitive setup per call; at deployment sizes
        # ATen's own vectorised erf GELU is the same function (tested) at ~1 us. Every model's step
        # gets the same kernels; training keeps the library default.
        onednn = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False
        try:
            out = self._step(obs_t, cache, action_prev, rtg_t)
        finally:
            torch.backends.mkldnn.enabled = onednn
        if self.use_actions:   # only action-token models read it; one op less on the latency path
            cache.state["last_action"].copy_(out)
        cache.pos += 1
        cache.max_pos += 1
        return out

    # --- for subclasses ----------------------------------------------------------------------------
    def _init_state(self, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _step(self, obs_t: torch.Tensor, cache: Cache, action_prev: torch.Tensor,
              rtg_t: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def _device(self) -> torch.device:
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def _float_dtype(self) -> torch.dtype:
        """The model's floating precision (its first floating parameter's): the deployment caches follow it,
        so ``step`` of a float64 model runs in float64 as ``forward`` does."""
        p = next((p for p in self.parameters() if p.is_floating_point()), None)
        return p.dtype if p is not None else torch.get_default_dtype()


class Decoder(nn.Sequential):
    """FCNet's position-wise decoder Q: Linear -> GELU -> Linear (hidden 128 in the seeds' tables)."""

    def __init__(self, hidden: int, decoder_hidden: int, action_dim: int):
        super().__init__(nn.Linear(hidden, decoder_hidden), nn.GELU(), nn.Linear(decoder_hidden, action_dim))


class FeedForward(nn.Sequential):
    """Position-wise two-layer FFN with GELU."""

    def __init__(self, dim: int, inner: int):
        super().__init__(nn.Linear(dim, inner), nn.GELU(), nn.Linear(inner, dim))
