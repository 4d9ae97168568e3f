"""Robot models against their published figures, and standing under their own PD gains."""
from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest

from quadforge.layout import JOINT_NAMES, LEGS
from quadforge.envs.robots import ROBOTS, get_robot


def test_unknown_robot_names_allowed_values():
    with pytest.raises(ValueError, match="go1, aliengo"):
        get_robot("spot")


@pytest.mark.parametrize("name", ROBOTS)
def test_model_names_and_order(name):
    robot = get_robot(name)
    m = robot.load_model()
    assert m.nu == 12 and m.nq == 19
    assert tuple(m.joint(i + 1).name for i in range(12)) == JOINT_NAMES
    assert tuple(m.actuator(i).name for i in range(12)) == JOINT_NAMES
    # actuator i drives joint i in project order
    assert [m.jnt_qposadr[m.actuator_trnid[i, 0]] for i in range(12)] == list(range(7, 19))
    for b in (robot.base_body, *robot.hip_bodies, *robot.thigh_bodies, *robot.calf_bodies):
        assert mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, b) >= 0, b
    for s in (robot.imu_site, *robot.foot_sites):
        assert mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, s) >= 0, s
    assert m.opt.timestep == 0.005
    assert m.jnt_type[0] == mujoco.mjtJoint.mjJNT_FREE


@pytest.mark.parametrize("name", ROBOTS)
def test_mass_matches_published(name):
    robot = get_robot(name)
    m = robot.load_model()
    total = float(m.body_subtreemass[1])
    assert total == pytest.approx(robot.total_mass, abs=1e-6)
    masses = robot.published["link_masses_kg"][0]
    assert total == pytest.approx(masses["trunk"] + 4 * (masses["hip"] + masses["thigh"] + masses["calf"] + masses["foot"]), abs=1e-6)
    # the spec sheet rounds (and counts battery/electronics differently): within 10 %
    assert total == pytest.approx(robot.published["mass_spec_kg"][0], rel=0.10)


@pytest.mark.parametrize("name", ROBOTS)
def test_geometry_matches_published(name):
    """Segment lengths measured from the compiled model's body/site positions (tolerance 1e-6 m)."""
    robot = get_robot(name)
    m = robot.load_model()
    pub = robot.published
    for i, leg in enumerate(LEGS):
        hip = m.body(f"{leg}_hip").pos
        assert np.allclose(hip, robot.hip_offsets[i], atol=1e-6)
        assert abs(abs(hip[0]) - pub["hip_offset_m"][0][0]) < 1e-6
        assert abs(abs(hip[1]) - pub["hip_offset_m"][0][1]) < 1e-6
        thigh = m.body(f"{leg}_thigh").pos
        assert np.linalg.norm(thigh) == pytest.approx(pub["abduction_length_m"][0], abs=1e-6)
        assert np.sign(thigh[1]) == robot.leg_side[i]
        assert np.linalg.norm(m.body(f"{leg}_calf").pos) == pytest.approx(pub["thigh_length_m"][0], abs=1e-6)
        assert np.linalg.norm(m.site(f"{leg}_foot").pos) == pytest.approx(pub["calf_length_m"][0], abs=1e-6)
        foot_geom = m.geom(f"{leg}_foot")
        assert foot_geom.size[0] == pytest.approx(pub["foot_radius_m"][0], abs=1e-9)
        assert foot_geom.friction[0] == pytest.approx(1.0) and foot_geom.condim[0] == 3


@pytest.mark.parametrize("name", ROBOTS)
def test_joint_ranges_and_actuators_match_published(name):
    robot = get_robot(name)
    m = robot.load_model()
    pub = robot.published
    expected = [pub["hip_range_rad"][0], pub["thigh_range_rad"][0], pub["calf_range_rad"][0]] * 4
    torques = list(pub["torque_limits_Nm"][0]) * 4
    for j in range(12):
        assert np.allclose(m.jnt_range[j + 1], expected[j], atol=1e-9), JOINT_NAMES[j]
        assert np.allclose(robot.joint_ranges[j], expected[j])
        assert m.actuator_forcelimited[j] and np.allclose(m.actuator_forcerange[j], (-torques[j], torques[j]))
        assert robot.torque_limits[j] == torques[j]
        # MuJoCo position actuator: force = kp * (ctrl - q) - kv * qdot
        assert m.actuator_gainprm[j, 0] == pytest.approx(robot.kp)
        assert m.actuator_biasprm[j, 1] == pytest.approx(-robot.kp)
        assert m.actuator_biasprm[j, 2] == pytest.approx(-robot.kd)
        lo, hi = robot.joint_ranges[j]
        assert lo < robot.default_joint_pos[j] < hi
        assert 0 < m.dof_armature[6 + j] < 0.1  # reflected rotor inertia, small


def _drop_and_hold(name: str, seconds: float = 2.0):
    robot = get_robot(name)
    spec = robot.spec()
    floor = spec.worldbody.add_geom()
    floor.type = mujoco.mjtGeom.mjGEOM_PLANE
    floor.size = [0, 0, 0.05]
    m = spec.compile()
    d = mujoco.MjData(m)
    q0 = np.asarray(robot.default_joint_pos)
    d.qpos[2] = robot.nominal_base_height + 0.05  # dropped from 5 cm above touching
    d.qpos[7:] = q0
    for _ in range(int(round(seconds / m.opt.timestep)) // 4):
        d.ctrl[:] = q0   # decimation 4: targets held over 4 substeps
        for _ in range(4):
            mujoco.mj_step(m, d)
    return robot, m, d


@pytest.mark.parametrize("name", ROBOTS)
def test_stands_under_default_pd(name):
    robot, m, d = _drop_and_hold(name)
    assert np.isfinite(d.qpos).all() and np.isfinite(d.qvel).all()
    height = d.qpos[2]
    # PD sag: with the published gains the joints give ~0.25 rad under the robot's weight, so it settles
    # up to 6 cm below the kinematic height of the default pose, never above it
    assert robot.nominal_base_height - 0.06 < height < robot.nominal_base_height + 0.005, height
    base_rot = d.xmat[m.body("base").id].reshape(3, 3)
    projected_gravity_z = -base_rot[2, 2]  # world -z expressed in the base frame, z component
    assert projected_gravity_z < -0.95
    assert np.abs(d.qvel).max() < 0.05  # settled, not sliding
    # every foot on the ground, nothing else touching it
    floor_contacts = {m.geom(d.contact[i].geom[1]).name or m.geom(d.contact[i].geom[0]).name for i in range(d.ncon)}
    assert floor_contacts == set(robot.foot_geoms)


@pytest.mark.parametrize("name", ROBOTS)
def test_nominal_height_is_default_pose_kinematic_height(name):
    robot = get_robot(name)
    m = robot.load_model()
    d = mujoco.MjData(m)
    d.qpos[2] = 1.0
    d.qpos[3] = 1.0
    d.qpos[7:] = robot.default_joint_pos
    mujoco.mj_kinematics(m, d)
    foot_z = np.array([d.site(s).xpos[2] for s in robot.foot_sites])
    assert 1.0 - foot_z.mean() + robot.foot_radius == pytest.approx(robot.nominal_base_height, abs=1e-4)
    assert math.isfinite(robot.nominal_base_height)
