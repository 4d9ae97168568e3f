"""The vision-language-action models by name (the trainer and the deployed policy build them here)."""
from __future__ import annotations

from torch import nn

from quadforge.training.models.germ_vla import GeRMVLA
from quadforge.training.models.rt1 import RT1
from quadforge.training.models.vla import VLAConfig

# rt1: RT-1-style; germ: GeRM (MoE, Q-learning); germ-dense: GeRM w/o MoE; germ-il: GeRM w/o RL
VLA_MODELS = ("rt1", "germ", "germ-dense", "germ-il")


def build_vla_model(name: str, cfg: VLAConfig) -> nn.Module:
    if name not in VLA_MODELS:
        raise ValueError(f"VLA model {name!r} unknown; allowed: {VLA_MODELS}")
    return RT1(cfg) if name == "rt1" else GeRMVLA(cfg)
