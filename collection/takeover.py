"""The expert takes over from the learner's states: are a DAgger labeller's labels good where the learner goes?

DAgger (``collection.relabel``) trains a learner on the expert's labels of the states the learner itself
visits. That helps only if the expert acts well from those states: a scripted expert is written for the
states it visits itself. This check answers it directly: the learner drives the first ``K`` control
steps of every episode, then the expert drives to the end. The expert has acted (unapplied) on every step
before, so its memory (waypoints passed, gait clock) follows the states, as it does when it labels.
Success after a late take-over near the expert's own says the labels are good there; failures the learner
alone does not have say they are not.

    python -m quadforge.collection.takeover CHECKPOINT --task quard:go_avoid --after 100,200,300 --episodes 100

prints, per ``K``, the episode outcomes; ``K`` larger than an episode is the learner alone.
"""
from __future__ import annotations

import argparse
import collections
from typing import Any, Mapping, Sequence

import torch

from quadforge.collection.relabel import RelabelledPolicy
from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.envs.builder import make_env
from quadforge.experts.registry import policy_for_env


class TakeoverPolicy(RelabelledPolicy):
    """Policy protocol: ``driver`` acts for the first ``after_steps`` steps of every episode, then
    ``expert``; a ``RelabelledPolicy`` (the expert labels and acts on every step, so each one's state
    follows the episode) whose expert drives from step ``after_steps`` on."""

    def __init__(self, driver: Any, expert: Any, num_envs: int, after_steps: int):
        if after_steps < 0:
            raise ValueError(f"after_steps={after_steps}; must be >= 0")
        super().__init__(driver, expert, num_envs)
        self.after_steps = int(after_steps)
        self.policy_id = f"takeover(drive={self.driver.policy_id},then={self.labeller.policy_id},after={after_steps})"
        self.steps = torch.zeros(int(num_envs), dtype=torch.long, device=self.device)

    def reset(self, env_ids: torch.Tensor) -> None:
        super().reset(env_ids)
        self.steps[torch.as_tensor(env_ids, device=self.device).long().flatten()] = 0

    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        driven = super().act(obs)
        took_over = (self.steps >= self.after_steps).to(driven.device)
        self.steps += 1
        return torch.where(took_over[:, None], self.label_actions, driven)


def takeover_outcomes(spec: str, task: str, after: Sequence[int], episodes: int, expert: str = "quard_expert",
                      num_envs: int = 10, seed: int = 0) -> dict[int, dict[str, int]]:
    """Per take-over step ``K``: the outcome counts of ``episodes`` episodes (the same scenes for every K: each
    env's first episodes, ``Rollout.first_episodes``, not the first to finish, which favour quick outcomes)."""
    torch.set_num_threads(1)
    out: dict[int, dict[str, int]] = {}
    for k in after:
        env = make_env(task=task, num_envs=num_envs, seed=seed, task_options={"images": True})
        try:
            policy = TakeoverPolicy(policy_for_env(spec, env), policy_for_env(expert, env), env.num_envs, k)
            rollout = Rollout(env, policy, RolloutConfig(record=False, seed=seed))
            counts = collections.Counter(str(ep.info["quard_outcome"]) for ep in rollout.first_episodes(episodes))
        finally:
            env.close()
        out[int(k)] = dict(sorted(counts.items()))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m quadforge.collection.takeover", description=__doc__.split("\n")[0])
    p.add_argument("policy", help="the learner: a checkpoint or policy spec")
    p.add_argument("--task", default="quard:go_avoid", help="a quard:<family> task (default quard:go_avoid)")
    p.add_argument("--after", default="100,200,300", help="control steps before the expert takes over (comma list)")
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--expert", default="quard_expert")
    p.add_argument("--num-envs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        after = [int(x) for x in str(a.after).split(",") if x.strip()]
    except ValueError:
        p.error(f"--after {a.after!r}: a comma list of control steps, e.g. 100,200,300")
    if not after or min(after) < 0 or a.episodes < 1:
        p.error(f"--after {a.after!r} and --episodes {a.episodes}: steps >= 0 and at least one episode")
    for k, counts in takeover_outcomes(a.policy, a.task, after, a.episodes, a.expert, a.num_envs, a.seed).items():
        print(f"expert takes over after {k} control steps: {counts}", flush=True)


if __name__ == "__main__":
    main()
