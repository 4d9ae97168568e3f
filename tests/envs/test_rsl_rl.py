"""rsl_rl 5.x's real OnPolicyRunner trains on LeggedEnv for two iterations: the VecEnv contract test."""
import glob
import os

import torch
from rsl_rl.env import VecEnv
from rsl_rl.runners import OnPolicyRunner

from quadforge.envs.config import EnvConfig
from quadforge.envs.vec_env import LeggedEnv, RslRlLogView

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
    view = RslRlLogView(env)
    runner = OnPolicyRunner(view, _train_cfg(), log_dir=str(tmp_path), device="cpu")
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
    # setting episode_length_buf through the view reached the env
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
