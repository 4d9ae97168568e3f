"""The gait controller: its pieces against their definitions, and closed loop on LeggedEnv."""
from __future__ import annotations

import math

import pytest
import torch

from quadforge.layout import COMMAND_NAMES, LEGS
from quadforge.envs.robots import get_robot
from quadforge.experts.gait import (GAITS, GaitController, GaitDefaults, GaitGains, cycloid, distribute_wrench,
                          foot_offsets, foot_phases, resolve_params, skew, swing_lift, tilt_from_gravity,
                          tilt_matrix)
from quadforge.experts.policy import check_policy

torch.set_num_threads(1)


def _leg(name: str) -> int:
    return LEGS.index(name)


def test_walk_these_ways_foot_offsets():
    # FL = t+p+o+b, FR = t+o, RL = t+b, RR = t+p
    p, o, b = torch.tensor([0.1]), torch.tensor([0.2]), torch.tensor([0.3])
    off = foot_offsets(p, o, b)[0]
    assert off[_leg("FL")] == pytest.approx(0.6)
    assert off[_leg("FR")] == pytest.approx(0.2)
    assert off[_leg("RL")] == pytest.approx(0.3)
    assert off[_leg("RR")] == pytest.approx(0.1)


@pytest.mark.parametrize("gait,pairs", [
    ("trot", [("FR", "RL"), ("FL", "RR")]),
    ("pace", [("FR", "RR"), ("FL", "RL")]),
    ("bound", [("FR", "FL"), ("RR", "RL")]),
    ("pronk", [("FR", "FL", "RR", "RL")]),
])
def test_named_gaits_move_the_right_feet_together(gait, pairs):
    off = foot_offsets(*(torch.tensor([v]) for v in GAITS[gait]))
    phases = foot_phases(torch.tensor([0.37]), off)[0]
    for group in pairs:
        values = [float(phases[_leg(leg)]) for leg in group]
        assert max(values) - min(values) == pytest.approx(0.0)
    if len(pairs) == 2:  # the two groups are half a cycle apart
        a, b = float(phases[_leg(pairs[0][0])]), float(phases[_leg(pairs[1][0])])
        assert abs(a - b) == pytest.approx(0.5)


def test_swing_profiles_start_and_end_at_rest():
    w = torch.tensor([0.0, 0.5, 1.0])
    assert cycloid(w).tolist() == pytest.approx([0.0, 0.5, 1.0], abs=1e-6)
    assert swing_lift(w).tolist() == pytest.approx([0.0, 1.0, 0.0], abs=1e-6)
    # zero slope at both ends: no velocity step at lift-off or touchdown
    eps = torch.tensor([1e-3, 1 - 1e-3])
    assert (cycloid(eps) - torch.tensor([0.0, 1.0])).abs().max() < 1e-6


def test_tilt_from_gravity_inverts_tilt_matrix():
    roll, pitch = torch.tensor([0.3, -0.2]), torch.tensor([-0.1, 0.25])
    rot = tilt_matrix(roll, pitch)                                   # body -> yaw frame
    g_b = (rot.transpose(1, 2) @ torch.tensor([0.0, 0.0, -1.0])).squeeze(-1)
    r2, p2 = tilt_from_gravity(g_b)
    assert torch.allclose(r2, roll, atol=1e-6) and torch.allclose(p2, pitch, atol=1e-6)
    # positive pitch is nose down: the base x axis points below the horizon
    x_axis = tilt_matrix(torch.tensor([0.0]), torch.tensor([0.2]))[0, :, 0]
    assert x_axis[2] < 0


def test_wrench_distribution_reproduces_the_wrench_and_skips_swing_feet():
    feet = torch.tensor([[[0.2, -0.13, -0.3], [0.2, 0.13, -0.3], [-0.2, -0.13, -0.3], [-0.2, 0.13, -0.3]]])
    wrench = torch.tensor([[5.0, -3.0, 120.0, 0.5, -1.0, 0.8]])
    f = distribute_wrench(feet, torch.ones(1, 4, dtype=torch.bool), wrench, 20.0, 1e-6)
    total = f.sum(1)
    moment = torch.cross(feet, f, dim=-1).sum(1)
    assert torch.allclose(torch.cat([total, moment], -1), wrench, atol=1e-2)
    stance = torch.tensor([[True, False, False, True]])
    f2 = distribute_wrench(feet, stance, torch.tensor([[0.0, 0, 120.0, 0, 0, 0]]), 20.0, 1e-6)
    assert f2[0, 1].abs().max() == 0 and f2[0, 2].abs().max() == 0
    assert f2[0, :, 2].sum() == pytest.approx(120.0, rel=1e-3)
    assert torch.allclose(skew(torch.tensor([1.0, 2.0, 3.0])) @ torch.tensor([0.5, -1.0, 2.0]),
                          torch.cross(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, -1.0, 2.0]), dim=0))


def test_joystick_rows_use_the_default_gait_and_full_rows_are_read():
    cmd = torch.zeros(2, len(COMMAND_NAMES))
    cmd[:, 0] = 0.5
    full = dict(zip(COMMAND_NAMES, [0.5, 0.0, 0.0, -0.05, 2.5, 0.0, 0.5, 0.0, 0.6, 0.12, 0.1, 0.0, 0.3, 0.42, 0.0]))
    cmd[1] = torch.tensor([full[n] for n in COMMAND_NAMES])
    prm = resolve_params(cmd, GaitDefaults(), "pace", 0.3, 0.28, 0.38, GaitGains())
    assert prm.frequency.tolist() == pytest.approx([3.0, 2.5])
    assert prm.offsets[0].tolist() == pytest.approx(foot_offsets(*(torch.tensor([v]) for v in GAITS["pace"]))[0].tolist())
    assert prm.offsets[1].tolist() == pytest.approx(foot_offsets(*(torch.tensor([v]) for v in GAITS["bound"]))[0].tolist())
    assert prm.height.tolist() == pytest.approx([0.3, 0.25])
    assert prm.duration[1] == pytest.approx(0.6) and prm.swing_height[1] == pytest.approx(0.12)
    assert prm.pitch[1] == pytest.approx(0.1)
    assert prm.stance_width.tolist() == pytest.approx([0.28, 0.3])
    assert prm.stance_length.tolist() == pytest.approx([0.38, 0.42])


def test_partly_filled_rows_default_only_the_entries_that_cannot_be_zero_and_everything_is_clamped():
    names = list(COMMAND_NAMES)
    cmd = torch.zeros(1, len(names))
    cmd[0, names.index("gait_phase")] = 0.5                 # a non-joystick row: entries are read
    cmd[0, names.index("lin_vel_x")] = 9.0                  # beyond max_lin_vel
    cmd[0, names.index("body_height")] = -1.0               # beyond the -0.15 m offset
    cmd[0, names.index("gait_duration")] = 0.95             # beyond the 0.8 duty
    defaults = GaitDefaults(frequency=2.0, swing_height=0.07)
    prm = resolve_params(cmd, defaults, "trot", 0.3, 0.28, 0.38, GaitGains(max_lin_vel=1.2))
    # zero where zero cannot mean itself -> the default; zero pitch, roll, offset, bound stay zero
    assert prm.frequency.item() == pytest.approx(2.0) and prm.swing_height.item() == pytest.approx(0.07)
    assert prm.stance_width.item() == pytest.approx(0.28) and prm.stance_length.item() == pytest.approx(0.38)
    assert prm.pitch.item() == 0.0 and prm.roll.item() == 0.0
    assert prm.offsets[0].tolist() == pytest.approx(foot_offsets(*(torch.tensor([v]) for v in (0.5, 0.0, 0.0)))[0].tolist())
    assert prm.vx.item() == pytest.approx(1.2) and prm.vy.item() == 0.0
    assert prm.height.item() == pytest.approx(0.15) and prm.duration.item() == pytest.approx(0.8)


def test_bad_input_is_a_clear_error():
    robot = get_robot("go1")
    with pytest.raises(ValueError, match="unknown gait 'gallop'"):
        GaitController(robot, 2, gait="gallop")
    with pytest.raises(ValueError, match="num_envs"):
        GaitController(robot, 0)
    ctrl = GaitController(robot, 2)
    check_policy(ctrl)
    assert ctrl.action_space == "joint" and ctrl.policy_id == "gait:trot"
    with pytest.raises(KeyError, match="dof_vel"):
        ctrl.act({k: torch.zeros(2, 3) for k in ("commands", "base_lin_vel", "base_ang_vel",
                                                  "projected_gravity", "dof_pos")})
    obs = _standing_obs(2)
    obs["commands"] = torch.zeros(3, len(COMMAND_NAMES))
    with pytest.raises(ValueError, match="commands must be"):
        ctrl.act(obs)


def _standing_obs(n: int) -> dict[str, torch.Tensor]:
    cmd = torch.zeros(n, len(COMMAND_NAMES))
    cmd[:, 0] = 0.5
    return {"commands": cmd, "base_lin_vel": torch.zeros(n, 3), "base_ang_vel": torch.zeros(n, 3),
            "projected_gravity": torch.tensor([[0.0, 0.0, -1.0]]).repeat(n, 1),
            "dof_pos": torch.zeros(n, 12), "dof_vel": torch.zeros(n, 12)}


def test_deterministic_and_reset_restarts_the_clock():
    robot = get_robot("go1")
    a, b = GaitController(robot, 3), GaitController(robot, 3)
    for _ in range(30):
        out_a, out_b = a.act(_standing_obs(3)), b.act(_standing_obs(3))
        assert torch.equal(out_a, out_b)
    assert torch.isfinite(out_a).all()
    assert (a.clock > 0).all()
    a.reset(torch.tensor([1]))
    assert a.clock[1] == 0 and a.clock[0] > 0 and a.elapsed[1] == 0 and (a.v_ref[1] == 0).all()


# --- closed loop on the real env -------------------------------------------------------------------

def _walk(robot: str, commands: list[list[float]], steps: int, gait: str = "trot"):
    from quadforge.envs.config import EnvConfig
    from quadforge.envs.vec_env import LeggedEnv

    n = len(commands)
    cfg = EnvConfig.flat(robot=robot, num_envs=n, seed=3)
    cfg.curriculum = False
    cfg.randomization.push_robots = False
    env = LeggedEnv(cfg)
    ctrl = GaitController(env.robot, n, env.dt, gait=gait)
    cmd = env.commands.clone()
    cmd[:, :3] = torch.tensor(commands)
    env.set_commands(torch.arange(n), cmd)
    ctrl.reset(torch.arange(n))
    falls = torch.zeros(n)
    vel = []
    for t in range(steps):
        _, _, dones, extras = env.step(ctrl.act(env.terms))
        falls += (dones & ~extras["time_outs"]).float()
        if t >= steps // 2:
            vel.append(torch.stack([env.terms["base_lin_vel"][:, 0], env.terms["base_ang_vel"][:, 2]], -1))
    env.close()
    return falls, torch.stack(vel).mean(0)


def test_go1_trot_tracks_forward_backward_and_turning_commands():
    commands = [[0.0, 0.0, 0.0], [0.5, 0.0, 0.0], [-0.5, 0.0, 0.0], [0.5, 0.0, 0.5]]
    falls, vel = _walk("go1", commands, steps=200)
    assert falls.sum() == 0
    target = torch.tensor(commands)
    assert (vel[:, 0] - target[:, 0]).abs().max() < 0.15, vel
    assert (vel[3, 1] - 0.5).abs() < 0.15, vel


def test_aliengo_trot_walks():
    falls, vel = _walk("aliengo", [[0.5, 0.0, 0.0], [0.0, 0.0, -0.5]], steps=150)
    assert falls.sum() == 0
    assert (vel[0, 0] - 0.5).abs() < 0.15 and (vel[1, 1] + 0.5).abs() < 0.2, vel


def test_bench_sweep_runs_one_episode_per_env_and_reports_rows():
    from quadforge.tools.bench.experts import Sweep, _run

    sweep = Sweep("trot", None, [("vx +0.5", [0.5, 0.0, 0.0], None), ("vx +0.0", [0.0, 0.0, 0.0], None)], 1)
    rows = _run(sweep, "go1", episode_s=1.0, seed=0)
    assert [r["label"] for r in rows] == ["vx +0.5", "vx +0.0"]
    assert all(r["episodes"] == 1 and r["fall_rate"] == 0.0 and r["falls_off_tile"] == 0 for r in rows)
    assert rows[0]["distance"] > rows[1]["distance"]   # the commanded robot moved further


def test_stumble_reflex_lifts_a_swing_foot_that_lags_its_path():
    # the measured legs never move (dof_pos stays at the default), so swing feet fall behind their path
    ctrl = GaitController(get_robot("go1"), 1)
    obs = _standing_obs(1)
    obs["commands"][:, 0] = 1.0
    lifted = False
    for _ in range(60):
        ctrl.act(obs)
        swing = ~ctrl.was_stance[0]
        assert (ctrl.stumble[0][~swing] == 0).all()
        assert (ctrl.stumble <= ctrl.gains.stumble_max + 1e-6).all()
        lifted |= bool((ctrl.stumble[0][swing] > 0).any())
    assert lifted
    off = GaitController(get_robot("go1"), 1, gains=GaitGains(stumble_gain=0.0))
    for _ in range(60):
        off.act(obs)
    assert (off.stumble == 0).all()


def test_terrain_below_takes_the_highest_of_the_surrounding_scan_cells():
    from quadforge.envs.observations import scan_points_b
    from quadforge.experts.gait import terrain_below
    pts = scan_points_b()
    terrain = torch.where((pts[:, 0] > 0.25) & (pts[:, 0] < 0.55), 0.1, 0.0) - 0.3   # a box at x 0.3..0.5
    scan = (-terrain).unsqueeze(0)                                                  # base z - terrain z
    xy = torch.tensor([[[0.0, 0.0], [0.22, 0.0], [0.35, 0.1], [0.6, 0.0], [2.0, 0.0]]])
    got = terrain_below(scan, xy)
    assert torch.allclose(got, torch.tensor([[-0.3, -0.2, -0.2, -0.3, -0.3]]))


def test_scan_lookups_match_a_point_by_point_reading_of_the_grid_on_and_off_it():
    from quadforge.experts.gait import terrain_at, terrain_below
    from quadforge.layout import HEIGHT_SCAN_X, HEIGHT_SCAN_Y
    g = torch.Generator().manual_seed(3)
    nx, ny = len(HEIGHT_SCAN_X), len(HEIGHT_SCAN_Y)
    scan = torch.rand(3, nx * ny, generator=g)
    lo = torch.tensor([HEIGHT_SCAN_X[0], HEIGHT_SCAN_Y[0]])
    hi = torch.tensor([HEIGHT_SCAN_X[-1], HEIGHT_SCAN_Y[-1]])
    xy = lo - 0.3 + torch.rand(3, 5, 4, 2, generator=g) * (hi - lo + 0.6)   # a margin off every side
    step = HEIGHT_SCAN_X[1] - HEIGHT_SCAN_X[0]
    grid = -scan.view(3, nx, ny)
    below, at = terrain_below(scan, xy), terrain_at(scan, xy)
    assert below.shape == at.shape == (3, 5, 4)
    for b in range(3):
        for k, (x, y) in enumerate(xy[b].reshape(-1, 2).tolist()):
            u, v = (x - HEIGHT_SCAN_X[0]) / step, (y - HEIGHT_SCAN_Y[0]) / step
            i, j = math.floor(u), math.floor(v)
            cells = [grid[b, min(max(i + di, 0), nx - 1), min(max(j + dj, 0), ny - 1)] for di in (0, 1) for dj in (0, 1)]
            assert below[b].reshape(-1)[k] == max(cells)
            u, v = min(max(u, 0.0), nx - 1), min(max(v, 0.0), ny - 1)
            i, j = min(math.floor(u), nx - 2), min(math.floor(v), ny - 2)
            fu, fv = u - i, v - j
            want = ((1 - fu) * ((1 - fv) * grid[b, i, j] + fv * grid[b, i, j + 1])
                    + fu * ((1 - fv) * grid[b, i + 1, j] + fv * grid[b, i + 1, j + 1]))
            assert at[b].reshape(-1)[k].item() == pytest.approx(want.item(), abs=1e-5)


def test_height_scan_lifts_swing_feet_over_an_obstacle_and_changes_nothing_on_flat_ground():
    from quadforge.envs.observations import scan_points_b
    robot = get_robot("go1")
    # the body-height estimate from the scan has its own test; here only the swing legs may change
    gains = GaitGains(stumble_gain=0.0, scan_body_height=0.0, scan_duty=0.0, scan_body_drop=0.0)
    pts = scan_points_b()
    base_h = robot.nominal_base_height
    flat_scan = torch.full((1, pts.shape[0]), base_h)
    box_scan = flat_scan - torch.where((pts[:, 0] > 0.1) & (pts[:, 0] < 0.7), 0.12, 0.0)  # 12 cm box ahead
    blind, flat, box = (GaitController(robot, 1, gains=gains) for _ in range(3))
    higher = False
    for _ in range(40):
        obs = _standing_obs(1)
        a_blind = blind.act(obs)
        a_flat = flat.act({**obs, "height_scan": flat_scan})
        a_box = box.act({**obs, "height_scan": box_scan})
        assert torch.equal(a_blind, a_flat)     # flat ground: the scan changes nothing
        feet = lambda a: robot_feet(robot, a)   # noqa: E731
        swing = ~box.was_stance[0]
        dz = feet(a_box)[0, :, 2] - feet(a_blind)[0, :, 2]
        assert (dz[~swing].abs() < 1e-5).all()  # stance legs are untouched
        assert (dz[swing] >= -1e-5).all()
        higher |= bool((dz[swing] > 0.03).any())
    assert higher
    assert "height_scan" in GaitController.obs_terms   # declared (privileged, optional)


def robot_feet(robot, actions: torch.Tensor) -> torch.Tensor:
    from quadforge.envs.kinematics import LegKinematics
    q = torch.as_tensor(robot.default_joint_pos, dtype=torch.float32) + actions * robot.action_scale
    return LegKinematics(robot).forward(q)


def test_terrain_at_interpolates_the_scan_and_is_exact_on_a_plane():
    from quadforge.envs.observations import scan_points_b
    from quadforge.experts.gait import terrain_at
    pts = scan_points_b()
    plane = 0.2 * pts[:, 0] - 0.1 * pts[:, 1] - 0.3
    xy = torch.tensor([[[0.0, 0.0], [0.23, -0.17], [0.55, 0.41]]])
    assert torch.allclose(terrain_at((-plane).unsqueeze(0), xy), 0.2 * xy[..., 0] - 0.1 * xy[..., 1] - 0.3, atol=1e-6)
    step = torch.where(pts[:, 0] > 0.25, 0.1, 0.0) - 0.3          # samples x 0.2 -> -0.3, x 0.3 -> -0.2
    got = terrain_at((-step).unsqueeze(0), torch.tensor([[[0.225, 0.0], [2.0, 0.0]]]))
    assert torch.allclose(got, torch.tensor([[-0.275, -0.2]]), atol=1e-6)   # between samples; off-grid: border


def test_body_height_follows_the_scanned_terrain_under_the_footholds():
    from quadforge.envs.kinematics import LegKinematics
    from quadforge.envs.observations import scan_points_b
    robot = get_robot("go1")
    pts = scan_points_b()
    stand = LegKinematics(robot).forward(torch.as_tensor(robot.default_joint_pos, dtype=torch.float32))
    measured = float(robot.foot_radius - stand[:, 2].mean())       # base height the standing legs measure
    level = torch.full((1, pts.shape[0]), measured)                  # the scan agrees with the legs
    pit = level + torch.where(pts[:, 1] < 0, 0.1, 0.0)               # the right footholds over a 10 cm pit
    reach = GaitGains().scan_height_range
    at_range = level + torch.where(pts[:, 1] < 0, reach, 0.0)
    too_deep = level + torch.where(pts[:, 1] < 0, 1.0, 0.0)        # a 1 m gap counts as deep as the range
    # the uneven-ground body drop has its own test: off here, so only the height estimate differs
    blind, agree, over_pit, ranged, deep = (GaitController(robot, 1, gains=GaitGains(scan_body_drop=0.0))
                                            for _ in range(5))
    off = GaitController(robot, 1, gains=GaitGains(scan_body_height=0.0, scan_body_drop=0.0))
    for _ in range(5):   # settling: four legs in stance, no swing planning involved
        obs = _standing_obs(1)
        a_blind = blind.act(obs)
        assert torch.allclose(agree.act({**obs, "height_scan": level}), a_blind, atol=1e-5)
        assert torch.equal(off.act({**obs, "height_scan": pit}), a_blind)
        a_pit = over_pit.act({**obs, "height_scan": pit})
        assert torch.allclose(deep.act({**obs, "height_scan": too_deep}),
                              ranged.act({**obs, "height_scan": at_range}), atol=1e-5)
    # the body stands 5 cm higher over the mean terrain than the legs say: the height loop asks for less
    # vertical force, so the stance legs (targets q + tau / Kp at q = default) push less
    assert a_pit.abs().sum() < 0.8 * a_blind.abs().sum()


def test_uneven_scan_widens_the_stance_and_flat_scan_does_not():
    from quadforge.envs.observations import scan_points_b
    robot = get_robot("go1")
    # only the stance-width rule may differ between the controllers: no swing lift, no scan body height
    base = dict(stumble_gain=0.0, scan_body_height=0.0, scan_max_extra=0.0, scan_duty=0.0, scan_body_drop=0.0)
    extra = 0.12
    pts = scan_points_b()
    flat_scan = torch.full((1, pts.shape[0]), robot.nominal_base_height)
    uneven = flat_scan - torch.where(pts[:, 0] > 0.6, 0.02, 0.0)   # a 2 cm step beyond the feet
    wide, narrow, flat = (GaitController(robot, 1, gains=GaitGains(**base, scan_stance_width=w, scan_uneven=0.005))
                          for w in (extra, 0.0, extra))
    blind = GaitController(robot, 1, gains=GaitGains(**base))
    wider = 0
    for _ in range(40):
        obs = _standing_obs(1)
        a_wide, a_narrow = wide.act({**obs, "height_scan": uneven}), narrow.act({**obs, "height_scan": uneven})
        assert torch.equal(flat.act({**obs, "height_scan": flat_scan}), blind.act(obs))   # flat: untouched
        swing = ~wide.was_stance[0]
        y_wide, y_narrow = robot_feet(robot, a_wide)[0, :, 1], robot_feet(robot, a_narrow)[0, :, 1]
        assert torch.allclose(y_wide[~swing], y_narrow[~swing], atol=1e-5)   # stance legs untouched
        side = torch.sign(y_narrow)
        assert ((y_wide - y_narrow)[swing] * side[swing] >= -1e-5).all()    # swing feet only move outwards
        wider += int(((y_wide - y_narrow)[swing] * side[swing] > 0.8 * extra / 2).any())
    assert wider > 0   # near touchdown a swing foot is (most of) the extra half-width further out


def _support_counts(ctrl: GaitController, obs: dict, steps: int) -> list[int]:
    """Feet in stance after each step once the settle period is over."""
    counts = []
    for _ in range(steps):
        ctrl.act(obs)
        if bool((ctrl.elapsed > ctrl.gains.settle_s).all()):
            counts.append(int(ctrl.was_stance[0].sum()))
    return counts


@pytest.mark.parametrize("uneven_gains,support", [
    (dict(scan_duty=0.6), {2, 4}),                                  # walking trot: 4-foot phases
    (dict(scan_duty=0.6, scan_frequency=2.5), {2, 4}),
    (dict(scan_gait="walk", scan_duty=0.75, scan_frequency=2.0), {3}),   # walk: always 3 feet down
])
def test_uneven_scan_raises_the_duty_and_flat_scan_changes_nothing(uneven_gains, support):
    from quadforge.envs.observations import scan_points_b
    robot = get_robot("go1")
    pts = scan_points_b()
    flat_scan = torch.full((1, pts.shape[0]), robot.nominal_base_height)
    uneven = flat_scan - torch.where(pts[:, 0] > 0.6, 0.02, 0.0)   # a 2 cm step beyond the feet
    gains = GaitGains(**uneven_gains)
    off = GaitGains(scan_duty=0.0)
    adapted, flat, ref, plain = (GaitController(robot, 1, gains=g) for g in (gains, gains, off, off))
    obs = _standing_obs(1)
    for _ in range(60):   # flat ground: bit-for-bit the controller without the rule
        on_flat = {**obs, "height_scan": flat_scan}
        assert torch.equal(flat.act(on_flat), ref.act(on_flat))
    assert set(_support_counts(plain, {**obs, "height_scan": uneven}, 60)) == {2}   # the plain trot
    counts = _support_counts(adapted, {**obs, "height_scan": uneven}, 60)
    assert set(counts) == support, counts
    if "scan_frequency" in uneven_gains:   # the clock runs at the lower frequency
        expected = uneven_gains["scan_frequency"] * adapted.dt * (60 - round(gains.settle_s / adapted.dt))
        assert float(adapted.clock[0]) == pytest.approx(expected % 1.0, abs=adapted.dt * 3.0)


def test_unknown_uneven_ground_gait_is_a_clear_error():
    with pytest.raises(ValueError, match="scan_gait"):
        GaitController(get_robot("go1"), 1, gains=GaitGains(scan_gait="gallop"))


def test_uneven_scan_lowers_the_body_and_flat_scan_does_not():
    from quadforge.envs.observations import scan_points_b
    robot = get_robot("go1")
    pts = scan_points_b()
    flat_scan = torch.full((1, pts.shape[0]), robot.nominal_base_height)
    uneven = flat_scan - torch.where(pts[:, 0] > 0.6, 0.02, 0.0)   # a 2 cm step beyond the feet
    lower, level, flat, ref = (GaitController(robot, 1, gains=GaitGains(scan_body_drop=d)) for d in (0.03, 0.0, 0.03, 0.0))
    for _ in range(5):   # settling: four legs in stance, the height loop alone sets the vertical force
        obs = _standing_obs(1)
        assert torch.equal(flat.act({**obs, "height_scan": flat_scan}), ref.act({**obs, "height_scan": flat_scan}))
        a_lower, a_level = lower.act({**obs, "height_scan": uneven}), level.act({**obs, "height_scan": uneven})
    # a 3 cm lower target asks for 3 m/s^2 less vertical acceleration: the stance legs push less
    assert a_lower.abs().sum() < 0.9 * a_level.abs().sum()
