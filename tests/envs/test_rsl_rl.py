"""rsl_rl 5.x's real OnPolicyRunner trains on LeggedEnv for two iterations: the VecEnv contract test."""
import glob
import os

import pytest
import torch
from rsl_rl.env import VecEnv
from rsl_rl.runners import OnPolicyRunner

from quadforge.envs.config import EnvConfig
from quadforge.envs.vec_env import LeggedEnv

torch.set_num_threads(1)


def _train_cfg():
    mlp = {"hidden_dims": [32, 32], "activation": "elu", "obs_normalization": False}
    return {
        "num_steps_per_env": 8,
        "save_interval": 1,
        "obs_groups": {"actor": ["policy"], "critic": ["critic"]},
        "actor": {"class_name": "rsl_rl.models.MLPModel", **mlp,
                  "distribution_cfg": {"class_name": "rsl_rl.modules.GaussianDistribution", "init_std": 1.0}},
        "critic": {"class_name": "rsl_rl.models.MLPModel", **mlp},
        "algorithm": {"class_name": "rsl_rl.algorithms.PPO", "num_learning_epochs": 2, "num_mini_batches": 2,
                      "learning_rate": 1e-3, "schedule": "adaptive", "desired_kl": 0.01},
    }


def test_on_policy_runner_two_iterations(tmp_path):
    cfg = EnvConfig.flat(num_envs=16, seed=1, episode_length_s=0.1)  # 5-step episodes: resets happen
    cfg.backend.num_threads = 1
    env = LeggedEnv(cfg)
    assert isinstance(env, VecEnv)
    runner = OnPolicyRunner(env, _train_cfg(), log_dir=str(tmp_path), device="cpu")
    runner.learn(num_learning_iterations=2, init_at_random_ep_len=True)
    assert runner.current_learning_iteration == 1
    saved = sorted(glob.glob(os.path.join(tmp_path, "model_*.pt")))
    assert saved, "the runner saved no checkpoint"
    ckpt = torch.load(saved[-1], weights_only=False)
    assert "actor_state_dict" in ckpt
    # the trained policy runs on the env's observations
    policy = runner.get_inference_policy()
    actions = policy(env.get_observations())
    assert actions.shape == (16, 12) and torch.isfinite(actions).all()
    # the runner's random episode start reached the env
    assert env.episode_length_buf.max() < env.max_episode_length
    env.close()


def test_runner_accepts_the_env_itself(tmp_path):
    cfg = EnvConfig.flat(num_envs=8, seed=2, episode_length_s=0.1)
    cfg.backend.num_threads = 1
    env = LeggedEnv(cfg)
    runner = OnPolicyRunner(env, _train_cfg(), log_dir=str(tmp_path), device="cpu")
    runner.learn(num_learning_iterations=1)
    assert glob.glob(os.path.join(tmp_path, "model_*.pt"))
    env.close()


def test_rsl_rl_logs_the_episode_statistics_of_finished_episodes(tmp_path, monkeypatch):
    """The env handed to OnPolicyRunner as it is: what rsl_rl writes as Episode/length and the
    termination shares are each step's means over the envs that ended then (not over all envs, zeros
    included), averaged by rsl_rl over the steps (docs/envs.md: not a mean over episodes)."""
    from torch.utils.tensorboard import SummaryWriter

    logged: dict[str, list[float]] = {}
    original = SummaryWriter.add_scalar

    def record(self, tag, value, *args, **kwargs):
        logged.setdefault(tag, []).append(float(value))
        return original(self, tag, value, *args, **kwargs)

    monkeypatch.setattr(SummaryWriter, "add_scalar", record)
    cfg = EnvConfig.flat(num_envs=8, seed=3, episode_length_s=0.1)  # 5-step episodes
    cfg.backend.num_threads = 1
    env = LeggedEnv(cfg)
    per_step: list[dict] = []
    step = env.step

    def watched(actions):
        out = step(actions)
        per_step.append(dict(out[3]["log"]))
        return out

    env.step = watched
    runner = OnPolicyRunner(env, _train_cfg(), log_dir=str(tmp_path), device="cpu")
    runner.learn(num_learning_iterations=1)
    env.close()
    # the mean rsl_rl computes from extras["log"]: over the steps where episodes ended
    lengths = [d["Episode/length"] for d in per_step if "Episode/length" in d]
    assert lengths, "no episode ended during the iteration"
    assert logged["Episode/length"][0] == pytest.approx(sum(lengths) / len(lengths), rel=1e-5)
    assert 1.0 <= logged["Episode/length"][0] <= 5.0   # 5-step episodes (earlier on a fall)
    shares = [d["Episode_Termination/time_out"] for d in per_step if "Episode_Termination/time_out" in d]
    assert logged["Episode_Termination/time_out"][0] == pytest.approx(sum(shares) / len(shares), rel=1e-5)
    # the per-env numbers stay out of rsl_rl's logs (they would be averaged with zeros)
    assert "Episode/termination_reason" not in logged and "Episode/terrain_level" not in logged


def _short_episode_env(seed: int = 3) -> LeggedEnv:
    cfg = EnvConfig.flat(num_envs=6, seed=seed, episode_length_s=0.1)   # 5-step episodes: resets happen
    cfg.backend.num_threads = 1
    return LeggedEnv(cfg)


def _drive(env: LeggedEnv, steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        obs, rew, done, _ = env.step(torch.rand(env.num_envs, env.num_actions, generator=g) * 2 - 1)
        out += [obs["policy"].clone(), rew.clone(), done.clone()]
    return out


def test_the_env_stays_usable_outside_inference_mode_after_steps_inside_it():
    """rsl_rl's runner steps the env under ``torch.inference_mode``; what a user does next (reset, step,
    pin commands, move terrain levels) runs outside it and must neither fail on a buffer the mode made
    nor compute anything else than an env never stepped in that mode."""
    inside, plain = _short_episode_env(), _short_episode_env()
    try:
        with torch.inference_mode():
            first = _drive(inside, 12)
        assert all(torch.equal(a, b) for a, b in zip(first, _drive(plain, 12)))
        for env in (inside, plain):
            env.reset()
            env.set_commands(torch.tensor([0, 1]), env.commands[:2].clone().index_fill_(1, torch.arange(3), 0.0))
            env.set_terrain_levels(torch.tensor([2]), torch.tensor([0]))
        assert all(torch.equal(a, b) for a, b in zip(_drive(inside, 12), _drive(plain, 12)))
    finally:
        inside.close()
        plain.close()
