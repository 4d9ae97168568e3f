"""Relabelling by the expert (DAgger's data): a learner drives, the expert labels every state visited.

Imitation trained only on the expert's own states meets states the expert never visits as soon as its
small errors compound (Ross et al. 2011, DAgger). The platform's expert is a program
(``experts.gait.GaitController``) that can act from any state, so a collection can let the learned
policy drive and store what the expert would have done at each step instead: ``actions`` holds the
label (the imitation target every trainer reads) and ``applied_actions`` what was applied
(``collection.rollout`` records both when a policy exposes ``label_actions``). A hierarchical labeller's
high-level command is the label of ``hl_commands`` likewise (the 12-D command a VLA imitates), so a VLA
can drive the QUARD tasks while the privileged expert labels its states.

The expert runs alongside the driver on the same observations, so its own state (gait clock,
integrators, lift-off points) follows the states the driver visits, as it would if it were taking
over at that step. DAgger's mixture ``pi_i = beta pi* + (1 - beta) pi_hat``: with
``expert_drive_prob`` = beta each episode is driven by the expert itself (per env, drawn at every
reset from a seeded stream), the rest by the learner.
"""
from __future__ import annotations

from typing import Mapping

import torch

from quadforge.experts.policy import check_policy, compile_experts
from quadforge.seeding import torch_generator


class RelabelledPolicy:
    """Policy protocol: acts with ``driver`` (or, per episode with probability ``expert_drive_prob``,
    with ``labeller``) and exposes the labeller's action of the same step as ``label_actions``."""

    action_space = "joint"

    def __init__(self, driver, labeller, num_envs: int, expert_drive_prob: float = 0.0, seed: int = 0,
                 device: str | torch.device = "cpu"):
        driver, labeller = check_policy(driver), check_policy(labeller)
        for role, p in (("driver", driver), ("labeller", labeller)):
            if p.action_space != "joint" or int(p.action_dim) != int(labeller.action_dim):
                raise ValueError(f"RelabelledPolicy: the {role} {p.policy_id!r} emits {p.action_space!r} actions "
                                 f"of width {p.action_dim}; both must emit the same 'joint' actions")
        if not 0.0 <= expert_drive_prob <= 1.0:
            raise ValueError(f"expert_drive_prob={expert_drive_prob}; must be in [0, 1]")
        self.driver, self.labeller = driver, labeller
        self.action_dim = int(labeller.action_dim)
        self.obs_terms = tuple(dict.fromkeys(tuple(driver.obs_terms) + tuple(labeller.obs_terms)))
        self.policy_id = f"dagger(drive={driver.policy_id},label={labeller.policy_id},beta={expert_drive_prob:g})"
        self.expert_drive_prob = float(expert_drive_prob)
        self.device = torch.device(device)
        self._gen = torch_generator(seed, "dagger/expert_drives", self.device)
        self.expert_drives = torch.zeros(int(num_envs), dtype=torch.bool, device=self.device)
        self.label_actions: torch.Tensor | None = None

    def reset(self, env_ids: torch.Tensor) -> None:
        ids = torch.as_tensor(env_ids, device=self.device).long().flatten()
        self.driver.reset(ids)
        self.labeller.reset(ids)
        if self.expert_drive_prob > 0:
            draw = torch.rand(len(ids), generator=self._gen, device=self.device)
            self.expert_drives[ids] = draw < self.expert_drive_prob

    def compile_expert(self) -> None:
        """``--compile-expert``: the driver's and the labeller's model-based parts through torch.compile."""
        compile_experts(self.driver, self.labeller)

    @property
    def hl_commands(self) -> torch.Tensor | None:
        """The labeller's high-level command of this step (hierarchical labellers, e.g. the QUARD expert):
        what a vision-language policy imitates, so a relabelled store's ``hl_commands`` are labels too."""
        return getattr(self.labeller, "hl_commands", None)

    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        label = self.labeller.act(obs)
        driven = self.driver.act(obs)
        self.label_actions = label
        if self.expert_drive_prob > 0:
            driven = torch.where(self.expert_drives.unsqueeze(-1), label, driven)
        return driven
