"""DAgger-style relabelling: the driver's actions move the env, the labeller's are stored as ``actions``."""
import numpy as np
import pytest
import torch

from quadforge.collection.collect import CollectConfig
from quadforge.collection.relabel import RelabelledPolicy
from quadforge.collection.rollout import Rollout, RolloutConfig
from collection_fakes import EchoPolicy, ScriptedEnv


class ScaledEcho(EchoPolicy):
    """A second, distinguishable policy: -3 x the observation."""

    policy_id = "scaled"

    def act(self, obs):
        return -3.0 * obs["dof_pos"]


def _episodes(beta: float, n: int = 12, seed: int = 0):
    env = ScriptedEnv(num_envs=3, max_episode_length=5)
    driver, labeller = EchoPolicy(), ScaledEcho()
    policy = RelabelledPolicy(driver, labeller, env.num_envs, expert_drive_prob=beta, seed=seed)
    return list(Rollout(env, policy, RolloutConfig()).episodes(max_episodes=n)), driver, labeller


def test_the_driver_acts_and_the_labeller_is_stored():
    episodes, driver, labeller = _episodes(0.0)
    for ep in episodes:
        dof = ep.features["dof_pos"]
        assert np.array_equal(ep.features["applied_actions"], dof)            # the driver moved the env
        assert np.array_equal(ep.features["joint_targets"], 0.5 * dof)
        assert np.allclose(ep.features["actions"], -3.0 * dof)                # the label is the target
        assert ep.info["policy_id"].startswith("dagger(drive=echo,label=scaled")
    assert driver.resets == labeller.resets                                   # both follow every reset


def test_beta_one_lets_the_labeller_drive_and_mixing_is_per_episode_and_seeded():
    episodes, _, _ = _episodes(1.0)
    for ep in episodes:
        assert np.allclose(ep.features["applied_actions"], ep.features["actions"])
    mixed, _, _ = _episodes(0.5, n=30)
    by_expert = [bool(np.allclose(ep.features["applied_actions"], ep.features["actions"])) for ep in mixed]
    assert 0 < sum(by_expert) < len(by_expert)                                # some of each, whole episodes
    for ep in mixed:   # never a mix of drivers within one episode
        expert_rows = np.isclose(ep.features["applied_actions"], ep.features["actions"]).all(axis=1)
        zero_rows = (ep.features["dof_pos"] == 0).all(axis=1)                 # echo == label when obs is 0
        assert expert_rows[~zero_rows].all() or not expert_rows[~zero_rows].any()
    again, _, _ = _episodes(0.5, n=30)
    assert [bool(np.allclose(e.features["applied_actions"], e.features["actions"])) for e in again] == by_expert


def test_bad_relabel_settings_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="relabel"):
        CollectConfig(out=str(tmp_path / "s"), episodes=1, relabel="ppo").validate()
    with pytest.raises(ValueError, match="is --policy itself"):
        CollectConfig(out=str(tmp_path / "s"), episodes=1, relabel="gait").validate()
    with pytest.raises(ValueError, match="expert.drive.prob"):
        CollectConfig(out=str(tmp_path / "s"), episodes=1, expert_drive_prob=1.5).validate()
    with pytest.raises(ValueError, match="expert_drive_prob"):
        RelabelledPolicy(EchoPolicy(), ScaledEcho(), 2, expert_drive_prob=-0.1)


class Commanding(ScaledEcho):
    """A hierarchical-style labeller: it also keeps the high-level command it acted with."""

    def act(self, obs):
        self.hl_commands = obs["dof_pos"][:, :12] * 2.0 + 1.0
        return super().act(obs)


def test_a_hierarchical_labellers_command_is_the_stored_hl_commands():
    env = ScriptedEnv(num_envs=3, max_episode_length=5)
    policy = RelabelledPolicy(EchoPolicy(), Commanding(), env.num_envs)
    for ep in Rollout(env, policy, RolloutConfig()).episodes(max_episodes=6):
        dof = ep.features["dof_pos"]
        assert np.allclose(ep.features["hl_commands"], 2.0 * dof[:, :12] + 1.0)   # the labeller's command
        assert np.array_equal(ep.features["applied_actions"], dof)                # the driver still drove
    assert RelabelledPolicy(EchoPolicy(), ScaledEcho(), 3).hl_commands is None   # no command: none stored


def test_the_expert_takes_over_after_k_steps_of_every_episode():
    from quadforge.collection.takeover import TakeoverPolicy, main
    env = ScriptedEnv(num_envs=3, max_episode_length=5)
    policy = TakeoverPolicy(EchoPolicy(), ScaledEcho(), env.num_envs, after_steps=2)
    for ep in Rollout(env, policy, RolloutConfig()).episodes(max_episodes=6):
        dof, acts = ep.features["dof_pos"], ep.features["applied_actions"]   # what drove the env
        assert np.array_equal(acts[:2], dof[:2])                    # the driver's first two steps
        assert np.allclose(acts[2:], -3.0 * dof[2:])                # then the expert's, every episode anew
    with pytest.raises(ValueError, match="after_steps"):
        TakeoverPolicy(EchoPolicy(), ScaledEcho(), 3, after_steps=-1)
    with pytest.raises(SystemExit):
        main(["quard_expert", "--after", "two"])
