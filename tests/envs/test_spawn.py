"""Spawning: no foot starts inside the ground. On a heightfield a foot inside a bump is pinched between
prisms for the whole episode; in a plane it is kicked out at t = 0. Random initial joint poses reach
up to ~10 cm deeper than the nominal pose the spawn height is set for."""
import torch

from quadforge.envs.config import EnvConfig
from quadforge.envs.terrain import TerrainConfig
from quadforge.envs.vec_env import LeggedEnv, spawn_clearance


def _rough_cfg(num_envs: int = 32) -> EnvConfig:
    cfg = EnvConfig.flat(robot="go1", num_envs=num_envs, seed=0)
    cfg.terrain = TerrainConfig.of_types(["rough_slope"], num_levels=2, num_cols=1, tile_size=4.0, border=1.0)
    cfg.curriculum = False
    return cfg


def _clearance(env: LeggedEnv) -> torch.Tensor:
    """(N, 4) gap between each foot sphere (backend state after reset) and the terrain under it."""
    feet = env.backend.state.foot_pos_w
    return feet[..., 2] - env.backend.terrain_height(feet[..., :2]) - env.robot.foot_radius


def _nominal_z(env: LeggedEnv) -> torch.Tensor:
    """(N,) the base height of the nominal path: the nominal pose over the highest ground under the
    spawn footprint (zero on a plane), written as the env adds it."""
    pos = env.backend.state.root_pos_w
    ground = env.backend.terrain_height(pos[:, None, :2] + env._spawn_footprint).amax(-1)
    return ground + (env.robot.nominal_base_height + env.cfg.init.spawn_height)


def _check_spawn(env: LeggedEnv, margin: float) -> tuple[int, float]:
    """Every foot clears the ground by the margin; lifted envs by exactly it, the others are at the
    nominal height bit for bit. Returns (lifted envs, deepest foot the nominal height would have had)."""
    # FK in float32 against MuJoCo's float64 foot sites: sub-millimetre
    tol = 1e-4
    clear = _clearance(env)
    assert (clear >= margin - tol).all()
    z, nominal = env.backend.state.root_pos_w[:, 2], _nominal_z(env)
    lifted = z > nominal
    assert (z[~lifted] == nominal[~lifted]).all()
    # no higher than needed: the lowest foot of a lifted env sits exactly at the margin
    assert torch.allclose(clear[lifted].amin(-1), torch.full_like(z[lifted], margin), atol=tol)
    # at the nominal height that foot would have cleared less than the margin, or been inside the ground
    at_nominal = clear[lifted].amin(-1) - (z - nominal)[lifted]
    assert (at_nominal < margin).all()
    return int(lifted.sum()), float(at_nominal.min()) if lifted.any() else float("inf")


def test_random_initial_poses_start_with_every_foot_clear_of_the_terrain():
    torch.set_num_threads(1)
    cfg = _rough_cfg()
    assert cfg.init.joint_pos_scale == (0.5, 1.5)
    env = LeggedEnv(cfg)
    margin = spawn_clearance(env.robot, cfg.init.spawn_height)
    # the nominal path's margin: a few mm under spawn_height (the deepest leg of the default pose)
    assert 0.04 < margin <= cfg.init.spawn_height
    try:
        lifted, deepest = 0, float("inf")
        for _ in range(3):  # fresh draws per reset
            n, d = _check_spawn(env, margin)
            lifted, deepest = lifted + n, min(deepest, d)
            env.reset()
        # the case is exercised: several envs would have started with a foot inside the heightfield
        assert lifted >= 5 and deepest < -0.01
    finally:
        env.close()


def test_plane_spawn_keeps_the_nominal_height_unless_a_foot_reaches_deeper():
    torch.set_num_threads(1)
    cfg = EnvConfig.flat(robot="go1", num_envs=64, seed=0)
    env = LeggedEnv(cfg)
    margin = spawn_clearance(env.robot, cfg.init.spawn_height)
    try:
        lifted, deepest = _check_spawn(env, margin)
        # random poses put feet up to ~5 cm into the plane at the nominal height; poses no deeper than
        # the default keep it
        assert 0 < lifted < cfg.num_envs and deepest < -0.01
    finally:
        env.close()


def test_feet_spawn_no_lower_over_rough_terrain_than_over_flat_ground():
    torch.set_num_threads(1)
    cfg = _rough_cfg()
    env = LeggedEnv(cfg)
    try:
        state = env.backend.state
        feet = state.foot_pos_w                                                   # (N, 4, 3) sphere centres
        r = env.robot.foot_radius
        clearance = _clearance(env)
        # what the same random joint pose would clear over flat ground at the nominal height (negative
        # where random poses stretch legs below it)
        depth = state.root_pos_w[:, 2:3] - feet[..., 2]
        flat = env.robot.nominal_base_height + cfg.init.spawn_height - depth - r
        # (a sampled footprint: a vertex peak between samples may be missed by a few mm)
        assert (clearance >= flat - 0.005).all()
        # the robot is not dropped from needlessly high: ground noise is +-5 cm, a pose lift < 10 cm
        assert (clearance - flat.clamp_min(0)).amin(-1).max() < 0.15
        # over the base point alone (no footprint) the feet still clear the bumps: the footprint is what
        # keeps the sides of the spheres and the calves off step edges within reach
        env._spawn_footprint = env._spawn_footprint.new_zeros(1, 2)
        env.reset()
        assert _clearance(env).min() >= spawn_clearance(env.robot, cfg.init.spawn_height) - 1e-4
    finally:
        env.close()


def test_robots_on_gaps_tiles_spawn_with_their_footprint_on_the_platform():
    """A gaps tile's 2 m platform ends in a 1 m deep moat: spawned anywhere within +-1 m of the centre,
    half the robots started with a foot over it and fell. There the spawn offset keeps the footprint a
    heightfield cell inside the platform; on the other types it stays legged_gym's +-spawn_xy."""
    from quadforge.envs.terrain import PLATFORM_HALF, TERRAIN_TYPES
    cfg = EnvConfig.flat(robot="go1", num_envs=48, seed=0)
    cfg.terrain = TerrainConfig.of_types(["gaps", "flat"], num_levels=10, num_cols=2, tile_size=8.0, border=1.0)
    cfg.curriculum = False
    env = LeggedEnv(cfg)
    try:
        gaps = env.terrain.type_idx == TERRAIN_TYPES.index("gaps")
        half = env._spawn_half[TERRAIN_TYPES.index("gaps")]
        footprint = float(env._spawn_footprint.abs().amax())
        assert half + footprint <= PLATFORM_HALF - cfg.terrain.horizontal_scale + 1e-6
        offset = (env.backend.state.root_pos_w[:, :2] - env.terrain.origins_of(torch.arange(48))[:, :2]).abs()
        assert (offset[gaps] <= half + 1e-4).all()
        assert offset[~gaps].amax() > half + 0.2                 # the other tiles keep their +-1 m
        for _ in range(50):                                       # 1 s of zero actions: nobody drops in
            env.step(torch.zeros(48, 12))
            assert (env.backend.state.foot_pos_w[gaps][..., 2] > -0.3).all()
    finally:
        env.close()
