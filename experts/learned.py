"""Deploy a sequence model trained by ``quadforge train`` as an ``experts.policy.Policy``.

``load_learned(path, num_envs, device)`` rebuilds the model from the checkpoint alone (model name +
config, observation layout, normalisation stats), checks the env's term widths against the ones the
model was trained on, and acts through the model's recurrent ``step`` with one cache row per env:
``reset(env_ids)`` clears those rows (episode start), and each row restarts every ``context`` steps
(the block protocol of ``models.base``). Return-conditioned models are driven with the
constant target return stored at training time (the Policy protocol carries no rewards, so the
return-to-go is not decremented online). GeRM checkpoints load through ``experts.germ_policy``; the
one entry point for any policy is ``experts.registry.load_policy``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

from quadforge.tensors import row_ids
from quadforge.layout import TERM_DIMS, ObsLayout
from quadforge.models.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, load_state
from quadforge.models import build_model
from quadforge.experts.policy import checkpoint_policy_id, given_terms


class LearnedPolicy:
    action_space = "joint"

    def __init__(self, ckpt: Checkpoint, num_envs: int, device: str | torch.device = "cpu", policy_id: str = ""):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs={num_envs}; must be >= 1")
        self.device = torch.device(device)
        self.num_envs = int(num_envs)
        self.layout = ObsLayout.from_dict(ckpt.layout)
        self.model = build_model(ckpt.model_name, **ckpt.model_config)
        load_state(self.model, ckpt)
        self.model.to(self.device).eval()
        if self.model.obs_dim != self.layout.dim:
            raise ValueError(f"checkpoint model reads {self.model.obs_dim}-D observations but its layout "
                             f"{self.layout.name!r} is {self.layout.dim}-D")
        stats = ckpt.obs_stats or {"mean": torch.zeros(self.layout.dim), "std": torch.ones(self.layout.dim)}
        self.obs_mean = stats["mean"].to(self.device)
        self.obs_std = stats["std"].to(self.device)
        self.term_dims = dict(ckpt.extra.get("term_dims") or {n: TERM_DIMS[n] for n in self.layout.term_names})
        self.obs_terms = self.layout.term_names
        self.action_dim = self.model.action_dim
        self.policy_id = policy_id or f"{ckpt.model_name}:step{ckpt.step}"
        self.rtg = None
        if self.model.use_rtg:
            target = ckpt.extra.get("target_return")
            if target is None:
                raise ValueError("return-conditioned checkpoint has no extra['target_return'] to deploy with")
            self.rtg = torch.full((self.num_envs, 1), float(target), device=self.device)
        with torch.no_grad():
            self.cache = self.model.init_cache(self.num_envs, self.device)

    def reset(self, env_ids: torch.Tensor | None) -> None:
        ids = torch.as_tensor(env_ids) if env_ids is not None else None
        if ids is None or ids.dtype != torch.bool:   # a mask goes as it is: reset_cache writes it through
            ids = row_ids(ids, self.num_envs, self.device, check_range="host")
        else:
            ids = ids.to(self.device)
        self.model.reset_cache(self.cache, ids)

    def check_terms(self, obs: Mapping[str, torch.Tensor]) -> None:
        for name in self.obs_terms:
            if name not in obs:
                raise ValueError(f"policy {self.policy_id} needs observation term {name!r}; {given_terms(obs)}")
            shape = tuple(obs[name].shape)
            want = (self.num_envs, self.term_dims[name])
            if shape != want:
                raise ValueError(f"observation term {name!r} has shape {shape}; this policy was loaded for "
                                 f"{self.num_envs} envs and its checkpoint reads {self.term_dims[name]} values of "
                                 f"the term: expected {want}")

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        self.check_terms(obs)
        x = self.layout.build({n: obs[n].to(self.device, torch.float32) for n in self.obs_terms})
        x = (x - self.obs_mean) / self.obs_std
        return self.model.step(x, self.cache, rtg_t=self.rtg)


def check_robot(ckpt: Checkpoint, robot: str | None, source: str) -> None:
    """A checkpoint records the robot its data came from; driving another one is an error (a go1 policy
    on aliengo "works" at 0 % success). Checkpoints from before the record pass."""
    trained = (ckpt.provenance or {}).get("robot")
    if robot is not None and trained and trained != robot:
        raise ValueError(f"{source}: trained on robot {trained!r} data, asked to drive {robot!r}; use --robot "
                         f"{trained} (or --allow-robot-mismatch to run it anyway)")


def load_learned(path: str | Path, num_envs: int, device: str | torch.device = "cpu") -> LearnedPolicy:
    """A model trained by ``quadforge train`` (file or run directory) as a Policy."""
    path = Path(path)
    if path.is_dir():
        path = latest_checkpoint(path)
    ckpt = load_checkpoint(path)
    return LearnedPolicy(ckpt, num_envs, device, policy_id=checkpoint_policy_id(ckpt.model_name, path, ckpt.state_dict, ckpt.model_config))
