"""A measurement keeps each env's first episodes, not the first to finish (``Rollout.first_episodes``).

QUARD episodes end the moment they succeed or fail while a time-out runs to the limit, so the first N
episodes to finish over-sample quick outcomes and depend on ``num_envs``; and an original and a swapped
evaluation of the same scenes kept different scenes. The fake env below makes the bias exact: env i's
k-th episode is quick (2 steps) or slow (to the limit) by a rule on (i, k) known in advance.
"""
import pytest
import torch

from collection_fakes import ZeroPolicy
from quadforge.collection.rollout import Rollout, RolloutConfig, first_episode_pairs, first_episode_quotas
from quadforge.envs.quard.rules import OUTCOME_CODE
from quadforge.layout import COMMAND_NAMES

QUICK, SLOW = 2, 9


class TimedSceneEnv:
    """A QUARD-like env: env i's k-th episode is the scene (seed, i, k). ``quick(i, k, swapped)`` says
    whether it ends after QUICK steps (in ``quick_outcome``) or runs to the limit, SLOW steps (in
    ``slow_outcome``) - the outcome depends on the scene and the instruction set, never on the policy."""

    def __init__(self, num_envs, seed=0, swapped=False, quick=lambda i, k, swapped: i % 2 == 1,
                 quick_outcome="wrong_target", slow_outcome="success"):
        self.num_envs, self.seed, self.swapped, self.quick = num_envs, seed, swapped, quick
        self.quick_outcome, self.slow_outcome = quick_outcome, slow_outcome
        self.dt, self.max_episode_length, self.device = 0.02, SLOW + 1, torch.device("cpu")
        self.commands = torch.zeros(num_envs, len(COMMAND_NAMES))
        self.joint_targets = torch.zeros(num_envs, 12)
        self.t = torch.zeros(num_envs, dtype=torch.long)
        self.k = torch.zeros(num_envs, dtype=torch.long)

    def reset(self):
        self.t[:] = 0
        self.k[:] = 0

    def close(self):
        pass

    @property
    def terms(self):
        return {"commands": self.commands.clone(), "dof_pos": torch.zeros(self.num_envs, 12)}

    def task_params(self, i):
        return {"family": "go_to", "instruction": "go to the red cube", "seed": self.seed, "env_id": i,
                "episode": int(self.k[i])}

    def _quick(self, i):
        return bool(self.quick(i, int(self.k[i]), self.swapped))

    def step(self, actions):
        self.t += 1
        n = self.num_envs
        quick = torch.tensor([self._quick(i) for i in range(n)])
        dones = self.t >= torch.where(quick, QUICK, SLOW)
        outcome = torch.where(quick, OUTCOME_CODE[self.quick_outcome], OUTCOME_CODE[self.slow_outcome])
        timeout = dones & (outcome == OUTCOME_CODE["timeout"])
        episode = {"quard_outcome": outcome, "length": self.t.clone(), "termination_reason": torch.where(timeout, 1, 0),
                   "time_to_success": self.t.float() * self.dt, "path_length": torch.ones(n),
                   "obstacle_contacts": torch.zeros(n, dtype=torch.long)}
        self.t[dones] = 0
        self.k += dones.long()
        return None, torch.zeros(n), dones, {"time_outs": timeout, "episode_end": episode}


def _scene(ep):
    return (ep.info["task_params"]["episode"], ep.info["task_params"]["env_id"])


def test_quotas_are_each_envs_share_of_the_first_n_by_episode_index_then_env():
    assert first_episode_quotas([None] * 4, 8) == [2, 2, 2, 2]
    assert first_episode_quotas([None] * 4, 10) == [3, 3, 2, 2]
    assert first_episode_quotas([None] * 8, 3) == [1, 1, 1, 0, 0, 0, 0, 0]
    assert first_episode_quotas(["a", "b", "a"], 3) == [2, 3, 1]
    assert first_episode_pairs([None] * 3, 4) == {None: [(0, 0), (0, 1), (0, 2), (1, 0)]}
    assert first_episode_pairs(["a", "b", "a"], 3) == {"a": [(0, 0), (0, 2), (1, 0)], "b": [(0, 1), (1, 1), (2, 1)]}
    with pytest.raises(ValueError, match="integer >= 0"):
        first_episode_quotas([None], -1)


@pytest.mark.parametrize("num_envs,episodes", [(4, 8), (4, 10), (3, 7), (8, 3)])
def test_first_episodes_keeps_each_envs_first_episodes_where_the_first_to_finish_are_biased(num_envs, episodes):
    # odd envs' episodes fail quickly, even envs' succeed slowly: each env's first episodes hold both in
    # proportion, the first to finish are mostly the quick failures
    env = TimedSceneEnv(num_envs)
    kept = Rollout(env, ZeroPolicy(), RolloutConfig(record=False)).first_episodes(episodes)
    assert [_scene(ep) for ep in kept] == first_episode_pairs([None] * num_envs, episodes)[None]
    assert [int(ep.info["env_id"]) for ep in kept] == [i for _, i in first_episode_pairs([None] * num_envs, episodes)[None]]
    truth = sum(i % 2 == 0 for k, i in first_episode_pairs([None] * num_envs, episodes)[None]) / episodes
    assert sum(ep.info["success"] for ep in kept) / episodes == truth

    # the old rule on the same scenes: the first N to finish
    first_done = list(Rollout(TimedSceneEnv(num_envs), ZeroPolicy(), RolloutConfig(record=False))
                      .episodes(max_episodes=episodes))
    biased = sum(ep.info["success"] for ep in first_done) / episodes
    assert biased < truth   # quick failures crowd out the slow successes


def test_first_episodes_with_recorded_steps_and_zero_episodes():
    env = TimedSceneEnv(2)
    rollout = Rollout(env, ZeroPolicy(), RolloutConfig(record=True))
    kept = rollout.first_episodes(3)
    assert [_scene(ep) for ep in kept] == [(0, 0), (0, 1), (1, 0)]
    assert [len(ep.features["actions"]) for ep in kept] == [ep.length for ep in kept]
    assert rollout.first_episodes(0) == []
    with pytest.raises(ValueError, match="one group per env"):
        rollout.first_episodes_by_group(2, ["a"])


def _fake_quard_eval(monkeypatch, quick):
    """evaluate_task's module with ``make_env`` giving TimedSceneEnv (seeded, swapped as asked) and the zero
    policy: the evaluation's own code, on scenes whose timing is known."""
    import quadforge.evaluation.evaluate_task as et

    def make_env(robot, task, num_envs, seed, task_options, **_):
        return TimedSceneEnv(num_envs, seed=seed, swapped=task_options["swap_instruction"], quick=quick,
                             quick_outcome="success", slow_outcome="timeout")
    monkeypatch.setattr(et, "make_env", make_env)
    monkeypatch.setattr(et, "policy_for_env", lambda spec, env, robot, **_: ZeroPolicy())
    return et


def test_original_and_swapped_evaluations_keep_the_same_scenes_and_an_unbiased_rate(monkeypatch, tmp_path):
    # original instructions: scenes with i + k even end in a quick success, the rest time out; swapped
    # instructions succeed quickly on other scenes (i + 2k divisible by 3). The first N to finish kept
    # different scenes in the two runs (and a success rate above the scenes' own); each env's first
    # episodes are the same scenes in both, whatever ends when.
    quick = (lambda i, k, swapped: (i + 2 * k) % 3 == 0 if swapped else (i + k) % 2 == 0)
    et = _fake_quard_eval(monkeypatch, quick)
    num_envs, n = 4, 10
    result = et.evaluate_task(et.TaskEvalConfig(task="quard:go_to", policy="quard_expert", colours=("train",),
                                                instructions=("original", "swapped"), episodes=n, num_envs=num_envs,
                                                frames=False, out=str(tmp_path)), log=lambda _: None)
    original, swapped = result["families"]["train"]["go_to"], result["swapped"]["train"]["go_to"]
    pairs = first_episode_pairs([None] * num_envs, n)[None]
    assert original["scenes"] == swapped["scenes"] == [[i, k] for k, i in pairs]
    assert original["episodes"] == swapped["episodes"] == n
    assert original["success"] == sum(quick(i, k, False) for k, i in pairs) / n == 0.5
    assert swapped["follows"] == sum(quick(i, k, True) for k, i in pairs) / n
    assert result["overall"] == {"success": 0.5, "episodes": n}


def test_the_evaluated_rate_is_the_scenes_own_not_the_quick_ones(monkeypatch, tmp_path):
    # even envs' scenes succeed quickly, odd envs' time out: half the scenes succeed, at any number of envs;
    # the first 2 x num_envs to finish were the even envs' successes alone (1.0)
    et = _fake_quard_eval(monkeypatch, lambda i, k, swapped: i % 2 == 0)
    rates = []
    for num_envs in (2, 4):
        result = et.evaluate_task(et.TaskEvalConfig(task="quard:go_to", colours=("train",), episodes=2 * num_envs,
                                                    num_envs=num_envs, frames=False, out=str(tmp_path)),
                                  log=lambda _: None)
        rates.append(result["overall"]["success"])
    assert rates == [0.5, 0.5]
