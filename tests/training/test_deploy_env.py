"""A trained checkpoint drives the real LeggedEnv through the Policy protocol (closed loop)."""
import torch

from quadforge.envs.config import EnvConfig
from quadforge.envs.vec_env import LeggedEnv
from quadforge.experts.policy import check_policy
from quadforge.experts.registry import load_policy
from quadforge.training.imitation import train
from quadforge.training.presets import preset

from imitation_data import learnable_arrays

torch.set_num_threads(1)


def test_checkpoint_acts_in_the_env(tmp_path):
    cfg = preset("fcnet", "cpu")
    cfg.max_steps, cfg.batch_size, cfg.context, cfg.tensorboard = 3, 8, 8, False
    cfg.model_config = dict(modes=3, hidden=16, num_layers=1, decoder_hidden=16)
    train(cfg, learnable_arrays(num_episodes=4), tmp_path)
    env = LeggedEnv(EnvConfig.flat(num_envs=2, seed=0))
    policy = check_policy(load_policy(tmp_path, num_envs=2))
    env.reset()
    policy.reset(torch.arange(2))
    for _ in range(12):   # past one block of 8: the caches restart on their own
        actions = policy.act(env.terms)
        assert actions.shape == (2, 12) and torch.isfinite(actions).all()
        _, _, dones, _ = env.step(actions)
        if dones.any():
            policy.reset(dones.nonzero().flatten())
