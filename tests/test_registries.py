"""Extending by name: a policy kind is a registry entry, a task a small registered config; one
terrain-spec parser for every --terrain."""
import pytest
import torch

from quadforge.envs import builder
from quadforge.envs.terrain import TERRAIN_TYPES, terrain_config, terrain_types
from quadforge.experts import registry
from quadforge.experts.policy import check_policy


def test_builtin_policy_specs():
    gait = check_policy(registry.load_policy("gait:pace", num_envs=3))
    assert gait.policy_id == "gait:pace" and gait.action_space == "joint"
    zero = check_policy(registry.load_policy("zero", num_envs=2))
    assert zero.act({}).shape == (2, 12) and not zero.act({}).any()
    with pytest.raises(ValueError, match="unknown gait"):
        registry.load_policy("gait:gallop", num_envs=1)
    with pytest.raises(ValueError, match="is unknown; use a checkpoint path, or one of gait"):
        registry.load_policy("vla7b", num_envs=1)
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        registry.load_policy("rsl_rl:/no/such/model_1.pt", num_envs=1)


def test_a_new_policy_kind_is_one_registration(monkeypatch):
    monkeypatch.setattr(registry, "POLICY_KINDS", dict(registry.POLICY_KINDS))

    class Command:  # a high-level policy, as a VLA is
        obs_terms, action_space, action_dim, policy_id = ("base_ang_vel",), "command", 12, "cmd:test"

        def __init__(self, n):
            self.n = n

        def reset(self, env_ids):
            pass

        def act(self, obs):
            return torch.zeros(self.n, 12)

    registry.register_policy_kind("cmdtest", lambda arg, ctx: Command(ctx.num_envs), "a test kind", needs_path=False)
    assert "cmdtest" in registry.spec_help()
    assert registry.load_policy("cmdtest", num_envs=4).action_space == "command"
    with pytest.raises(ValueError, match="already registered"):
        registry.register_policy_kind("cmdtest", lambda arg, ctx: None, "again")


def test_terrain_spec_parser():
    assert terrain_config("flat") is None
    assert terrain_config("plane_grid").plane
    assert set(terrain_config("mixed").proportions) == set(TERRAIN_TYPES)
    assert terrain_config("stairs_up,gaps").proportions == {"stairs_up": 0.5, "gaps": 0.5}
    per_type = terrain_config("mixed", one_column_per_type=True, num_levels=4)
    assert per_type.num_cols == len(TERRAIN_TYPES) and per_type.num_levels == 4
    assert terrain_types("gaps,gaps") == ["gaps"]
    with pytest.raises(ValueError, match="unknown terrain types \\['lava'\\]"):
        terrain_config("flat,lava")


def test_a_new_task_is_one_registration(monkeypatch):
    monkeypatch.setattr(builder, "TASKS", dict(builder.TASKS))

    def short_episodes(cfg):
        cfg.episode_length_s = 1.0
        return cfg

    builder.register_task("test:short", short_episodes, "1 s episodes")
    cfg = builder.make_env_config(task="test:short", num_envs=2, overrides={"commands.resample": False})
    assert cfg.episode_length_s == 1.0 and cfg.commands.resample is False and cfg.num_envs == 2
    with pytest.raises(ValueError, match="--task='nope' is unknown; allowed: locomotion"):
        builder.make_env_config(task="nope")
    with pytest.raises(ValueError, match="is invalid; allowed: a number"):
        builder.make_env_config(overrides={"episode_length_s": "long"})
