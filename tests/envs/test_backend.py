"""The mujoco_cpu physics backend: readout, standing, determinism, non-finite recovery, resets, DR."""
from __future__ import annotations

import dataclasses

import mujoco
import numpy as np
import pytest
import torch

from quadforge.envs.backends import make_backend
from quadforge.envs.backends.base import BackendConfig, PhysicsBackend, RandomizationConfig, RobotState
from quadforge.envs.backends.mujoco_cpu import MujocoCpuBackend
from quadforge.envs.scene import TRACKED

torch.set_num_threads(1)


def _backend(**kw) -> MujocoCpuBackend:
    kw.setdefault("num_threads", 1)
    return MujocoCpuBackend(BackendConfig(**kw))


def _default_targets(b: MujocoCpuBackend) -> torch.Tensor:
    return torch.tensor(b.robot.default_joint_pos, dtype=torch.float32).repeat(b.num_envs, 1)


def _wobble_targets(b: MujocoCpuBackend, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """A seeded sequence of targets around the standing pose: legs move, contacts change."""
    g = torch.Generator().manual_seed(seed)
    base = _default_targets(b)
    return [base + 0.3 * torch.randn(base.shape, generator=g) for _ in range(steps)]


def _snapshot(st: RobotState) -> dict[str, torch.Tensor]:
    return {f.name: getattr(st, f.name).clone() for f in dataclasses.fields(st) if f.name != "body_names"}


def _assert_rows_equal(a: dict, b: dict, rows) -> None:
    for name in a:
        assert torch.equal(a[name][rows], b[name][rows]), name


def test_state_shapes_dtypes_and_protocol():
    b = _backend(num_envs=3)
    assert isinstance(b, PhysicsBackend)
    st = b.state
    n = 3
    shapes = {"root_pos_w": (n, 3), "root_quat_w": (n, 4), "root_lin_vel_w": (n, 3), "root_ang_vel_w": (n, 3),
              "root_lin_vel_b": (n, 3), "root_ang_vel_b": (n, 3), "projected_gravity_b": (n, 3),
              "joint_pos": (n, 12), "joint_vel": (n, 12), "joint_torque": (n, 12), "foot_pos_w": (n, 4, 3),
              "foot_contact": (n, 4), "contact_forces": (n, len(TRACKED), 3)}
    for name, shape in shapes.items():
        t = getattr(st, name)
        assert tuple(t.shape) == shape, name
        assert t.dtype == (torch.bool if name == "foot_contact" else torch.float32), name
    assert st.body_names == TRACKED and len(TRACKED) == 13
    bad = b.step(_default_targets(b))
    assert bad.dtype == torch.bool and tuple(bad.shape) == (n,) and not bad.any()
    assert b.state is st  # refreshed in place
    # at reset the joints sit at the given pose, in project joint order
    np.testing.assert_allclose(b.env_params["friction"].numpy(), 1.0)
    b.close()


def test_standing_robot_stays_upright_and_feet_carry_its_weight():
    b = _backend(num_envs=2)
    tgt = _default_targets(b)
    for _ in range(150):  # 3 s
        assert not b.step(tgt).any()
    st = b.state
    assert (st.projected_gravity_b[:, 2] < -0.99).all()
    assert ((st.root_pos_w[:, 2] - b.robot.nominal_base_height).abs() < 0.05).all()
    assert st.foot_contact.all()
    assert st.root_lin_vel_b.abs().max() < 0.05 and st.joint_vel.abs().max() < 0.1
    # feet carry the weight; the base and legs touch nothing
    weight = b.robot.total_mass * 9.81
    foot_z = st.contact_forces[:, TRACKED.index("FR_foot"):, 2].sum(dim=1)
    torch.testing.assert_close(foot_z, torch.full_like(foot_z, weight), rtol=0.03, atol=0.0)
    assert st.contact_forces[:, :TRACKED.index("FR_foot")].abs().max() < 1e-6
    # feet are where the sites say, on the ground
    assert (st.foot_pos_w[..., 2] - b.robot.foot_radius).abs().max() < 0.01
    # contact forces agree with MuJoCo's cfrc_ext (world-frame external force on each body), computed
    # here at the current state; standing still, the last substep's forces match to a small tolerance
    m, d = b.models[0], mujoco.MjData(b.models[0])
    d.qpos[:], d.qvel[:], d.ctrl[:] = b.datas[0].qpos, b.datas[0].qvel, b.datas[0].ctrl
    d.qacc_warmstart[:] = b.datas[0].qacc_warmstart
    mujoco.mj_forward(m, d)
    mujoco.mj_rnePostConstraint(m, d)
    base_id = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, "base")
    calf_id = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, "FR_calf")
    np.testing.assert_allclose(st.contact_forces[0, 0].numpy(), d.cfrc_ext[base_id, 3:], atol=1e-4)
    calf_total = st.contact_forces[0, TRACKED.index("FR_calf")] + st.contact_forces[0, TRACKED.index("FR_foot")]
    np.testing.assert_allclose(calf_total.numpy(), d.cfrc_ext[calf_id, 3:], atol=0.05)
    assert np.abs(d.cfrc_ext[calf_id, 3:]).max() > 5.0  # the comparison is not vacuous
    b.close()


def test_split_step_matches_plain_mj_step():
    """step2 + mj_step(decimation-1) + step1 is the same arithmetic as decimation mj_steps."""
    b = _backend(num_envs=1, decimation=4)
    m, d = b.models[0], mujoco.MjData(b.models[0])
    mujoco.mj_resetData(m, d)
    d.qpos[:] = b.datas[0].qpos
    d.ctrl[:] = b.datas[0].ctrl
    mujoco.mj_forward(m, d)
    for tgt in _wobble_targets(b, 20):
        b.step(tgt)
        d.ctrl[:] = tgt[0].double().numpy()
        mujoco.mj_step(m, d, 4)
    np.testing.assert_array_equal(b.datas[0].qpos, d.qpos)
    np.testing.assert_array_equal(b.datas[0].qvel, d.qvel)
    # the readout is current: the state after the step, not one substep behind
    np.testing.assert_allclose(b.state.root_pos_w[0].numpy(), d.qpos[:3], atol=1e-6)
    b.close()


def test_same_state_bit_for_bit_with_1_and_2_threads():
    rcfg = RandomizationConfig(num_variants=3)
    runs = []
    for threads in (1, 2):
        b = _backend(num_envs=5, num_threads=threads, randomization=rcfg, seed=3)
        for tgt in _wobble_targets(b, 25):
            b.step(tgt)
        runs.append(_snapshot(b.state))
        b.close()
    _assert_rows_equal(runs[0], runs[1], slice(None))


@pytest.mark.parametrize("threads", [1, 2])
def test_during_runs_once_and_sees_the_state_before_the_step(threads):
    b = _backend(num_envs=6, num_threads=threads)
    ref = _backend(num_envs=6, num_threads=threads)
    seen = []
    for tgt in _wobble_targets(b, 3):
        before = _snapshot(b.state)
        b.step(tgt, during=lambda: seen.append(_snapshot(b.state)))
        ref.step(tgt)
        _assert_rows_equal(seen[-1], before, slice(None))       # not yet refreshed while it runs
        _assert_rows_equal(_snapshot(b.state), _snapshot(ref.state), slice(None))  # physics unchanged
    assert len(seen) == 3
    b.close()
    ref.close()


@pytest.mark.parametrize("poison", [float("nan"), 1e12])
def test_non_finite_env_is_restored_and_others_untouched(poison, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo logs its instability warnings to ./MUJOCO_LOG.TXT
    steps = _wobble_targets(_backend(num_envs=4), 12)
    ref = _backend(num_envs=4, num_threads=2)
    b = _backend(num_envs=4, num_threads=2)
    for k, tgt in enumerate(steps):
        if k == 6:
            b.datas[2].qvel[7] = poison  # one joint of env 2 explodes
        bad_ref, bad = ref.step(tgt), b.step(tgt)
        assert not bad_ref.any()
        if k == 6:
            assert bad.tolist() == [False, False, True, False]
            # env 2 is back in its last reset state (the standing pose at the origin)
            np.testing.assert_allclose(b.state.joint_pos[2].numpy(), b.robot.default_joint_pos, atol=1e-6)
            np.testing.assert_allclose(b.state.root_pos_w[2, :2].numpy(), 0.0, atol=1e-7)
        else:
            assert not bad.any()
    assert b.num_non_finite == 1 and ref.num_non_finite == 0
    snap_ref, snap = _snapshot(ref.state), _snapshot(b.state)
    for name, t in snap.items():
        if t.is_floating_point():
            assert torch.isfinite(t).all(), name
    _assert_rows_equal(snap_ref, snap, [0, 1, 3])
    ref.close()
    b.close()


def test_reset_of_a_subset_leaves_the_others_untouched():
    a, b = _backend(num_envs=4), _backend(num_envs=4)
    seq = _wobble_targets(a, 20)
    for k, tgt in enumerate(seq):
        if k == 10:
            ids = torch.tensor([1, 3])
            pos = torch.tensor([[1.0, 2.0, 0.4], [-1.0, 0.5, 0.35]])
            quat = torch.tensor([[0.9238795, 0.0, 0.0, 0.3826834], [0.9950042, 0.0998334, 0.0, 0.0]])  # yaw 45°, roll 0.2
            lin = torch.tensor([[0.5, 0.0, 0.0], [0.0, -0.2, 0.0]])
            ang = torch.tensor([[0.0, 0.0, 0.3], [0.0, 0.0, 0.0]])
            q = torch.tensor(b.robot.default_joint_pos).repeat(2, 1) + 0.1
            qd = torch.zeros(2, 12)
            b.reset(ids, pos, quat, lin, ang, q, qd)
            st = b.state
            torch.testing.assert_close(st.root_pos_w[ids], pos)
            torch.testing.assert_close(st.root_quat_w[ids], quat)
            torch.testing.assert_close(st.root_lin_vel_w[ids], lin)
            torch.testing.assert_close(st.root_ang_vel_w[ids], ang)
            torch.testing.assert_close(st.joint_pos[ids], q)
            # the yawed env sees its forward velocity rotated into the body frame
            torch.testing.assert_close(st.root_lin_vel_b[1], torch.tensor([0.5 * 0.7071068, -0.5 * 0.7071068, 0.0]),
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(st.root_ang_vel_b[1], torch.tensor([0.0, 0.0, 0.3]), atol=1e-6, rtol=0)
            torch.testing.assert_close(st.projected_gravity_b[3], torch.tensor([0.0, -0.1986693, -0.9800666]),
                                       atol=1e-6, rtol=0)
        a.step(tgt)
        b.step(tgt)
    _assert_rows_equal(_snapshot(a.state), _snapshot(b.state), [0, 2])
    a.close()
    b.close()


def test_push_adds_base_velocity():
    b = _backend(num_envs=3)
    b.step(_default_targets(b))
    before = b.state.root_lin_vel_w.clone()
    b.push(torch.tensor([0, 2]), torch.tensor([[0.5, -0.25, 0.0], [0.0, 1.0, 0.0]]))
    after = b.state.root_lin_vel_w
    torch.testing.assert_close(after[[0, 2]] - before[[0, 2]], torch.tensor([[0.5, -0.25, 0.0], [0.0, 1.0, 0.0]]),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(after[1], before[1])
    b.close()


def test_randomization_ranges_respected_seeded_and_applied():
    rcfg = RandomizationConfig(friction_range=(0.5, 1.25), added_mass_range=(-1.0, 1.0),
                               motor_strength_range=(0.9, 1.1), num_variants=4)
    b = _backend(num_envs=12, randomization=rcfg, seed=7)
    p = b.env_params
    assert set(p) == {"friction", "added_mass", "motor_strength"}
    for name, (lo, hi) in {"friction": rcfg.friction_range, "added_mass": rcfg.added_mass_range,
                           "motor_strength": rcfg.motor_strength_range}.items():
        assert tuple(p[name].shape) == (12,)
        assert ((p[name] >= lo) & (p[name] <= hi)).all(), name
        assert len(torch.unique(p[name])) == 4, name  # every variant of the pool is used
    nominal = _backend(num_envs=1)
    m0 = nominal.models[0]
    base = mujoco.mj_name2id(m0, mujoco.mjtObj.mjOBJ_BODY, "base")
    for i, m in enumerate(b.models):
        np.testing.assert_allclose(m.geom_friction[:, 0], p["friction"][i].item(), rtol=1e-6)
        assert m.body_mass[base] == pytest.approx(m0.body_mass[base] + p["added_mass"][i].item(), abs=1e-5)
        s = p["motor_strength"][i].item()
        np.testing.assert_allclose(m.actuator_gainprm[:, 0], m0.actuator_gainprm[:, 0] * s, rtol=1e-6)
        np.testing.assert_allclose(m.actuator_forcerange, m0.actuator_forcerange * s, rtol=1e-6)
        assert m.body_subtreemass[0] == pytest.approx(m0.body_subtreemass[0] + p["added_mass"][i].item(), abs=1e-5)
    same = _backend(num_envs=12, randomization=rcfg, seed=7).env_params
    other = _backend(num_envs=12, randomization=rcfg, seed=8).env_params
    for name in p:
        assert torch.equal(p[name], same[name])
        assert not torch.equal(p[name], other[name])
    # no randomization: nominal physics everywhere
    assert torch.equal(nominal.env_params["added_mass"], torch.zeros(1))
    assert torch.equal(nominal.env_params["motor_strength"], torch.ones(1))


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="allowed backends: mujoco_cpu"):
        make_backend("bullet", BackendConfig())
    with pytest.raises(NotImplementedError, match="planned"):
        make_backend("isaacgym", BackendConfig())
    with pytest.raises(ValueError, match="allowed robots"):
        _backend(robot="spot")
    with pytest.raises(ValueError, match="num_envs"):
        _backend(num_envs=0)
    with pytest.raises(ValueError, match="friction_range"):
        _backend(randomization=RandomizationConfig(friction_range=(1.0, 0.5)))
    b = _backend(num_envs=2)
    with pytest.raises(ValueError, match=r"joint_targets must have shape \(2, 12\)"):
        b.step(torch.zeros(3, 12))
    with pytest.raises(ValueError, match="env_ids"):
        b.push(torch.tensor([5]), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="root_quat_w"):
        b.reset(torch.tensor([0]), torch.zeros(1, 3), torch.zeros(1, 4), torch.zeros(1, 3), torch.zeros(1, 3),
                torch.zeros(1, 12), torch.zeros(1, 12))
    b.close()


def test_plane_terrain_height_is_zero():
    b = _backend(num_envs=1)
    h = b.terrain_height(torch.rand(5, 7, 2))
    assert tuple(h.shape) == (5, 7) and torch.equal(h, torch.zeros(5, 7))
    b.close()


def test_aliengo_builds_and_stands():
    b = _backend(robot="aliengo", num_envs=1)
    tgt = _default_targets(b)
    for _ in range(50):
        b.step(tgt)
    assert b.state.projected_gravity_b[0, 2] < -0.99 and b.state.foot_contact.all()
    b.close()


def test_robot_stands_on_the_heightfield_where_the_terrain_says():
    from quadforge.envs.terrain import TerrainConfig

    tcfg = TerrainConfig.of_types(["stairs_up", "rough_slope"], num_levels=2, num_cols=2, tile_size=4.0, border=1.0)
    b = _backend(num_envs=2, terrain=tcfg)
    terrain = b.scene.terrain
    assert terrain is not None and b.models[0].nhfield == 1
    pos = torch.stack([terrain.origins[1, 0], terrain.origins[1, 1]]).clone()
    pos[:, 2] += b.robot.nominal_base_height + 0.02
    b.reset(torch.arange(2), pos, torch.tensor([[1.0, 0, 0, 0]]).repeat(2, 1), torch.zeros(2, 3),
            torch.zeros(2, 3), _default_targets(b), torch.zeros(2, 12))
    for _ in range(50):
        assert not b.step(_default_targets(b)).any()
    st = b.state
    assert st.foot_contact.all()
    # the feet rest on MuJoCo's heightfield exactly where Terrain.height_at puts the ground
    ground = b.terrain_height(st.foot_pos_w[..., :2])
    torch.testing.assert_close(ground, terrain.height_at(st.foot_pos_w[..., :2]))
    assert ((st.foot_pos_w[..., 2] - ground) - b.robot.foot_radius).abs().max() < 0.01
    # a flat-plane terrain config needs no heightfield
    flat = _backend(num_envs=1, terrain=TerrainConfig.flat())
    assert flat.models[0].nhfield == 0 and flat.scene.terrain is None
    b.close()
    flat.close()


def test_sim_benchmark_measures_raw_and_backend():
    from quadforge.tools.bench.sim import _measure

    r = _measure("flat", 4, 2, steps=2, rounds=1, with_env=False)
    assert set(r["rate"]) == {"raw", "backend", "backend, all sensors"} and all(v > 0 for v in r["rate"].values())
    assert r["ratio"]["raw"] == 1.0 and r["ratio"]["backend"] > 0 and r["ratio_cpu"]["backend"] > 0


@pytest.mark.parametrize("decimation", [1, 2, 4])
def test_substeps_without_sensors_change_no_state_and_no_readout(decimation):
    """Only the last full substep's acceleration-stage sensors and step1's pose/velocity sensors are
    read, so the other substeps skip MuJoCo's sensors: every state field must stay bit for bit what a
    backend computing them in every substep gives (rough ground, randomised physics, moving joints)."""
    from quadforge.envs.backends.base import RandomizationConfig
    from quadforge.envs.terrain import TerrainConfig
    cfg = BackendConfig(num_envs=3, seed=3, decimation=decimation, terrain=TerrainConfig.mixed(),
                        randomization=RandomizationConfig(), num_threads=2)
    quiet, every = MujocoCpuBackend(cfg), MujocoCpuBackend(cfg)
    every.sensors_every_substep = True
    assert quiet._quiet_models[0].opt.disableflags & mujoco.mjtDisableBit.mjDSBL_SENSOR
    assert not quiet.models[0].opt.disableflags & mujoco.mjtDisableBit.mjDSBL_SENSOR
    g = torch.Generator().manual_seed(0)
    base = torch.tensor(quiet.robot.default_joint_pos, dtype=torch.float32).repeat(3, 1)
    for _ in range(25):
        targets = base + 0.3 * torch.randn(base.shape, generator=g)
        quiet.step(targets)
        every.step(targets)
        for name in ("root_pos_w", "root_lin_vel_b", "joint_pos", "joint_vel", "joint_torque", "contact_forces",
                     "foot_pos_w", "foot_contact"):
            assert torch.equal(getattr(quiet.state, name), getattr(every.state, name)), name
    assert float(quiet.state.contact_forces.abs().max()) > 1.0     # the compared readout held real forces
    quiet.close()
    every.close()


class ToyBackend(MujocoCpuBackend):
    """A backend registered by a test: the CPU physics under another name, without task-scene capabilities."""

    built = 0

    def __init__(self, cfg):
        ToyBackend.built += 1
        super().__init__(cfg)


def test_a_new_backend_is_one_registration(monkeypatch):
    import argparse

    from quadforge.envs import backends
    from quadforge.envs.builder import make_env
    from quadforge.envs.quard.env import QuardConfig, QuardEnv
    monkeypatch.setattr(backends, "BACKENDS", dict(backends.BACKENDS))
    backends.register_backend(backends.BackendSpec("toy", f"{__name__}:ToyBackend", "a test backend"))
    with pytest.raises(ValueError, match="already registered"):
        backends.register_backend(backends.BackendSpec("toy", f"{__name__}:ToyBackend", "again"))
    with pytest.raises(ValueError, match="unknown capabilities \\['teleport'\\]"):
        backends.register_backend(backends.BackendSpec("toy2", "x:Y", "?", frozenset({"teleport"})))
    parser = argparse.ArgumentParser()
    backends.add_backend_arguments(parser)
    assert backends.backend_from_args(parser.parse_args(["--backend", "toy"]))[0] == "toy"
    ToyBackend.built = 0
    env = make_env(num_envs=2, backend="toy")                     # selectable by name, through the one builder
    assert isinstance(env.backend, ToyBackend) and ToyBackend.built == 1
    env.reset()
    env.step(torch.zeros(2, 12))
    env.close()
    # a task that needs capabilities asks for them, and names what is missing before anything is built
    with pytest.raises(NotImplementedError, match="backend 'toy' lacks scene_addon, set_mocap, sensor_columns "
                                                  "\\(backends that have them: mujoco_cpu, mujoco_warp\\)"):
        QuardEnv(QuardConfig.make("quard:go_to", num_envs=1, images=False, backend="toy"))
    assert ToyBackend.built == 1
