"""The reward registry and manager on hand-made states (no physics)."""
import math

import pytest
import torch

from quadforge.envs.backends.base import RobotState
from quadforge.envs.config import DEFAULT_REWARD_SCALES
from quadforge.envs.observations import TaskView
from quadforge.envs.step_log import read_logs
from quadforge.envs.reward_manager import RewardManager
from quadforge.envs.rewards import REWARD_TERMS, FeetAirTime, RewardView

N = 3


def _state(**over):
    z = lambda *s: torch.zeros(*s)  # noqa: E731
    st = dict(root_pos_w=z(N, 3), root_quat_w=torch.tensor([[1.0, 0, 0, 0]] * N), root_lin_vel_w=z(N, 3),
              root_ang_vel_w=z(N, 3), root_lin_vel_b=z(N, 3), root_ang_vel_b=z(N, 3),
              projected_gravity_b=torch.tensor([[0, 0, -1.0]] * N), joint_pos=z(N, 12), joint_vel=z(N, 12),
              joint_torque=z(N, 12), foot_pos_w=z(N, 4, 3), foot_contact=torch.ones(N, 4, dtype=torch.bool),
              contact_forces=z(N, 13, 3), body_names=("base",) + tuple(f"L{i}_thigh" for i in range(12)))
    st.update(over)
    return RobotState(**st)


def _view(state=None, commands=None, actions=None, last_actions=None, terminated=None, **over):
    state = state or _state()
    task = TaskView(state=state, default_joint_pos=torch.zeros(12),
                    commands=commands if commands is not None else torch.zeros(N, 15),
                    actions=actions if actions is not None else torch.zeros(N, 12),
                    last_actions=last_actions if last_actions is not None else torch.zeros(N, 12),
                    gait_time=torch.zeros(N), env_params={}, terrain_height=lambda xy: xy[..., 0] * 0, flat=True)
    kw = dict(task=task, dt=0.02, tracking_sigma=0.25, last_joint_vel=torch.zeros(N, 12),
              terminated=terminated if terminated is not None else torch.zeros(N, dtype=torch.bool),
              feet_first_contact=torch.zeros(N, 4, dtype=torch.bool), feet_air_time=torch.zeros(N, 4),
              feet_air_time_target=0.5, base_height=torch.full((N,), 0.3), base_height_target=0.3,
              soft_dof_pos_limits=torch.tensor([[-1.0, 1.0]] * 12), soft_dof_vel_limits=torch.full((12,), 10.0),
              soft_torque_limits=torch.full((12,), 20.0), penalized_bodies=torch.arange(1, 13),
              feet_bodies=torch.arange(1, 5), max_contact_force=100.0)
    kw.update(over)
    return RewardView(**kw)


def test_registry_holds_legged_gym_terms_and_defaults_are_known():
    for name in ("tracking_lin_vel", "tracking_ang_vel", "lin_vel_z", "ang_vel_xy", "orientation", "torques",
                 "dof_acc", "dof_pos_limits", "collision", "action_rate", "feet_air_time", "stand_still",
                 "base_height", "termination"):
        assert name in REWARD_TERMS
    assert set(DEFAULT_REWARD_SCALES) <= set(REWARD_TERMS)


def test_unknown_term_is_a_construction_error():
    with pytest.raises(ValueError, match="unknown terms.*'walkk'.*known terms"):
        RewardManager({"walkk": 1.0}, 0.02, N, True)


def test_tracking_is_exp_of_squared_error():
    st = _state(root_lin_vel_b=torch.tensor([[1.0, 0, 0], [0.5, 0, 0], [0, 0, 0]]),
                root_ang_vel_b=torch.tensor([[0, 0, 0.5], [0, 0, 0], [0, 0, 0]]))
    cmd = torch.zeros(N, 15)
    cmd[:, 0], cmd[:, 2] = 1.0, 0.5
    v = _view(st, cmd)
    torch.testing.assert_close(REWARD_TERMS["tracking_lin_vel"](v),
                               torch.tensor([1.0, math.exp(-0.25 / 0.25), math.exp(-1.0 / 0.25)]))
    torch.testing.assert_close(REWARD_TERMS["tracking_ang_vel"](v),
                               torch.tensor([1.0, math.exp(-1.0), math.exp(-1.0)]))


def test_penalties():
    q = torch.zeros(N, 12)
    q[0, 0] = 1.5  # 0.5 past the soft upper limit
    q[1, 3] = -1.25
    st = _state(joint_pos=q, root_lin_vel_b=torch.tensor([[0, 0, 2.0]] * N))
    cf = torch.zeros(N, 13, 3)
    cf[2, 1, 2] = 5.0   # a thigh touches
    cf[2, 0, 2] = 50.0  # base contact is not a "collision" penalty (it terminates)
    st.contact_forces = cf
    a, la = torch.ones(N, 12), torch.zeros(N, 12)
    v = _view(st, actions=a, last_actions=la)
    torch.testing.assert_close(REWARD_TERMS["dof_pos_limits"](v), torch.tensor([0.5, 0.25, 0.0]))
    torch.testing.assert_close(REWARD_TERMS["lin_vel_z"](v), torch.full((N,), 4.0))
    torch.testing.assert_close(REWARD_TERMS["collision"](v), torch.tensor([0.0, 0.0, 1.0]))
    torch.testing.assert_close(REWARD_TERMS["action_rate"](v), torch.full((N,), 12.0))
    # standing still is only penalised without a command
    cmd = torch.zeros(N, 15)
    cmd[1, 0] = 1.0
    torch.testing.assert_close(REWARD_TERMS["stand_still"](_view(st, cmd)), torch.tensor([1.5, 0.0, 0.0]))


def test_manager_scales_by_dt_clips_then_adds_termination():
    st = _state(root_lin_vel_b=torch.tensor([[0, 0, 1.0]] * N))
    cmd = torch.zeros(N, 15)
    term = torch.tensor([False, True, False])
    m = RewardManager({"tracking_lin_vel": 1.0, "lin_vel_z": -2.0, "termination": -5.0, "orientation": 0.0},
                      dt=0.02, num_envs=N, only_positive=True)
    assert "orientation" not in m.scales  # zero scales are skipped
    r = m.compute(_view(st, cmd, terminated=term))
    # tracking 1*0.02 - 2*1*0.02 = -0.02 -> clipped to 0; termination -5*0.02 after the clip
    torch.testing.assert_close(r, torch.tensor([0.0, -0.1, 0.0]))
    log = read_logs([m.pop_episode(torch.tensor([0, 1]), episode_length_s=20.0)])
    assert log["Episode_Reward/lin_vel_z"] == pytest.approx(-0.04 / 20)
    assert log["Episode_Reward/termination"] == pytest.approx(-0.05 / 20)
    assert m.episode_sums["lin_vel_z"][0] == 0 and m.episode_sums["lin_vel_z"][2] != 0


def test_feet_air_time_rewards_touchdown_after_long_swing():
    air = FeetAirTime(1, "cpu")
    dt = 0.02
    air.update(torch.tensor([[True] * 4]), dt)
    air.update(torch.tensor([[True] * 4]), dt)
    swing = torch.tensor([[False, True, True, True]])
    for _ in range(40):  # 0.8 s in the air for foot 0 (the filter keeps one extra step of contact)
        first, t = air.update(swing, dt)
        assert not first.any()
    first, t = air.update(torch.tensor([[True] * 4]), dt)
    assert first.tolist() == [[True, False, False, False]]
    assert t[0, 0].item() == pytest.approx(0.8, abs=1e-5)
    cmd = torch.zeros(1, 15)
    cmd[0, 0] = 1.0
    global N
    old, N = N, 1
    try:
        v = _view(commands=cmd, feet_first_contact=first, feet_air_time=t)
        assert REWARD_TERMS["feet_air_time"](v).item() == pytest.approx(0.3, abs=1e-5)
        v = _view(commands=torch.zeros(1, 15), feet_first_contact=first, feet_air_time=t)
        assert REWARD_TERMS["feet_air_time"](v).item() == 0.0
    finally:
        N = old


def _random_view(n: int, seed: int) -> RewardView:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    global N
    old, N = N, n
    try:
        st = _state(root_lin_vel_b=r(n, 3), root_ang_vel_b=r(n, 3), projected_gravity_b=r(n, 3),
                    joint_pos=r(n, 12), joint_vel=10 * r(n, 12), joint_torque=20 * r(n, 12),
                    contact_forces=30 * r(n, 13, 3), foot_contact=r(n, 4) > 0)
        return _view(st, commands=r(n, 15), actions=r(n, 12), last_actions=r(n, 12), last_joint_vel=10 * r(n, 12),
                     terminated=r(n) > 1, base_height=0.3 + 0.1 * r(n), feet_first_contact=r(n, 4) > 0,
                     feet_air_time=r(n, 4).abs())
    finally:
        N = old


def test_square_terms_match_the_registry_functions():
    from quadforge.envs.rewards_fused import SQUARE_TERMS, SquareTerms
    names = sorted(SQUARE_TERMS)
    for seed, n in ((0, 64), (1, 5)):
        v = _random_view(n, seed)
        block = SquareTerms(names[::-1]).compute(v)                      # any order in, kernels first out
        sq = SquareTerms(names[::-1])
        assert sq.names[:2] == ["tracking_lin_vel", "tracking_ang_vel"] and set(sq.names) == set(names)
        for t, name in enumerate(sq.names):
            # one matmul sums in another order than torch.sum: float32 rounding, not bit for bit
            torch.testing.assert_close(block[:, t], REWARD_TERMS[name](v), rtol=2e-6, atol=1e-6)
        # the task's (N, 3) velocity-error block gives the same kernels
        v.vel_err = torch.cat((v.task.state.root_lin_vel_b[:, :2] - v.task.commands[:, :2],
                               (v.task.state.root_ang_vel_b[:, 2] - v.task.commands[:, 2])[:, None]), dim=1)
        torch.testing.assert_close(SquareTerms(names).compute(v)[:, :2], block[:, :2], rtol=0, atol=0)
    with pytest.raises(ValueError, match="not sum-of-squares terms"):
        SquareTerms(["collision"])


def test_manager_total_matches_the_registry_sum():
    scales = {name: -0.1 * (i + 1) for i, name in enumerate(REWARD_TERMS)}
    scales["tracking_lin_vel"], scales["tracking_ang_vel"] = 1.0, 0.5
    for only_positive in (True, False):
        m = RewardManager(scales, dt=0.02, num_envs=64, only_positive=only_positive)
        assert set(m.names) == set(REWARD_TERMS) and m.names[-1] == "termination"
        v = _random_view(64, 3)
        got = m.compute(v)
        per_term = {name: REWARD_TERMS[name](v) * (s * 0.02) for name, s in scales.items()}
        total = sum(t for name, t in per_term.items() if name != "termination")
        if only_positive:
            total = total.clamp(min=0.0)
        total = total + per_term["termination"]
        torch.testing.assert_close(got, total, rtol=1e-5, atol=1e-5)
        for name in scales:
            torch.testing.assert_close(m.episode_sums[name], per_term[name], rtol=1e-5, atol=1e-6)
