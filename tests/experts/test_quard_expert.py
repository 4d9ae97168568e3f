"""The privileged QUARD expert: its command on hand-checked scenes, and closed-loop success (slow)."""
from __future__ import annotations

import collections
import math

import pytest
import torch

from quadforge.envs.quard.instructions import GAIT_OF_WORD, SPEEDS
from quadforge.experts.gait import GAITS
from quadforge.experts.hierarchical import HL_COMMAND_NAMES
from quadforge.experts.quard_expert import GAIT_SPEEDS, QuardExpert

C = {n: i for i, n in enumerate(HL_COMMAND_NAMES)}


def _env(task, n=4, seed=3):
    from quadforge.envs.quard.env import QuardConfig, QuardEnv
    return QuardEnv(QuardConfig.make(task, num_envs=n, seed=seed, images=False))


def test_expert_command_follows_the_instruction_at_spawn():
    env = _env("quard:go_to")
    try:
        expert = QuardExpert(env.num_envs, env.dt)
        expert.reset(torch.arange(env.num_envs))
        cmd = expert.act(env.terms)
        assert cmd.shape == (env.num_envs, 12)
        for i, p in enumerate(env.scenes.params):
            phase = cmd[i, [C["gait_phase"], C["gait_offset"], C["gait_bound"]]].tolist()
            assert phase == pytest.approx(GAITS[GAIT_OF_WORD[p["gait"]]])
            tx, ty = p["target_slot"]
            v = cmd[i, [C["lin_vel_x"], C["lin_vel_y"]]]
            assert v[0] > 0 and torch.sign(v[1]) == torch.sign(torch.tensor(ty))       # toward the target
            # the forward speed is the band's, falling with the bearing error (turn, then walk)
            bearing = math.atan2(ty, tx)
            band, frequency = GAIT_SPEEDS[p["gait"]][p["speed"]]
            assert float(v[0]) >= band * math.cos(bearing) ** 2 * 0.99
            assert float(cmd[i, C["gait_frequency"]]) == pytest.approx(frequency)
            assert float(cmd[i, C["terminate"]]) == 0.0
    finally:
        env.close()


def test_speed_words_are_ordered_for_every_gait_word():
    from quadforge.envs.quard.instructions import GAIT_WORDS
    for gait in GAIT_WORDS:
        bands = [GAIT_SPEEDS[gait][s][0] for s in SPEEDS]
        frequencies = [GAIT_SPEEDS[gait][s][1] for s in SPEEDS]
        assert bands == sorted(bands) and len(set(bands)) == 3, gait          # slowly < normally < quickly
        assert frequencies == sorted(frequencies), gait                       # never slower steps for faster words


def test_expert_turns_toward_the_named_letter():
    env = _env("quard:distinguish")
    try:
        expert = QuardExpert(env.num_envs, env.dt)
        cmd = expert.act(env.terms)
        for i, p in enumerate(env.scenes.params):
            assert torch.sign(cmd[i, C["ang_vel_yaw"]]) == torch.sign(torch.tensor(p["target_slot"][1]))
            assert float(cmd[i, [C["lin_vel_x"], C["lin_vel_y"]]].abs().sum()) == 0.0
    finally:
        env.close()


def test_expert_refuses_an_env_without_task_terms():
    with pytest.raises(KeyError, match="privileged QUARD terms"):
        QuardExpert(2).act({"base_lin_vel": torch.zeros(2, 3)})


@pytest.mark.slow
@pytest.mark.parametrize("family", ["go_to", "go_avoid", "stop", "distinguish", "go_through"])
def test_expert_solves_each_family_closed_loop(family):
    from quadforge.collection.rollout import Rollout, RolloutConfig
    from quadforge.experts.quard_expert import make_quard_expert
    env = _env(f"quard:{family}", n=6, seed=21)
    try:
        eps = list(Rollout(env, make_quard_expert(env), RolloutConfig(record=False)).episodes(max_episodes=6))
    finally:
        env.close()
    outcomes = collections.Counter(e.info["quard_outcome"] for e in eps)
    assert outcomes["success"] >= 5, outcomes
    for e in eps:
        assert e.info["success"] == (e.info["quard_outcome"] == "success")
        assert e.info["task"] == f"quard:{family}" and e.info["task_params"]["speed"] in SPEEDS
