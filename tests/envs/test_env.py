"""LeggedEnv on the real MuJoCo backend: shapes, extras, auto-reset and time-out semantics, episode info,
commands, terms and determinism."""
import math

import pytest
import torch

from quadforge.envs.config import EnvConfig, RandomizationConfig
from quadforge.layout import COMMAND_NAMES, TERM_DIMS, get_layout
from quadforge.envs.terminations import TERMINATION_REASONS
from quadforge.envs.vec_env import EPISODE_KEYS, LeggedEnv

torch.set_num_threads(1)


def _env(n=4, seed=0, **kw):
    kw.setdefault("randomization", RandomizationConfig.off())
    cfg = EnvConfig.flat(num_envs=n, seed=seed, **kw)
    cfg.backend.num_threads = 1
    return LeggedEnv(cfg)


def test_shapes_and_contract_attributes():
    env = _env()
    obs = env.get_observations()
    assert obs["policy"].shape == (4, 48) and obs["critic"].shape == (4, 235)
    assert env.num_actions == 12 and env.dt == pytest.approx(0.02) and env.max_episode_length == 1000
    assert env.terrain_types[0] == "flat" and env.robot.name == "go1"
    obs, rew, dones, extras = env.step(torch.zeros(4, 12))
    assert rew.shape == (4,) and dones.shape == (4,) and dones.dtype == torch.bool
    assert extras["time_outs"].shape == (4,) and isinstance(extras["log"], dict)
    assert set(extras["episode_end"]) == set(EPISODE_KEYS)
    assert all(v.shape == (4,) for v in extras["episode_end"].values())
    assert set(env.terms) == set(TERM_DIMS)
    assert all(env.terms[k].shape == (4, d) for k, d in TERM_DIMS.items())
    torch.testing.assert_close(env.joint_targets, env.default_joint_pos.expand(4, -1))
    env.close()


def test_actions_become_joint_targets_and_last_action_terms():
    env = _env()
    a1 = torch.full((4, 12), 0.4)
    a2 = torch.full((4, 12), -0.2)
    env.step(a1)
    torch.testing.assert_close(env.joint_targets, env.default_joint_pos + env.robot.action_scale * a1)
    env.step(a2)
    torch.testing.assert_close(env.terms["last_action"], a2)
    torch.testing.assert_close(env.terms["last_last_action"], a1)
    # terms are raw: dof_pos relative to the default pose, commands 15-D in COMMAND_NAMES order
    t = env.terms
    torch.testing.assert_close(t["dof_pos"], env.backend.state.joint_pos - env.default_joint_pos)
    assert t["commands"].shape[1] == len(COMMAND_NAMES)
    # on a plane the height scan is the base height at every grid point
    torch.testing.assert_close(t["height_scan"], t["base_height"].expand(-1, 187))
    env.close()


def test_policy_obs_noisy_but_terms_and_critic_clean():
    env = _env(randomization=RandomizationConfig.off())
    env.step(torch.zeros(4, 12))
    obs, terms = env.get_observations(), env.terms
    clean = get_layout("legged_gym_48").build(terms)
    diff = (obs["policy"] - clean).abs()
    assert diff.max() > 0                                          # noise on the policy group
    assert diff[:, 9:12].max() == 0                                 # commands carry no noise
    torch.testing.assert_close(obs["critic"], get_layout("legged_gym_235").build(terms))


def test_time_out_auto_reset_and_episode_info():
    env = _env(episode_length_s=0.2)   # 10 steps
    assert env.max_episode_length == 10
    for i in range(9):
        _, _, dones, extras = env.step(torch.zeros(4, 12))
        assert not dones.any() and not extras["time_outs"].any()
    pos_before = env.backend.state.root_pos_w.clone()
    obs, rew, dones, extras = env.step(torch.zeros(4, 12))
    assert dones.all() and extras["time_outs"].all()
    ep = extras["episode_end"]
    assert (ep["termination_reason"] == TERMINATION_REASONS.index("time_out")).all()
    assert (ep["length"] == 10).all()
    assert (ep["terrain_type"] == 0).all() and (ep["terrain_level"] == 0).all()
    assert torch.isfinite(ep["return"]).all() and (ep["distance"] >= 0).all()
    expect_cmd = env.commands  # new commands now; the old ones were summed: check the integral sign only
    assert (ep["commanded_distance"] >= 0).all() and expect_cmd.shape == (4, 15)
    assert "Episode_Reward/tracking_lin_vel" in extras["log"] and "Episode/length" in extras["log"]
    # auto-reset: the episode counters restarted and the observation is the new episode's first
    assert (env.episode_length_buf == 0).all()
    assert (env.terms["last_action"] == 0).all()
    assert not torch.equal(env.backend.state.root_pos_w, pos_before)
    env.close()


def test_falls_terminate_with_reason():
    env = _env(n=2)
    # drive the joints to a folded pose: the robot collapses onto its base
    a = torch.zeros(2, 12)
    a[:, 2::3] = 8.0   # calves fully flexed
    a[:, 1::3] = -8.0
    reasons = set()
    for _ in range(150):
        _, _, dones, extras = env.step(a)
        reasons.update(extras["episode_end"]["termination_reason"][dones].tolist())
    assert reasons and reasons <= {TERMINATION_REASONS.index("fall"), TERMINATION_REASONS.index("base_collision")}
    env.close()


def test_commands_pinned_and_sampler_hook():
    env = _env()
    cmd = env.commands[[1, 3]].clone()   # the drawn joystick and the default trot in entries 3..
    cmd[:, 0] = 0.7
    cmd[:, 4] = 2.5
    env.set_commands(torch.tensor([1, 3]), cmd)
    for _ in range(3):
        env.step(torch.zeros(4, 12))
    torch.testing.assert_close(env.terms["commands"][[1, 3]], cmd)
    assert env.get_observations()["policy"][1, 9].item() == pytest.approx(1.4)  # vx * 2 in legged_gym_48
    with pytest.raises(ValueError, match="expected"):
        env.set_commands(torch.tensor([0]), torch.zeros(1, 3))
    # values the config's ranges could not hold either (COMMAND_LIMITS) are refused, naming the entry
    for col, value, name in ((0, 30.0, "lin_vel_x = 30 lies outside"), (4, 0.0, "gait_frequency = 0 "),
                             (2, float("nan"), "ang_vel_yaw = nan")):
        bad = cmd.clone()
        bad[1, col] = value
        with pytest.raises(ValueError, match=f"row 1: {name}"):
            env.set_commands(torch.tensor([1, 3]), bad)
    torch.testing.assert_close(env.terms["commands"][[1, 3]], cmd)   # nothing changed

    calls = []

    def sampler(env_ids, gen):
        calls.append(env_ids.clone())
        out = torch.zeros(env_ids.numel(), 15)
        out[:, 0] = 0.5
        out[:, 4] = 3.0
        return out

    env.command_sampler = sampler
    env.reset_envs(torch.tensor([0, 2]))
    assert torch.equal(calls[-1], torch.tensor([0, 2]))
    assert (env.commands[[0, 2], 0] == 0.5).all()
    env.close()


def test_joystick_defaults_heading_and_small_commands_zeroed():
    env = _env(n=64)
    c = env.commands
    xy = c[:, :2].norm(dim=1)
    assert ((xy == 0) | (xy >= 0.2)).all()
    assert (c[:, 4] == 3.0).all() and (c[:, 5] == 0.5).all()   # default trot fills entries 3..
    # heading mode: the first command already steers towards the drawn heading (spawn yaw 0)
    h = env.task.commands.heading
    torch.testing.assert_close(c[:, 2], (0.5 * h).clamp(-1, 1))
    env.step(torch.zeros(64, 12))
    assert (env.commands[:, 2].abs() <= 1.0).all()             # heading error -> clipped yaw command
    env.close()


def test_gait_mode_draws_walk_these_ways_gaits():
    cfg = EnvConfig.flat(num_envs=32, randomization=RandomizationConfig.off())
    cfg.commands.mode = "gait"
    env = LeggedEnv(cfg)
    c = env.commands
    gaits = {tuple(round(x, 3) for x in row) for row in c[:, 5:8].tolist()}
    assert gaits <= {(0.5, 0.0, 0.0), (0.0, 0.0, 0.0), (0.0, 0.0, 0.5), (0.0, 0.5, 0.0)} and len(gaits) > 1
    assert ((c[:, 4] >= 2.0) & (c[:, 4] <= 4.0)).all()
    # gait clock: FR = t+o, FL = t+p+o+b, RR = t+p, RL = t+b, advancing at the commanded frequency
    env.step(torch.zeros(32, 12))
    t = (env.dt * c[:, 4]) % 1.0
    p, o, b = c[:, 5], c[:, 6], c[:, 7]
    expect = torch.sin(2 * math.pi * torch.stack((t + o, t + p + o + b, t + p, t + b), 1))
    torch.testing.assert_close(env.terms["gait_clock"], expect, atol=1e-5, rtol=0)
    env.close()


def test_set_terrain_levels_on_flat_checks_range():
    env = _env()
    env.set_terrain_levels(torch.tensor([0, 1]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="levels must lie"):
        env.set_terrain_levels(torch.tensor([0]), torch.tensor([3]))
    env.close()


def _rollout(seed, steps=200):
    cfg = EnvConfig.flat(num_envs=4, seed=seed)  # randomization on: pushes, latency, physics variants
    cfg.backend.num_threads = 2
    env = LeggedEnv(cfg)
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        obs, rew, dones, _ = env.step(0.3 * torch.randn(4, 12, generator=g))
        out.append(torch.cat([obs["policy"], obs["critic"], rew[:, None], dones[:, None].float()], 1))
    env.close()
    return torch.stack(out)


def test_same_seed_is_bit_identical_for_200_steps():
    a, b, c = _rollout(3), _rollout(3), _rollout(4)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_compiled_layouts_equal_layout_build():
    from quadforge.layout import LAYOUTS, TERM_DIMS
    from quadforge.envs.observations import CompiledLayout
    g = torch.Generator().manual_seed(0)
    terms = {k: 3 * torch.randn(5, d, generator=g) for k, d in TERM_DIMS.items()}
    for layout in LAYOUTS.values():
        torch.testing.assert_close(CompiledLayout(layout).build(terms), layout.build(terms), rtol=1e-6, atol=1e-6)
    noisy = CompiledLayout(LAYOUTS["legged_gym_48"], {"base_lin_vel": 0.1, "dof_vel": 1.5}, 1.0)
    diff = noisy.build(terms, g) - LAYOUTS["legged_gym_48"].build(terms)
    assert 0 < diff[:, :3].abs().max() <= 0.2 + 1e-6            # 0.1 m/s x scale 2
    assert 0 < diff[:, 24:36].abs().max() <= 1.5 * 0.05 + 1e-6  # 1.5 rad/s x scale 0.05
    assert diff[:, 3:24].abs().max() == 0 and diff[:, 36:].abs().max() == 0


def _small_terrain(**kw):
    from quadforge.envs.terrain import TerrainConfig
    return TerrainConfig.of_types(["stairs_up", "slope_down", "gaps"], num_levels=4, num_cols=3, tile_size=4.0,
                                  border=2.0, **kw)


def test_terrain_spawn_levels_curriculum_and_height_scan():
    from quadforge.envs.terrain import TERRAIN_TYPES
    cfg = EnvConfig.rough(num_envs=6, terrain=_small_terrain(), randomization=RandomizationConfig.off(),
                          episode_length_s=0.1)
    cfg.max_init_terrain_level = 1
    env = LeggedEnv(cfg)
    assert env.terrain_types == TERRAIN_TYPES
    assert set(env.terrain.levels.tolist()) <= {0, 1}
    assert {TERRAIN_TYPES[i] for i in env.terrain.type_idx.tolist()} == {"stairs_up", "slope_down", "gaps"}
    # spawned above its own tile's platform
    xy = env.backend.state.root_pos_w[:, :2]
    origins = env.terrain.origins_of(torch.arange(6))
    assert ((xy - origins[:, :2]).abs() <= cfg.init.spawn_xy + 0.1).all()
    # the height scan is base z minus the terrain under the yaw-rotated grid
    from quadforge.envs.observations import scan_points_b, scan_points_w
    env.step(torch.zeros(6, 12))
    st = env.backend.state
    expect = st.root_pos_w[:, 2:3] - env.backend.terrain_height(scan_points_w(st, scan_points_b()))
    torch.testing.assert_close(env.terms["height_scan"], expect)
    # episodes end on time-out after 5 steps; the curriculum moves levels from distance walked
    before = env.terrain.levels.clone()
    for _ in range(4):
        _, _, dones, extras = env.step(torch.zeros(6, 12))
    ep = extras["episode_end"]
    assert dones.all() and torch.equal(ep["terrain_level"], before)
    assert torch.equal(ep["terrain_type"], env.terrain.type_idx)
    # standing still while commanded to walk -> down a level (never below 0)
    walked_little = ep["distance"] < 0.5 * ep["commanded_distance"]
    torch.testing.assert_close(env.terrain.levels[walked_little], (before[walked_little] - 1).clamp(min=0))
    assert "Curriculum/level/mean" in extras["log"]
    # evaluation sweeps put envs on chosen tiles
    env.set_terrain_levels(torch.tensor([0, 1]), torch.tensor([3, 2]), torch.tensor([2, 2]))
    assert env.terrain.levels[:2].tolist() == [3, 2]
    assert TERRAIN_TYPES[env.terrain.type_idx[0]] == "gaps"
    with pytest.raises(ValueError, match="cols must lie"):
        env.set_terrain_levels(torch.tensor([0]), torch.tensor([0]), torch.tensor([5]))
    env.close()


def test_rollout_command_summary_and_errors(capsys):
    from quadforge.tools.cli import main
    assert main(["rollout", "--num-envs", "2", "--seconds", "0.2", "--num-threads", "1", "--command", "0.5,0,0",
                 "--no-randomization"]) == 0
    out = capsys.readouterr().out
    assert "env steps/s" in out and "lin_vel_x=+0.500" in out and "time_out=0" in out
    assert main(["rollout", "--terrain", "lava"]) == 2
    assert "lava" in capsys.readouterr().err
    assert main(["rollout", "--command", "1,2"]) == 2
    assert main(["rollout", "--command", "100,0,0"]) == 2   # a typo is an error before any env is built
    assert "--command '100,0,0': lin_vel_x = 100 lies outside its limits [-3, 3]" in capsys.readouterr().err
    assert main(["rollout", "--images"]) == 2       # the QUARD camera's flag, refused on locomotion
    assert "the locomotion task has neither" in capsys.readouterr().err


def test_non_finite_physics_terminates_with_reason():
    env = _env(n=3)
    step = env.backend.step

    def flag_env_1(targets, during=None):
        bad = step(targets, during)
        bad[1] = True   # as if env 1 diverged (the backend restores it and reports it)
        return bad

    env.backend.step = flag_env_1
    _, rew, dones, extras = env.step(torch.zeros(3, 12))
    assert dones.tolist() == [False, True, False] and not extras["time_outs"].any()
    assert extras["episode_end"]["termination_reason"][1] == TERMINATION_REASONS.index("non_finite")
    assert torch.isfinite(rew).all()
    env.close()


def test_pushes_and_action_latency():
    cfg_r = RandomizationConfig(physics=None, push_robots=True, push_interval_s=0.1, action_latency_steps=(1, 1))
    env = _env(n=2, randomization=cfg_r)
    pushes = []
    push = env.backend.push
    env.backend.push = lambda ids, dv: (pushes.append(dv.clone()), push(ids, dv))
    a1, a2 = torch.full((2, 12), 0.3), torch.full((2, 12), -0.3)
    env.step(a1)
    torch.testing.assert_close(env.joint_targets, env.default_joint_pos.expand(2, -1))  # delayed: a_0 = 0
    env.step(a2)
    torch.testing.assert_close(env.joint_targets, env.default_joint_pos + env.robot.action_scale * a1)
    for _ in range(8):
        env.step(torch.zeros(2, 12))
    assert len(pushes) == 2   # every 5 steps
    assert all(p[:, 2].eq(0).all() and p[:, :2].abs().le(1.0).all() and p.abs().gt(0).any() for p in pushes)
    env.close()


def test_terrain_runs_are_seeded():
    def run(seed):
        cfg = EnvConfig.rough(num_envs=3, seed=seed, terrain=_small_terrain(), episode_length_s=0.3)
        cfg.backend.num_threads = 1
        env = LeggedEnv(cfg)
        g = torch.Generator().manual_seed(1)
        out = [torch.cat([env.terrain.levels.float(), env.backend.state.root_pos_w.flatten()])]
        for _ in range(40):
            obs, rew, dones, _ = env.step(0.3 * torch.randn(3, 12, generator=g))
            out.append(torch.cat([obs["critic"].flatten(), rew, env.terrain.levels.float()]))
        env.close()
        return torch.cat(out)
    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))


def test_termination_priorities_and_thigh_option():
    from quadforge.envs.backends.base import RobotState
    from quadforge.envs.config import TerminationsConfig
    from quadforge.envs.terminations import Terminations
    names = ("base", "FR_thigh", "FL_thigh", "FR_calf")
    n = 5
    grav = torch.tensor([[0, 0, -1.0]] * n)
    grav[1] = torch.tensor([0.9, 0, -0.3])      # tilted past 60 deg
    cf = torch.zeros(n, 4, 3)
    cf[2, 0, 2] = 10.0                           # base contact
    cf[3, 1, 2] = 10.0                           # thigh contact
    z = torch.zeros
    st = RobotState(root_pos_w=z(n, 3), root_quat_w=z(n, 4), root_lin_vel_w=z(n, 3), root_ang_vel_w=z(n, 3),
                    root_lin_vel_b=z(n, 3), root_ang_vel_b=z(n, 3), projected_gravity_b=grav, joint_pos=z(n, 12),
                    joint_vel=z(n, 12), joint_torque=z(n, 12), foot_pos_w=z(n, 4, 3),
                    foot_contact=z(n, 4, dtype=torch.bool), contact_forces=cf, body_names=names)
    height = torch.full((n,), 0.3)
    height[4] = 0.05                             # base too low
    time_out = torch.tensor([True, True, False, True, False])
    non_finite = torch.tensor([False, False, False, False, False])
    codes = {r: i for i, r in enumerate(TERMINATION_REASONS)}
    r = Terminations(TerminationsConfig(), 0.3, names).compute(st, height, non_finite, time_out)
    assert r.tolist() == [codes["time_out"], codes["fall"], codes["base_collision"], codes["time_out"], codes["fall"]]
    r = Terminations(TerminationsConfig(contact_bodies=("base", "thigh")), 0.3, names).compute(
        st, height, torch.tensor([False, True, False, False, False]), time_out)
    assert r.tolist() == [codes["time_out"], codes["non_finite"], codes["base_collision"], codes["base_collision"],
                          codes["fall"]]
    with pytest.raises(ValueError, match="matches none"):
        Terminations(TerminationsConfig(contact_bodies=("tail",)), 0.3, names)


def test_scan_grid_turns_with_the_base_yaw_and_commands_resample_on_time():
    from quadforge.envs.backends.base import RobotState
    from quadforge.envs.commands import CommandManager
    from quadforge.envs.config import CommandsConfig
    from quadforge.envs.observations import scan_points_b, scan_points_w
    z = torch.zeros
    half = math.sqrt(0.5)
    st = RobotState(root_pos_w=torch.tensor([[1.0, 2.0, 0.3]]), root_quat_w=torch.tensor([[half, 0, 0, half]]),
                    root_lin_vel_w=z(1, 3), root_ang_vel_w=z(1, 3), root_lin_vel_b=z(1, 3), root_ang_vel_b=z(1, 3),
                    projected_gravity_b=z(1, 3), joint_pos=z(1, 12), joint_vel=z(1, 12), joint_torque=z(1, 12),
                    foot_pos_w=z(1, 4, 3), foot_contact=z(1, 4, dtype=torch.bool), contact_forces=z(1, 1, 3))
    pb = scan_points_b()
    assert pb.shape == (187, 2) and pb[0].tolist() == pytest.approx([-0.8, -0.5]) and pb[1, 1] > pb[0, 1]
    pw = scan_points_w(st, pb)[0]
    # yawed by +90 deg: the grid's forward x points along world +y, its left y along world -x
    torch.testing.assert_close(pw, torch.stack((1.0 - pb[:, 1], 2.0 + pb[:, 0]), 1), atol=1e-6, rtol=0)

    cm = CommandManager(CommandsConfig(resampling_time=0.1, heading_command=False), 3, 0.02,
                        torch.Generator().manual_seed(0))
    cm.reset(torch.arange(3))
    cm.set_commands(torch.tensor([2]), torch.full((1, 15), 0.25))
    first = cm.commands.clone()
    quat = torch.tensor([[1.0, 0, 0, 0]] * 3)
    for _ in range(4):
        cm.step(quat)
    assert torch.equal(cm.commands, first)
    cm.step(quat)                                   # 5 steps = 0.1 s: envs 0, 1 redrawn, the pinned one kept
    assert not torch.equal(cm.commands[:2], first[:2]) and torch.equal(cm.commands[2], first[2])


def test_privileged_and_trig_terms_come_from_the_state_and_params():
    cfg = EnvConfig.flat(num_envs=8, seed=3)   # physics randomization on: per-env friction / added mass
    cfg.backend.num_threads = 1
    env = LeggedEnv(cfg)
    env.step(torch.zeros(8, 12))
    t, st, params = env.terms, env.backend.state, env.backend.env_params
    torch.testing.assert_close(t["friction"][:, 0], params["friction"].float())
    torch.testing.assert_close(t["added_mass"][:, 0], params["added_mass"].float())
    assert t["friction"].std() > 0
    torch.testing.assert_close(t["dof_pos_sin"], torch.sin(st.joint_pos))
    torch.testing.assert_close(t["dof_pos_cos"], torch.cos(st.joint_pos))
    torch.testing.assert_close(t["foot_contacts"], st.foot_contact.float())
    torch.testing.assert_close(t["base_lin_vel"], st.root_lin_vel_b)
    # terms are copies: the next step does not change what a caller kept
    kept = t["dof_vel"].clone()
    env.step(torch.full((8, 12), 0.5))
    assert torch.equal(t["dof_vel"], kept)
    env.close()


def test_env_ids_may_be_a_bool_mask_and_bad_ids_change_nothing():
    env = _env(4)
    try:
        for _ in range(3):
            env.step(torch.zeros(4, 12))
        env.reset_envs(torch.tensor([False, False, True, True]))      # a mask: its True rows, not 0 and 1
        assert env.episode_length_buf.tolist() == [3, 3, 0, 0]
        levels = env.terrain.levels.clone()
        for bad, match in (([-1], r"in \[0, 4\)"), (torch.tensor([1.7]), "integer indices"),
                           (torch.tensor([True, False]), r"shape \(4,\)")):
            with pytest.raises(ValueError, match=match):
                env.set_terrain_levels(bad, 0)
            with pytest.raises(ValueError, match=match):
                env.reset_envs(bad)
        with pytest.raises(ValueError, match="levels must be integers"):
            env.set_terrain_levels([0], [1.5])                         # was tile 1, silently
        assert torch.equal(env.terrain.levels, levels) and env.episode_length_buf.tolist() == [3, 3, 0, 0]
        env.reset_envs([])                                             # no rows: nothing to do, no dtype error
        assert env.episode_length_buf.tolist() == [3, 3, 0, 0]
        env.set_commands([1], env.commands[1:2])        # rows of the live buffer: no aliasing error
    finally:
        env.close()


def test_reset_envs_refreshes_the_observation():
    env = _env(2)
    try:
        for _ in range(20):
            env.step(torch.full((2, 12), 0.5))
        env.reset_envs([0])
        terms = env.terms
        assert torch.equal(terms["dof_pos"][0], env.backend.state.joint_pos[0] - env.default_joint_pos)
        assert torch.equal(env.get_observations()["critic"], env._critic_obs.build(terms))
    finally:
        env.close()


def test_bad_actions_are_refused_before_anything_moves_and_nan_ends_the_episode():
    env = _env(3)
    try:
        env.step(torch.zeros(3, 12))
        pos = env.backend.state.root_pos_w.clone()
        for bad in (torch.ones(1, 12), torch.ones(12), torch.ones(3, 11)):
            with pytest.raises(ValueError, match=r"actions must have shape \(3, 12\)"):
                env.step(bad)
        assert env.episode_length_buf.tolist() == [1, 1, 1] and torch.equal(env.backend.state.root_pos_w, pos)
        a = torch.zeros(3, 12)
        a[1, 4] = float("nan")
        _, rew, dones, extras = env.step(a)
        assert dones.tolist() == [False, True, False] and torch.isfinite(rew).all()
        assert extras["episode_end"]["termination_reason"][1] == TERMINATION_REASONS.index("non_finite")
        assert all(math.isfinite(v) for v in extras["log"].values())
        env.step(torch.zeros(3, 12).numpy())                              # a numpy array is taken as is
        net = torch.nn.Linear(1, 12)
        obs, *_ = env.step(net(torch.ones(3, 1)))                        # no graph is kept past the step
        assert not obs["policy"].requires_grad and not env.actions.requires_grad
        env.step(torch.zeros(3, 12))[3]["pushed"][0] = True              # a caller writes into its extras
        assert not env.step(torch.zeros(3, 12))[3]["pushed"].any()       # ... which later steps ignore
    finally:
        env.close()


def test_a_float64_default_dtype_is_refused_before_anything_changes():
    env = _env(2)
    try:
        before = env.episode_length_buf.clone()
        torch.set_default_dtype(torch.float64)
        try:
            for call in (lambda: env.step(torch.zeros(2, 12)), lambda: env.reset_envs([0]), env.reset,
                         lambda: _env(2)):
                with pytest.raises(ValueError, match="default dtype is torch.float64"):
                    call()
        finally:
            torch.set_default_dtype(torch.float32)
        assert torch.equal(env.episode_length_buf, before)
        env.step(torch.zeros(2, 12))
    finally:
        env.close()
