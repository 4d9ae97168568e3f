"""Spawning on rough terrain: no foot starts inside a bump (it would be pinched between heightfield
prisms for the whole episode)."""
import torch

from envs.config import EnvConfig
from envs.terrain import TerrainConfig
from envs.vec_env import LeggedEnv


def test_feet_spawn_no_lower_over_rough_terrain_than_over_flat_ground():
    torch.set_num_threads(1)
    cfg = EnvConfig.flat(robot="go1", num_envs=32, seed=0)
    cfg.terrain = TerrainConfig.of_types(["rough_slope"], num_levels=2, num_cols=1, tile_size=4.0, border=1.0)
    cfg.curriculum = False
    env = LeggedEnv(cfg)
    try:
        state = env.backend.state
        feet = state.foot_pos_w                                                   # (N, 4, 3) sphere centres
        r = env.robot.foot_radius
        clearance = feet[..., 2] - env.backend.terrain_height(feet[..., :2]) - r  # (N, 4)
        # what the same random joint pose would clear over flat ground (it may be a little negative:
        # random poses stretch legs below the nominal height)
        depth = state.root_pos_w[:, 2:3] - feet[..., 2]
        flat = env.robot.nominal_base_height + cfg.init.spawn_height - depth - r
        # (a sampled footprint: a vertex peak between samples may be missed by a few mm)
        assert (clearance >= flat - 0.005).all()
        # the robot is not dropped from needlessly high: ground noise is +-5 cm
        assert (clearance - flat).amin(-1).max() < 0.15
        # spawning over the base point alone put feet 7 cm into the bumps of this terrain
        env._spawn_footprint = env._spawn_footprint.new_zeros(1, 2)
        env.reset()
        feet = env.backend.state.foot_pos_w
        old = feet[..., 2] - env.backend.terrain_height(feet[..., :2]) - r
        assert old.min() < -0.04
    finally:
        env.close()
