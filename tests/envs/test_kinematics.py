"""Leg FK against MuJoCo's own foot sites, and IK as its inverse on the reachable set."""
from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

from quadforge.envs.kinematics import LegKinematics, forward_kinematics, inverse_kinematics
from quadforge.envs.robots import ROBOTS, get_robot


def _random_q(robot, n, seed):
    rng = np.random.default_rng(seed)
    lo, hi = np.asarray(robot.joint_ranges).T
    return rng.uniform(lo, hi, size=(n, 12))


def _posed(m, d, q) -> None:
    """The robot at joint angles q with its base at the origin, identity orientation (world = base frame)."""
    d.qpos[:] = 0.0
    d.qpos[3] = 1.0
    d.qpos[7:] = q
    mujoco.mj_kinematics(m, d)


@pytest.mark.parametrize("name", ROBOTS)
def test_fk_matches_mujoco_foot_sites(name):
    robot = get_robot(name)
    m = robot.load_model()
    d = mujoco.MjData(m)
    qs = _random_q(robot, 64, seed=1)
    feet = forward_kinematics(robot, torch.tensor(qs, dtype=torch.float64)).numpy()  # (64, 4, 3)
    for q, foot in zip(qs, feet):
        _posed(m, d, q)
        sites = np.stack([d.site(s).xpos for s in robot.foot_sites])
        np.testing.assert_allclose(foot, sites, atol=1e-9)


@pytest.mark.parametrize("name", ROBOTS)
def test_ik_inverts_fk_on_reachable_set(name):
    robot = get_robot(name)
    kin = LegKinematics(robot, dtype=torch.float64)
    q = torch.tensor(_random_q(robot, 4000, seed=2))
    # reachable set of the knee-backward, foot-below-hip solution: the foot below the thigh joint in
    # the leg's sagittal plane, not at full stretch/fold (where the knee angle is ill-conditioned)
    qq = q.view(-1, 4, 3)
    l1, l2 = robot.thigh_length, robot.calf_length
    z_sag = -l1 * torch.cos(qq[..., 1]) - l2 * torch.cos(qq[..., 1] + qq[..., 2])
    ok = ((z_sag < -0.02) & (qq[..., 2] < -0.05)).all(-1)
    q = q[ok]
    assert len(q) > 300
    q_back = kin.inverse(kin.forward(q))
    torch.testing.assert_close(q_back, q, atol=1e-7, rtol=0)


@pytest.mark.parametrize("name", ROBOTS)
def test_ik_default_pose_and_batch_shapes(name):
    robot = get_robot(name)
    q0 = torch.tensor(robot.default_joint_pos)
    feet = forward_kinematics(robot, q0.expand(2, 3, 12))
    assert feet.shape == (2, 3, 4, 3)
    torch.testing.assert_close(inverse_kinematics(robot, feet), q0.expand(2, 3, 12), atol=1e-5, rtol=0)
    # the default pose stands the feet below the hips, outward of them
    foot = feet[0, 0]
    hips = torch.tensor(robot.hip_offsets)
    assert (foot[:, 2] < -0.25).all()
    assert (foot[:, 1].abs() > hips[:, 1].abs()).all()


@pytest.mark.parametrize("name", ROBOTS)
def test_ik_unreachable_targets_are_safe_and_clamped(name):
    robot = get_robot(name)
    kin = LegKinematics(robot, dtype=torch.float64)
    hips = torch.tensor(robot.hip_offsets, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    targets = torch.cat([
        hips + torch.randn(256, 4, 3, generator=g, dtype=torch.float64) * 2.0,  # mostly far out of reach
        hips.expand(3, 4, 3).clone(),                                            # exactly at the hip
        (hips + torch.tensor([0.0, 0.0, -5.0], dtype=torch.float64))[None],        # straight down, too far
    ])
    q = kin.inverse(targets)
    assert torch.isfinite(q).all()
    lo, hi = torch.tensor(robot.joint_ranges, dtype=torch.float64).T
    assert (q >= lo - 1e-12).all() and (q <= hi + 1e-12).all()
    # far straight down: the leg stretches towards it (nearly straight knee, clamped to its limit)
    straight = q[-1].view(4, 3)
    assert torch.allclose(straight[:, 2], torch.tensor(robot.joint_ranges[2][1], dtype=torch.float64))
    # a target beyond reach: the leg stretches towards it, ending nearer than the standing foot
    down = hips + torch.tensor([0.05, 0.0, -0.6], dtype=torch.float64)
    reached = kin.forward(kin.inverse(down))
    standing = kin.forward(torch.tensor(robot.default_joint_pos, dtype=torch.float64))
    assert (reached[:, 2] - hips[:, 2] < -0.3).all()
    assert ((reached - down).norm(dim=-1) < (standing - down).norm(dim=-1)).all()


@pytest.mark.parametrize("name", ROBOTS)
def test_jacobian_matches_mujoco_site_jacobians(name):
    robot = get_robot(name)
    m = robot.load_model()
    d = mujoco.MjData(m)
    qs = _random_q(robot, 16, seed=4)
    feet, jac = LegKinematics(robot, dtype=torch.float64).forward_and_jacobian(torch.tensor(qs))
    assert feet.shape == (16, 4, 3) and jac.shape == (16, 4, 3, 3)
    jacp = np.zeros((3, m.nv))
    for q, foot, blocks in zip(qs, feet.numpy(), jac.numpy()):
        _posed(m, d, q)
        mujoco.mj_comPos(m, d)
        for leg, site in enumerate(robot.foot_sites):
            mujoco.mj_jacSite(m, d, jacp, None, m.site(site).id)
            np.testing.assert_allclose(foot[leg], d.site(site).xpos, atol=1e-9)
            np.testing.assert_allclose(blocks[leg], jacp[:, 6 + 3 * leg: 9 + 3 * leg], atol=1e-6)


def test_jacobian_pass_gives_the_bits_of_one_fk_per_perturbation():
    """One FK pass over q and its six perturbations: the same arithmetic per element as seven passes,
    so the gait expert's actions (and every number measured with it) are unchanged. -0.0 angles too."""
    kin = LegKinematics(get_robot("go1"))
    q = torch.tensor(_random_q(get_robot("go1"), 37, seed=5), dtype=torch.float32)
    q[0, :3] = -0.0
    feet, jac = kin.forward_and_jacobian(q)
    assert torch.equal(feet, kin.forward(q)) and torch.equal(torch.signbit(feet), torch.signbit(kin.forward(q)))
    eps = 1e-4
    cols = []
    for j in range(3):
        dq = torch.zeros_like(q).view(-1, 4, 3)
        dq[..., j] = eps
        dq = dq.view_as(q)
        cols.append((kin.forward(q + dq) - kin.forward(q - dq)) / (2 * eps))
    assert torch.equal(jac, torch.stack(cols, dim=-1))
