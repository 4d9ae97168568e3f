"""GeRM Q-network (seed 003 §IV-B/C) with Q-Transformer's per-dimension autoregressive Q heads.

A decoder-only causal transformer reads one token per past observation (a context window of n steps,
left-padded at episode starts), then one token per action dimension already chosen:

    [o_{t-n+1} .. o_t, a_t^0, a_t^1, .., a_t^{d-2}]          (B, n + d - 1, d_model)

The output at o_t gives the Q-logits of dimension 0; the output at a_t^{i-1} gives those of dimension i,
so dimension i sees the state tokens and the bins chosen for dimensions < i. Each dimension has its own
head (bins logits); ``Q = sigmoid(logit)`` lies in [0, 1] like the sparse-reward return it estimates.
Training feeds the dataset's bins (teacher forcing, one pass); acting decodes greedily dimension by
dimension with the same heads, reusing a key/value cache so each extra dimension costs one token.

FFNs are sparse MoE layers (``models.moe``) or, for the GeRM w/o MoE baseline, dense FFNs;
``GeRMConfig.dense_matched()`` sizes the dense FFN to the MoE's *active* parameters.

The observation encoder is pluggable: ``proprio`` (the layout vector: proprioception + command/task
features, normalised with dataset statistics held as buffers) is implemented; ``image`` and
``instruction`` tokens (seed 003's EfficientNet+FiLM+TokenLearner, sentence encoder) are not yet.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, NamedTuple

import torch
from torch import nn

from quadforge.models.decoder import BinHeads, Decoder, KVCache
from quadforge.models.greedy import greedy_bins
from quadforge.models.moe import MoEConfig, matched_dense_hidden

ENCODERS = ("proprio", "image", "instruction")


@dataclass
class GeRMConfig:
    obs_dim: int
    action_dim: int = 12
    num_bins: int = 256
    context: int = 8              # observation tokens per window (seed 003 uses 6 images)
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    ffn_hidden: int = 256         # per expert when moe, else the dense FFN width
    moe: bool = True
    num_experts: int = 8
    top_k: int = 2
    noisy_gating: bool = True
    balance: str = "cv2"
    balance_weight: float = 1e-2
    z_loss_weight: float = 0.0
    dropout: float = 0.0
    encoder: str = "proprio"

    def validate(self) -> None:
        if self.encoder not in ENCODERS:
            raise ValueError(f"GeRM encoder {self.encoder!r} unknown; allowed: {ENCODERS}")
        for name in ("obs_dim", "action_dim", "context", "d_model", "num_layers", "num_heads", "ffn_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"GeRM {name} must be >= 1, got {getattr(self, name)}")
        if self.num_bins < 2:
            raise ValueError(f"GeRM num_bins must be >= 2, got {self.num_bins}")
        if self.d_model % self.num_heads:
            raise ValueError(f"GeRM d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        if self.moe:
            self.moe_config().validate()

    def moe_config(self) -> MoEConfig:
        return MoEConfig(dim=self.d_model, hidden=self.ffn_hidden, num_experts=self.num_experts,
                         top_k=self.top_k, noisy=self.noisy_gating, balance=self.balance,
                         balance_weight=self.balance_weight, z_loss_weight=self.z_loss_weight,
                         dropout=self.dropout)

    def dense_matched(self) -> "GeRMConfig":
        """GeRM w/o MoE: the same network with dense FFNs at the MoE's active parameter count."""
        if not self.moe:
            return dataclasses.replace(self)
        return dataclasses.replace(self, moe=False, ffn_hidden=matched_dense_hidden(self.moe_config()))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "GeRMConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"GeRM config has unknown fields {unknown}; known: {sorted(known)}")
        return cls(**dict(d))


class GeRMOutput(NamedTuple):
    logits: torch.Tensor    # (B, m, bins) Q-logits of dimensions 0..m-1
    aux_loss: torch.Tensor  # () summed MoE balance/z losses


class ProprioEncoder(nn.Module):
    """Normalised layout vector -> one token: (B, n, obs_dim) -> (B, n, d_model)."""

    def __init__(self, obs_dim: int, d_model: int):
        super().__init__()
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))
        self.net = nn.Sequential(nn.Linear(obs_dim, d_model), nn.GELU(), nn.Linear(d_model, d_model))

    def set_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.obs_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.obs_std.copy_(torch.as_tensor(std, dtype=torch.float32).clamp_min(1e-6))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(((obs - self.obs_mean) / self.obs_std).clamp(-10.0, 10.0))


def build_encoder(cfg: GeRMConfig) -> nn.Module:
    if cfg.encoder == "proprio":
        return ProprioEncoder(cfg.obs_dim, cfg.d_model)
    raise NotImplementedError(
        f"GeRM encoder {cfg.encoder!r} is not part of this proprioceptive GeRM: over camera frames and "
        "instructions GeRM is models/germ_vla.py (quadforge train --model germ on an image store, "
        "docs/vla.md); use encoder='proprio' here")


def attention_mask(key_valid: torch.Tensor, num_new: int) -> torch.Tensor:
    """(B, 1, L, S) mask for the last L=num_new of S=key_valid.shape[1] positions: causal, padded keys
    skipped, but a token always sees itself (a padded query must not be all -inf)."""
    s = key_valid.shape[1]
    q_pos = torch.arange(s - num_new, s, device=key_valid.device)[:, None]   # (L, 1)
    k_pos = torch.arange(s, device=key_valid.device)[None, :]                 # (1, S)
    return (k_pos <= q_pos) & key_valid[:, None, None, :] | (k_pos == q_pos)


class GeRM(nn.Module):
    def __init__(self, cfg: GeRMConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        d, n, a, bins = cfg.d_model, cfg.context, cfg.action_dim, cfg.num_bins
        self.encoder = build_encoder(cfg)
        self.time_pos = nn.Parameter(torch.zeros(n, d))
        self.action_embed = nn.Embedding(max(1, (a - 1) * bins), d)   # bin b of dimension i -> row i*bins+b
        self.dim_pos = nn.Parameter(torch.zeros(max(1, a - 1), d))
        nn.init.normal_(self.time_pos, std=0.02)
        nn.init.normal_(self.dim_pos, std=0.02)
        self.decoder = Decoder(cfg)                                     # the VLAs' decoder (models.decoder)
        self.heads = BinHeads(a, bins, d)                               # one Q head per action dimension

    # checkpoints written before the decoder was shared name its parts blocks/ln_f/head_w/head_b
    _RENAMED = (("blocks.", "decoder.blocks."), ("ln_f.", "decoder.ln_f."), ("head_w", "heads.weight"),
                ("head_b", "heads.bias"))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for old, new in self._RENAMED:
            for key in [k for k in state_dict if k.startswith(prefix + old)]:
                state_dict[prefix + new + key[len(prefix + old):]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # --- parameter counts -----------------------------------------------------------------------
    def total_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def active_parameters(self) -> int:
        """Parameters used per token: the total minus the experts each MoE layer leaves unselected."""
        return self.total_parameters() - self.decoder.inactive_parameters()

    def set_obs_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.encoder.set_stats(mean, std)

    # --- token building -------------------------------------------------------------------------
    def _obs_tokens(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.ndim != 3 or obs.shape[1] != self.cfg.context or obs.shape[2] != self.cfg.obs_dim:
            raise ValueError(f"GeRM obs must be (B, context={self.cfg.context}, obs_dim={self.cfg.obs_dim}), "
                             f"got {tuple(obs.shape)}")
        return self.encoder(obs) + self.time_pos                        # (B, n, D)

    def _action_tokens(self, bins: torch.Tensor, first_dim: int = 0) -> torch.Tensor:
        """bins (B, m) of dimensions first_dim..first_dim+m-1 -> (B, m, D)."""
        m = bins.shape[1]
        dims = torch.arange(first_dim, first_dim + m, device=bins.device)
        return self.action_embed(dims * self.cfg.num_bins + bins) + self.dim_pos[first_dim:first_dim + m]

    def _head(self, h: torch.Tensor, first_dim: int) -> torch.Tensor:
        """h (B, m, D) (normed) -> logits (B, m, bins) through the heads of dimensions first_dim.."""
        return self.heads(h, first_dim)

    def _run(self, x: torch.Tensor, key_valid: torch.Tensor,
             caches: list[KVCache] | None) -> tuple[torch.Tensor, torch.Tensor, list[KVCache]]:
        """New tokens x (B, L, D) over the keys marked valid -> normed outputs, MoE aux loss, caches."""
        return self.decoder(x, attention_mask(key_valid, x.shape[1]), caches)

    # --- training: teacher-forced Q-logits ------------------------------------------------------
    def forward(self, obs: torch.Tensor, mask: torch.Tensor, prefix_bins: torch.Tensor | None = None) -> GeRMOutput:
        """Q-logits of dimensions 0..m given the dataset bins of dimensions 0..m-1.

        obs (B, n, obs_dim), mask (B, n) bool (False = left padding), prefix_bins (B, m) long with
        m <= d-1 (None = m 0) -> logits (B, m+1, bins).
        """
        b = obs.shape[0]
        x = self._obs_tokens(obs)
        valid = mask.bool()
        if prefix_bins is not None and prefix_bins.shape[1] > 0:
            if prefix_bins.shape[1] > self.cfg.action_dim - 1:
                raise ValueError(f"prefix_bins has {prefix_bins.shape[1]} dimensions; at most action_dim-1 = "
                                 f"{self.cfg.action_dim - 1}")
            x = torch.cat([x, self._action_tokens(prefix_bins)], dim=1)
            valid = torch.cat([valid, valid.new_ones(b, prefix_bins.shape[1])], dim=1)
        h, aux, _ = self._run(x, valid, None)
        n = self.cfg.context
        return GeRMOutput(self._head(h[:, n - 1:], 0), aux)

    # --- acting: greedy decoding, one dimension at a time ---------------------------------------
    @torch.no_grad()
    def greedy(self, obs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Argmax bins (B, d) and their Q values (B, d), choosing dimension i after dimensions < i."""
        state = {"valid": mask.bool()}
        h, _, state["caches"] = self._run(self._obs_tokens(obs), state["valid"], None)

        def advance(best: torch.Tensor, i: int) -> torch.Tensor:
            state["valid"] = torch.cat([state["valid"], state["valid"].new_ones(best.shape[0], 1)], dim=1)
            h, _, state["caches"] = self._run(self._action_tokens(best[:, None], i), state["valid"], state["caches"])
            return self._head(h, i + 1)[:, 0]

        return greedy_bins(self._head(h[:, -1:], 0)[:, 0], advance, self.cfg.action_dim)

    def step(self, obs: torch.Tensor, window: "ContextWindow") -> torch.Tensor:
        """One control step: push obs (N, obs_dim) into the per-env window, greedy-decode bins (N, d)."""
        seq, mask = window.push(obs)
        return self.greedy(seq, mask)[0]


class ContextWindow:
    """Per-env rolling window of the last n observations (left-padded like the training windows)."""

    def __init__(self, num_envs: int, context: int, obs_dim: int, device: str | torch.device = "cpu"):
        self.obs = torch.zeros(num_envs, context, obs_dim, device=device)
        self.mask = torch.zeros(num_envs, context, dtype=torch.bool, device=device)

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        ids = slice(None) if env_ids is None else torch.as_tensor(env_ids, device=self.obs.device).long()
        self.obs[ids] = 0.0
        self.mask[ids] = False

    def push(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if obs.shape != (self.obs.shape[0], self.obs.shape[2]):
            raise ValueError(f"observation batch must be (num_envs={self.obs.shape[0]}, obs_dim={self.obs.shape[2]}), "
                             f"got {tuple(obs.shape)}")
        self.obs = torch.cat([self.obs[:, 1:], obs[:, None].to(self.obs)], dim=1)
        self.mask = torch.cat([self.mask[:, 1:], self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        return self.obs, self.mask
