"""The rollout loop's bookkeeping against a scripted env (exact), and the real LeggedEnv (smoke)."""
import math

import numpy as np
import pytest
import torch

from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.collection.skills import SkillCommandSampler, parse_skills
from collection_fakes import EchoPolicy, ScriptedEnv


def run(env, policy, n, **cfg):
    return list(Rollout(env, policy, RolloutConfig(**cfg)).episodes(max_episodes=n))


def test_each_episode_holds_exactly_its_own_steps():
    env, policy = ScriptedEnv(num_envs=3, max_episode_length=5), EchoPolicy()
    episodes = run(env, policy, 12)
    assert len(episodes) == 12
    seen = set()
    for ep in episodes:
        dof = ep.features["dof_pos"]
        env_id, k = int(dof[0, 0]), int(dof[0, 1])
        assert ep.info["env_id"] == env_id and (env_id, k) not in seen
        seen.add((env_id, k))
        assert (dof[:, 0] == env_id).all() and (dof[:, 1] == k).all()
        assert np.array_equal(dof[:, 2], np.arange(ep.length))           # step t's observation at row t
        assert np.array_equal(ep.features["actions"], dof)                # what the policy did with it
        assert np.array_equal(ep.features["joint_targets"], 0.5 * dof)    # the targets that step applied
        assert np.allclose(ep.features["rewards"], dof[:, 0] + np.arange(ep.length))
        assert ep.info["return"] == pytest.approx(ep.features["rewards"].sum())
        assert ep.info["length"] == ep.length == len(ep.features["commands"])
        assert ep.info["terrain_type"] == "stairs_up" and ep.info["terrain_level"] == 3


def test_time_limit_is_truncation_and_a_fall_is_terminal():
    episodes = run(ScriptedEnv(num_envs=3, max_episode_length=5), EchoPolicy(), 12)
    reasons = {ep.info["termination_reason"] for ep in episodes}
    assert reasons == {"fall", "time_out"}
    for ep in episodes:
        term, tout = ep.features["terminated"], ep.features["time_outs"]
        assert term.dtype == np.bool_ and not term[:-1].any() and not tout[:-1].any()
        if ep.info["termination_reason"] == "time_out":
            assert tout[-1] and not term[-1] and ep.length == 5
            assert ep.info["success"] and ep.info["failure_reason"] == "none"
        else:
            assert term[-1] and not tout[-1]
            assert not ep.info["success"] and ep.info["failure_reason"] == "fall"


def test_policy_is_reset_for_exactly_the_done_envs():
    env, policy = ScriptedEnv(num_envs=3, max_episode_length=5), EchoPolicy()
    episodes = run(env, policy, 9)
    assert policy.resets[0] == [0, 1, 2]                          # start of the run
    assert sorted(i for ids in policy.resets[1:] for i in ids) == sorted(ep.info["env_id"] for ep in episodes)


def test_bounds_stop_exactly():
    env = ScriptedEnv(num_envs=3, max_episode_length=5)
    assert len(run(env, EchoPolicy(), 4)) == 4
    r = Rollout(ScriptedEnv(num_envs=3, max_episode_length=5), EchoPolicy())
    eps = list(r.episodes(max_steps=4))
    assert r.env_steps == 12 and len(eps) == 1  # only env 1 (k=0: 4 steps, a fall) finished in 4 steps
    with pytest.raises(ValueError, match="max_episodes or max_steps"):
        next(Rollout(env, EchoPolicy()).episodes())


def test_action_noise_is_seeded_recorded_and_applied():
    a = run(ScriptedEnv(), EchoPolicy(), 3, action_noise_std=0.1, seed=7)
    b = run(ScriptedEnv(), EchoPolicy(), 3, action_noise_std=0.1, seed=7)
    c = run(ScriptedEnv(), EchoPolicy(), 3, action_noise_std=0.1, seed=8)
    for x, y in zip(a, b):
        assert np.array_equal(x.features["actions"], y.features["actions"])
    assert not np.array_equal(a[0].features["actions"], c[0].features["actions"])
    noise = a[0].features["actions"] - a[0].features["dof_pos"]
    assert 0.03 < noise.std() < 0.3
    assert np.allclose(a[0].features["joint_targets"], 0.5 * a[0].features["actions"])
    assert a[0].info["action_noise_std"] == 0.1
    with pytest.raises(ValueError, match="action_noise_std"):
        RolloutConfig(action_noise_std=-1).validate()


def test_skill_names_follow_the_commands_each_episode_ran():
    env = ScriptedEnv(num_envs=4)
    sampler = SkillCommandSampler(parse_skills("standing=1,turning=1"), 4, seed=0)
    episodes = list(Rollout(env, EchoPolicy(), skills=sampler).episodes(max_episodes=16))
    assert {ep.info["task"] for ep in episodes} == {"standing", "turning"}
    for ep in episodes:
        wz = ep.features["commands"][:, 2]
        assert (wz == 0).all() if ep.info["task"] == "standing" else (np.abs(wz) >= 0.5).all()
        assert ep.info["cmd_wz"] == pytest.approx(float(wz.mean()), abs=1e-6)


def test_commanded_displacement_integrates_the_ideal_path():
    env = ScriptedEnv(num_envs=1, max_episode_length=5)
    ep = run(env, EchoPolicy(), 1)[0]           # vx = 1 m/s for 5 steps of 0.02 s
    assert ep.info["commanded_displacement"] == pytest.approx(0.1)
    # a quarter turn while walking: chord of a quarter circle of length L is L * sin(pi/4) / (pi/4)
    env = ScriptedEnv(num_envs=1, max_episode_length=100)
    env.commands[:, 2] = (math.pi / 2) / (100 * 0.02)
    ep = run(env, EchoPolicy(), 1)[0]
    L = 100 * 0.02
    assert ep.info["commanded_displacement"] == pytest.approx(L * math.sin(math.pi / 4) / (math.pi / 4), rel=2e-2)


def test_summary_mode_records_no_arrays_and_hl_commands_when_exposed():
    ep = run(ScriptedEnv(), EchoPolicy(), 2, record=False)[0]
    assert ep.features == {} and "success" in ep.info
    ep = run(ScriptedEnv(), EchoPolicy(with_hl=True), 2)[0]
    assert np.array_equal(ep.features["hl_commands"], 2 * ep.features["dof_pos"])


def test_a_command_policy_is_refused_with_a_clear_error():
    policy = EchoPolicy()
    policy.action_space = "command"
    with pytest.raises(ValueError, match="HierarchicalPolicy"):
        Rollout(ScriptedEnv(), policy)


def test_label_rule_travels_with_each_episode():
    ep = run(ScriptedEnv(), EchoPolicy(), 1)[0]
    assert ep.info["label"]["rule"]["max_lin_vel_error"] == 0.35
    assert ep.info["label"]["reason"] == ("success" if ep.info["success"] else ep.info["failure_reason"])
    assert set(ep.info["label"]["numbers"]) >= {"lin_vel_error", "distance", "commanded_displacement"}
    assert ep.info["gait"] == "pronk"  # the scripted env's (phase, offset, bound) are all zero


def test_gait_names_come_from_phase_offset_bound():
    from quadforge.collection.rollout import gait_name
    from quadforge.collection.skills import DEFAULT_COMMAND
    cmd = torch.tensor(list(DEFAULT_COMMAND.values()))
    assert gait_name(cmd) == "trot"
    cmd[5] = 0.3
    assert gait_name(cmd) == "custom"


def test_real_env_episodes_line_up_with_the_env_own_accounting():
    pytest.importorskip("quadforge.experts.gait")
    from quadforge.envs.config import EnvConfig
    from quadforge.envs.vec_env import LeggedEnv
    from quadforge.experts.gait import GaitController

    torch.set_num_threads(1)
    cfg = EnvConfig.flat(num_envs=3, seed=1)
    cfg.backend.num_threads = 1
    cfg.episode_length_s = 0.3
    cfg.commands.resample = False
    cfg.randomization.action_latency_steps = (0, 0)  # so the targets follow this step's action exactly
    env = LeggedEnv(cfg)
    sampler = SkillCommandSampler(parse_skills("walking=1,turning=1"), 3, seed=2)
    rollout = Rollout(env, GaitController(env.robot, 3, env.dt), skills=sampler)
    episodes = list(rollout.episodes(max_episodes=6))
    assert len(episodes) == 6
    for ep in episodes:
        L = ep.length
        assert 1 <= L <= env.max_episode_length
        assert set(ep.features) >= set(env.terms) | {"actions", "joint_targets", "rewards", "terminated", "time_outs"}
        assert all(len(v) == L for v in ep.features.values())
        assert ep.info["return"] == pytest.approx(float(ep.features["rewards"].sum()), rel=1e-4, abs=1e-5)
        # the commands term holds the skill's command through the whole episode
        cmds = ep.features["commands"]
        assert np.allclose(cmds, cmds[0])
        assert (np.abs(cmds[0, 2]) >= 0.5) == (ep.info["task"] == "turning")
        assert ep.features["time_outs"][-1] == (ep.info["termination_reason"] == "time_out")
        assert ep.features["time_outs"][-1] != ep.features["terminated"][-1]
        if ep.info["termination_reason"] == "time_out":
            assert L == env.max_episode_length
        # joint targets are the env's PD targets for the applied action
        q = np.asarray(env.robot.default_joint_pos) + env.robot.action_scale * np.clip(ep.features["actions"], -100, 100)
        assert np.allclose(ep.features["joint_targets"], q, atol=1e-5)


def test_reset_false_keeps_the_callers_fresh_episodes():
    env = ScriptedEnv(num_envs=2)
    env.reset_envs(torch.arange(2))
    env.commands[:, 0] = 0.25                      # e.g. an evaluation pinning its commands
    ep = next(Rollout(env, EchoPolicy()).episodes(max_episodes=1, reset=False))
    assert np.allclose(ep.features["commands"][:, 0], 0.25)
    env.t[:] = 1                                   # envs mid-episode: refused
    env.episode_length_buf = env.t
    with pytest.raises(ValueError, match="start of an episode"):
        next(Rollout(env, EchoPolicy()).episodes(max_episodes=1, reset=False))
