"""A trained GeRM Q-network as a quadforge ``Policy`` (``experts/policy.py``).

Each env keeps its own window of the last ``context`` layout vectors (left-padded after a reset, as in
training); ``act`` pushes the current observation, decodes the argmax bin dimension by dimension and
returns the bin centres: normalised joint actions (``action_space="joint"``) or GeRM's 12-D high-level
command (``"command"``, for a low-level policy to execute).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

from quadforge.experts.policy import checkpoint_policy_id
from quadforge.layout import ObsLayout
from quadforge.models.binning import ActionBinner
from quadforge.models.checkpoint import latest_checkpoint, load_checkpoint, load_state
from quadforge.models.germ import ContextWindow, GeRM, GeRMConfig
from quadforge.models.registry import model_names

ACTION_FEATURES = {"actions": "joint", "hl_commands": "command"}


def action_space_of(feature: str) -> str:
    if feature not in ACTION_FEATURES:
        raise ValueError(f"GeRM action feature {feature!r} unknown; allowed: {sorted(ACTION_FEATURES)}")
    return ACTION_FEATURES[feature]


class GeRMPolicy:
    def __init__(self, model: GeRM, binner: ActionBinner, layout: ObsLayout, num_envs: int,
                 action_space: str = "joint", policy_id: str = "germ", device: str | torch.device = "cpu"):
        if binner.action_dim != model.cfg.action_dim or binner.num_bins != model.cfg.num_bins:
            raise ValueError(f"binner ({binner.action_dim} dims x {binner.num_bins} bins) does not fit the model "
                             f"({model.cfg.action_dim} x {model.cfg.num_bins})")
        if layout.dim != model.cfg.obs_dim:
            raise ValueError(f"layout {layout.name!r} has {layout.dim} dims, the model reads {model.cfg.obs_dim}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.binner = binner.to(self.device)
        self.layout = layout
        self.window = ContextWindow(num_envs, model.cfg.context, model.cfg.obs_dim, self.device)
        self.policy_id = policy_id
        self.obs_terms = layout.term_names
        self.action_space = action_space
        self.action_dim = model.cfg.action_dim

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        self.window.reset(env_ids)

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        x = self.layout.build({k: v.to(self.device).float() for k, v in obs.items() if k in self.obs_terms})
        return self.binner.decode(self.model.step(x, self.window))


def load_germ(path: str | Path, num_envs: int, device: str | torch.device = "cpu") -> GeRMPolicy:
    """A GeRM checkpoint (file or run directory) as a Policy for ``num_envs`` envs."""
    path = Path(path)
    if path.is_dir():
        path = latest_checkpoint(path)
    ckpt = load_checkpoint(path)
    if ckpt.extra.get("policy_kind") == "vla":
        raise ValueError(f"{path}: a vision-language GeRM checkpoint; load it with experts.vla.load_vla "
                         "(or experts.registry.load_policy)")
    if ckpt.model_name not in model_names(policy="germ"):
        raise ValueError(f"{path}: checkpoint holds model {ckpt.model_name!r}, not a GeRM model "
                         f"({', '.join(model_names(policy='germ'))})")
    if "binner" not in ckpt.extra:
        raise ValueError(f"{path}: GeRM checkpoint lacks its bin edges (extra['binner'])")
    model = GeRM(GeRMConfig.from_dict(ckpt.model_config))
    load_state(model, ckpt)
    return GeRMPolicy(model, ActionBinner.from_dict(ckpt.extra["binner"]), ObsLayout.from_dict(ckpt.layout), num_envs,
                      action_space=ckpt.extra.get("action_space", "joint"),
                      policy_id=checkpoint_policy_id(ckpt.model_name, path, ckpt.state_dict, ckpt.model_config),
                      device=device)
