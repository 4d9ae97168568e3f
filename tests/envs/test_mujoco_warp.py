"""The mujoco_warp backend: equivalence with mujoco_cpu on Warp's CPU device, masked resets, pushes,
divergence and buffer-overflow handling, the gait expert and the rsl_rl runner on it.

Everything that builds a Warp backend is slow-marked (a first build compiles MuJoCo Warp's kernels,
~1-2 min here; later builds load them from Warp's kernel cache in ~10 s, and a step of a few worlds
costs ~0.1 s on the CPU device) and skips when mujoco-warp is not installed (it is the optional extra
``quadforge[gpu]``, not part of ``[test]``). The fast tests check what needs no Warp.
"""
from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
import torch

from quadforge.envs.backends import add_backend_arguments, backend_from_args, make_backend
from quadforge.envs.backends.base import BackendConfig, RandomizationConfig, RobotState, WarpConfig
from quadforge.envs.backends.mujoco_cpu import rotation_matrices
from quadforge.envs.backends.mujoco_warp import _rotate_inverse, available

torch.set_num_threads(1)
needs_warp = pytest.mark.skipif(not available(), reason="mujoco-warp not installed (pip install 'quadforge[gpu]')")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# The Warp devices the behaviour checks run on: Warp's CPU device (slow lane) and a GPU (`pytest -m gpu`)
WARP_DEVICES = [pytest.param("cpu", id="warp-cpu"),
                pytest.param("cuda:0", id="warp-cuda", marks=[pytest.mark.gpu, needs_cuda])]

# Stated tolerances (max abs difference over envs and components, SI units) between mujoco_warp
# (float32) and mujoco_cpu (float64) from the same state and targets, 6 envs with randomised physics.
# "standing": targets hold the default pose, the robots settle on their feet (checked after 1, 10 and
# 100 steps, flat and rough); "moving": every joint follows a 0.3 rad 2 Hz sine, feet slide and lift
# (checked after 1 and 10 steps on flat ground, after 1 step on the heightfield). Measured maxima (Warp
# 1.19 CPU device, 2026-11-24) are about 5-20x below these: standing rough after 100 steps 1.6e-4 m
# (feet), 0.03 N (contact forces); moving flat after 10 steps 1e-6 m, 3e-5 rad/s, 2.5e-3 N.
TOLERANCES = {"root_pos_w": 1e-3, "root_quat_w": 1e-3, "root_lin_vel_w": 1e-3, "root_ang_vel_b": 1e-3,
              "projected_gravity_b": 1e-3, "joint_pos": 1e-3, "joint_vel": 1e-2, "joint_torque": 2e-2,
              "foot_pos_w": 1e-3, "contact_forces": 0.2}
# Moving feet on the heightfield after 10 steps: MuJoCo Warp builds its own contact set per heightfield
# prism, so a foot landing across prism edges gets a slightly different set of contact points than in
# MuJoCo C; impacts then differ by hundreds of N for one substep and the joints by ~2 rad/s. The base
# still agrees to these (measured 1.1e-3 m, 2.9e-3, 0.029 m/s, 6.4e-3, joints 0.06 rad); beyond a few
# dozen steps any two float32/float64 contact-rich trajectories part (the gait test compares behaviour).
ROUGH_MOVING_10 = {"root_pos_w": 5e-3, "root_quat_w": 1e-2, "root_lin_vel_w": 0.1, "projected_gravity_b": 2e-2,
                   "joint_pos": 0.2}


# --- fast: no Warp needed ------------------------------------------------------------------------------
def test_missing_mujoco_warp_is_a_one_line_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "mujoco_warp", None)   # import mujoco_warp -> ImportError
    with pytest.raises(ImportError, match=r"quadforge\[gpu\]"):
        make_backend("mujoco_warp", BackendConfig(num_envs=1))
    from quadforge.tools.cli import main
    for argv in (["rollout", "--backend", "mujoco_warp", "--num-envs", "1", "--seconds", "0.1"],
                 ["bench", "quard_gpu", "--quick"]):      # the GPU benchmark says the same, not a traceback
        code = main(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "mujoco-warp" in err and "quadforge[gpu]" in err, err


def test_warp_options_are_checked_before_anything_is_built():
    for bad, match in [(WarpConfig(on_overflow="ignore"), "on_overflow"), (WarpConfig(nconmax=0), "nconmax"),
                       (WarpConfig(njmax=-5), "njmax"), (WarpConfig(solver_iterations=0), "solver_iterations"),
                       (WarpConfig(ls_iterations=2.5), "ls_iterations"),
                       (WarpConfig(reset_recompute="fwd"), "reset_recompute")]:
        with pytest.raises(ValueError, match=match):
            make_backend("mujoco_warp", BackendConfig(num_envs=1, warp=bad))


@pytest.mark.slow
@needs_warp
def test_solver_budget_reaches_the_device_model_and_bounds_the_iterations():
    """WarpConfig's solver budget (mjlab's 10 / 20, here 2 / 4) is the device model's, and no world's
    substep takes more Newton iterations than it allows."""
    b = make_backend("mujoco_warp", BackendConfig(num_envs=2, seed=0, warp=WarpConfig(
        device="cpu", solver_iterations=2, ls_iterations=4)))
    assert (b.m.opt.iterations, b.m.opt.ls_iterations) == (2, 4)
    for _ in range(3):
        b.step(b.state.joint_pos.clone())
    used = b.solver_iterations_used()
    assert used.shape == (2,) and 1 <= int(used.min()) and int(used.max()) <= 2
    b.close()


def test_backend_arguments_parse_into_name_and_warp_config():
    import argparse
    p = argparse.ArgumentParser()
    add_backend_arguments(p)
    name, warp = backend_from_args(p.parse_args(["--backend", "mujoco_warp", "--warp-nconmax", "300",
                                                 "--warp-device", "cpu"]))
    assert name == "mujoco_warp" and warp == WarpConfig(device="cpu", nconmax=300)
    _, capped = backend_from_args(p.parse_args(["--backend", "mujoco_warp", "--warp-solver-iterations", "10",
                                                "--warp-ls-iterations", "20"]))
    assert (capped.solver_iterations, capped.ls_iterations) == (10, 20)
    assert backend_from_args(p.parse_args([]))[0] == "mujoco_cpu"
    with pytest.raises(ValueError, match="--warp-ls-iterations, --warp-solver-iterations: option"):
        backend_from_args(p.parse_args(["--warp-solver-iterations", "10", "--warp-ls-iterations", "20"]))
    with pytest.raises(SystemExit):
        p.parse_args(["--backend", "bullet"])


def test_rotate_inverse_is_the_transposed_rotation():
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(16, 4, generator=g, dtype=torch.float64), dim=1)
    v = torch.randn(16, 3, generator=g, dtype=torch.float64)
    expected = np.einsum("nji,nj->ni", rotation_matrices(q.numpy()), v.numpy())
    np.testing.assert_allclose(_rotate_inverse(q, v).numpy(), expected, atol=1e-12)


def test_buffers_are_measured_from_the_scene_and_hold_a_wobbling_rollout():
    """nconmax/njmax come from a settled MuJoCo C rollout of the same scene (standing and sprawled
    robots) times the safety margin; robots kicked around by random targets on the heightfield, at spawn
    points the probes did not use, stay inside them."""
    import mujoco

    from quadforge.envs.backends.mujoco_warp import BUFFER_SAFETY, MIN_BUFFERS, buffers_for, measure_contact_load
    from quadforge.envs.robots import get_robot
    from quadforge.envs.scene import build_scene
    from quadforge.envs.terrain import TerrainConfig, generate
    robot = get_robot("go1")
    flat, rough = build_scene(robot), build_scene(robot, generate(TerrainConfig.mixed()))
    lf, lr = measure_contact_load(flat, 4), measure_contact_load(rough, 4)
    assert 4 <= lf.ncon <= lr.ncon and 0 < lf.nefc <= lr.nefc and lr.probes > lf.probes
    con, rows = buffers_for(lr)
    assert (con, rows) == (max(MIN_BUFFERS[0], int(np.ceil(BUFFER_SAFETY[0] * lr.ncon))),
                           max(MIN_BUFFERS[1], int(np.ceil(BUFFER_SAFETY[1] * lr.nefc))))
    assert BUFFER_SAFETY[1] >= BUFFER_SAFETY[0] >= 2     # rows are a hard per-world limit: the wider margin
    with pytest.raises(ValueError, match="safety factors"):
        buffers_for(lr, safety=(2.0, 0.5))
    m, d = rough.model, mujoco.MjData(rough.model)
    origins = rough.terrain.origins.numpy()
    adr = [int(m.jnt_qposadr[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, j)]) for j in robot.joint_names]
    rng = np.random.default_rng(0)
    most = (0, 0)
    for k in range(4):
        mujoco.mj_resetData(m, d)
        d.qpos[0:3] = origins[-1 - k, (3 * k + 1) % origins.shape[1]] + [0.0, 0.0, robot.nominal_base_height + 0.05]
        d.qpos[adr] = robot.default_joint_pos
        for t in range(60):
            d.ctrl[:] = np.asarray(robot.default_joint_pos) + rng.normal(0.0, 0.5, 12)
            for _ in range(4):
                mujoco.mj_step(m, d)
                most = (max(most[0], d.ncon), max(most[1], d.nefc))
    assert most[0] <= con and most[1] <= rows, (most, (con, rows))


class _FakeStream:
    """A stand-in for a torch/Warp CUDA stream: its handle and the streams it was told to wait for."""

    def __init__(self, handle):
        self.cuda_stream, self.waited = handle, []

    def wait_stream(self, other):
        self.waited.append(other)


def test_step_stream_is_never_a_default_stream():
    from quadforge.envs.backends.mujoco_warp import UNCAPTURABLE_STREAM_HANDLES, check_capturable, step_stream
    assert step_stream(torch.device("cpu")) is None           # Warp's CPU device: no stream at all
    own = _FakeStream(0x5EED)
    made = []
    got = step_stream(torch.device("cuda", 0), new_stream=lambda device: made.append(device) or own)
    assert got is own and made == [torch.device("cuda", 0)]   # a new stream, not the caller's current one
    for handle in UNCAPTURABLE_STREAM_HANDLES + (None,):
        with pytest.raises(RuntimeError, match="graph cannot be captured"):
            check_capturable(_FakeStream(handle))
        with pytest.raises(RuntimeError, match="graph cannot be captured"):
            step_stream(torch.device("cuda", 0), new_stream=lambda device: _FakeStream(handle))


def test_graph_capture_runs_on_the_backends_stream_not_torchs_default(monkeypatch):
    """The first CUDA step captures its graph while torch's current stream is the legacy default stream
    (a caller that chose none): the capture must run on the backend's own stream, ordered after the
    caller's on entry and before it on exit. Checked with stand-ins for torch.cuda and Warp, so it runs
    without a GPU (the real capture is the gpu-marked test below)."""
    import contextlib

    from quadforge.envs.backends import mujoco_warp as mw
    legacy = _FakeStream(0)
    torch_streams, warp_streams, captured_on = [legacy], [_FakeStream(0x77)], []

    @contextlib.contextmanager
    def push(stack, stream):
        stack.append(stream)
        yield
        stack.pop()

    class FakeWarp:
        ScopedDevice = staticmethod(lambda device: contextlib.nullcontext())
        ScopedStream = staticmethod(lambda stream, sync_enter=True: push(warp_streams, stream))
        get_stream = staticmethod(lambda device=None: warp_streams[-1])
        stream_from_torch = staticmethod(lambda stream: stream)
        capture_launch = staticmethod(lambda graph: captured_on.append(("replay", warp_streams[-1])))

        @staticmethod
        @contextlib.contextmanager
        def ScopedCapture(device=None):
            mw.check_capturable(warp_streams[-1])   # what CUDA refuses, as CUDA refuses it
            captured_on.append(("capture", warp_streams[-1]))
            yield type("Capture", (), {"graph": "graph"})()

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: torch_streams[-1])
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: push(torch_streams, stream))
    b = mw.MujocoWarpBackend.__new__(mw.MujocoWarpBackend)
    b._wp, b.wp_device, b.device = FakeWarp(), type("Dev", (), {"is_cuda": True})(), torch.device("cuda", 0)
    b._stream = mw.step_stream(b.device, new_stream=lambda device: _FakeStream(0x5EED))
    b._wp_stream = b._stream
    b._use_graph, b._graphs = True, {}
    physics_on = []
    b._run_physics = lambda: physics_on.append((torch_streams[-1], warp_streams[-1]))
    b._physics()
    b._physics()
    assert captured_on == [("capture", b._stream), ("replay", b._stream)]
    assert physics_on == [(b._stream, b._stream)] * 2          # the uncaptured first run and the capture
    assert b._stream.waited == [legacy, legacy] and legacy.waited == [b._stream, b._stream]
    assert torch_streams == [legacy]                           # the caller's stream is current again
    # resets take the same road, each under its own graph: captured at the first call, replayed after
    runs = []
    for key in ("reset", "forward", "reset", "forward"):
        b._graphed(key, lambda key=key: runs.append(key))
    assert runs == ["reset", "reset", "forward", "forward"]    # first calls: the uncaptured run + the capture
    assert captured_on[2:] == [("capture", b._stream)] * 2 + [("replay", b._stream)] * 2
    assert set(b._graphs) == {"step", "reset", "forward"}


def test_resets_run_reset_data_and_forward_through_their_graphs():
    """A reset's Warp work (reset_data, then forward) goes through ``_graphed``, so a GPU replays it as
    two CUDA graphs; the torch copies of the stored state run between the two, outside any capture."""
    from quadforge.envs.backends import mujoco_warp as mw
    b = mw.MujocoWarpBackend.__new__(mw.MujocoWarpBackend)
    calls = []
    b._mjw = type("FakeMjw", (), {"reset_data": staticmethod(lambda m, d, mask: calls.append("reset_data")),
                                  "forward": staticmethod(lambda m, d: calls.append("forward")),
                                  "step1": staticmethod(lambda m, d: calls.append("step1"))})()
    b.m = b.d = b._reset_mask_wp = None
    b._graphed = lambda key, run: (calls.append(f"graph:{key}"), run())
    n = 3
    b._reset_mask = torch.tensor([False, True, False])
    b._refresh = lambda: calls.append("refresh")
    for how in ("forward", "step1"):    # WarpConfig.reset_recompute picks the recompute, under its own graph
        calls.clear()
        b.reset_recompute = how
        b._qpos, b._qvel, b._ctrl, b._sens, b._dsens = (torch.zeros(n, 2) for _ in range(5))
        b._reset_qpos, b._reset_qvel, b._reset_ctrl = (torch.ones(n, 2) for _ in range(3))
        b._restore_masked()
        assert calls == ["graph:reset", "reset_data", f"graph:{how}", how, "refresh"]
        assert b._qpos[:, 0].tolist() == [0.0, 1.0, 0.0] and b._ctrl[:, 0].tolist() == [0.0, 1.0, 0.0]


@pytest.mark.gpu
@needs_warp
@needs_cuda
def test_cuda_graph_step_runs_from_torchs_default_stream():
    """The crash of every `--warp-device cuda` run (issue 23): the first step captured a graph on the
    legacy default stream. Stepping from torch's default stream must capture, replay and stay finite."""
    cfg = BackendConfig(num_envs=8, seed=0, warp=WarpConfig(device="cuda:0", cuda_graph=True))
    b = make_backend("mujoco_warp", cfg)
    assert torch.cuda.current_stream().cuda_stream == 0          # the caller chose no stream
    targets = b.state.joint_pos.clone()
    for _ in range(3):
        bad = b.step(targets)
    assert "step" in b._graphs and not bool(bad.any())
    assert torch.isfinite(b.state.root_pos_w).all() and float(b.state.root_pos_w[:, 2].min()) > 0.15
    assert b.reset_recompute == "step1" and "step1" in b._graphs   # the GPU's default, its reset graphed
    b.close()


@pytest.mark.gpu
@needs_warp
@needs_cuda
def test_cuda_graph_resets_equal_uncaptured_resets():
    """Resets replayed as CUDA graphs (reset_data, forward) leave every world where the same resets
    launched kernel by kernel leave it: worlds reset between steps, some twice."""
    out = {}
    for graph, how in ((True, "forward"), (False, "forward"), (True, "step1"), (False, "step1")):
        b = make_backend("mujoco_warp", BackendConfig(num_envs=8, seed=0, warp=WarpConfig(
            device="cuda:0", cuda_graph=graph, reset_recompute=how)))
        s = b.state
        start = [t.clone() for t in (s.root_pos_w, s.root_quat_w, s.root_lin_vel_w, s.root_ang_vel_w,
                                     s.joint_pos, s.joint_vel)]
        targets = s.joint_pos.clone()
        for k in range(6):
            b.step(targets)
            ids = torch.tensor([k % 8, (k + 3) % 8], device=b.device)
            pos = start[0][ids] + torch.tensor([0.0, 0.0, 0.02 * k], device=b.device)
            b.reset(ids, pos, *(t[ids] for t in start[1:]))
        b.step(targets)
        out[graph, how] = (b.state.root_pos_w.clone(), b.state.joint_pos.clone(), sorted(b._graphs))
        b.close()
    for how in ("forward", "step1"):
        assert out[True, how][2] == sorted([how, "reset", "step"]) and out[False, how][2] == []
        torch.testing.assert_close(out[True, how][0], out[False, how][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(out[True, how][1], out[False, how][1], atol=1e-5, rtol=0)
    # either recompute leaves the next step's physics the same
    torch.testing.assert_close(out[True, "step1"][0], out[True, "forward"][0], atol=1e-5, rtol=0)


# --- slow: Warp's CPU device -----------------------------------------------------------------------------
@needs_warp
@pytest.mark.slow
def test_step1_resets_read_poses_and_leave_the_next_steps_as_forward_resets_do():
    """WarpConfig.reset_recompute="step1": right after a reset (here: a standing world put back where it
    stands) the reset world reads the same pose and velocities as after a forward reset, zero contact
    forces and torques (its acceleration stage is not recomputed), and the steps after it are those of a
    forward reset."""
    states = {}
    for how in ("forward", "step1"):
        b = make_backend("mujoco_warp", BackendConfig(num_envs=3, seed=0, warp=WarpConfig(
            device="cpu", reset_recompute=how)))
        s = b.state
        targets = s.joint_pos.clone()
        for _ in range(25):          # standing on its feet: a forward reset reads their contact forces
            b.step(targets)
        ids = torch.tensor([1])
        now = [t[ids].clone() for t in (s.root_pos_w, s.root_quat_w, s.root_lin_vel_w, s.root_ang_vel_w,
                                         s.joint_pos, s.joint_vel)]
        b.reset(ids, *now)
        after_reset = {k: getattr(b.state, k).clone() for k in ("root_pos_w", "root_quat_w", "joint_pos",
                                                                 "joint_vel", "contact_forces", "joint_torque")}
        for _ in range(3):
            b.step(targets)
        states[how] = after_reset, b.state.root_pos_w.clone(), b.state.joint_pos.clone()
        b.close()
    (fwd, fwd_pos, fwd_q), (s1, s1_pos, s1_q) = states["forward"], states["step1"]
    for k in ("root_pos_w", "root_quat_w", "joint_pos", "joint_vel"):
        torch.testing.assert_close(s1[k], fwd[k], atol=1e-6, rtol=0)
    assert float(s1["contact_forces"][1].abs().max()) == 0.0 and float(s1["joint_torque"][1].abs().max()) == 0.0
    assert float(fwd["contact_forces"][1].abs().max()) > 1.0          # forward's readout has the feet's
    torch.testing.assert_close(s1["contact_forces"][[0, 2]], fwd["contact_forces"][[0, 2]])   # others keep theirs
    torch.testing.assert_close(s1_pos, fwd_pos, atol=1e-6, rtol=0)
    torch.testing.assert_close(s1_q, fwd_q, atol=1e-6, rtol=0)


def _pair(terrain=None, num_envs=6, device="cpu", **warp):
    cfg = BackendConfig(num_envs=num_envs, num_threads=1, seed=3, randomization=RandomizationConfig(),
                        terrain=terrain, warp=WarpConfig(device=device, **warp))
    return make_backend("mujoco_cpu", cfg), make_backend("mujoco_warp", cfg)


def _spawn(backend, num_envs: int, rough: bool):
    """Spawn states spread over the ground, standing pose, at rest. On the terrain: on the platforms of
    different tiles (level k, column k), where the env spawns its robots: heightfield contacts under
    every foot, without a landing on a slope or stair edge (whose slipping is a chaotic transient)."""
    from quadforge.envs.vec_env import spawn_footprint
    if rough:
        origins = backend.scene.terrain.origins
        rows, cols = origins.shape[:2]
        xy = torch.stack([origins[k % rows, k % cols, :2] for k in range(num_envs)])
    else:
        xy = torch.stack([torch.arange(num_envs) * 1.5, torch.zeros(num_envs)], -1)
    ground = backend.terrain_height(xy[:, None] + spawn_footprint(backend.robot, "cpu")).amax(-1)
    pos = torch.cat([xy, (ground + backend.robot.nominal_base_height + 0.02)[:, None]], -1)
    quat = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(num_envs, 1)
    q = torch.tensor(backend.robot.default_joint_pos, dtype=torch.float32).repeat(num_envs, 1)
    z3, z12 = torch.zeros(num_envs, 3), torch.zeros(num_envs, 12)
    return torch.arange(num_envs), pos, quat, z3, z3, q, z12


def _max_diff(a: RobotState, b: RobotState) -> dict[str, float]:
    return {name: float((getattr(a, name).cpu() - getattr(b, name).cpu()).abs().max()) for name in TOLERANCES}


def _check(a, b, what: str, tolerances: dict[str, float] = TOLERANCES) -> None:
    diff = _max_diff(a.state, b.state)
    over = {k: v for k, v in diff.items() if k in tolerances and v > tolerances[k]}
    assert not over, f"{what}: {over} (all: {diff})"
    if tolerances is TOLERANCES:
        assert torch.equal(a.state.foot_contact.cpu(), b.state.foot_contact.cpu()), f"{what}: foot contact"


@needs_warp
@pytest.mark.slow
@pytest.mark.parametrize("device", WARP_DEVICES)
@pytest.mark.parametrize("rough", [False, True], ids=["flat", "rough"])
def test_same_state_and_targets_give_the_same_trajectory(rough, device):
    from quadforge.envs.terrain import TerrainConfig
    n = 6
    cpu, warp = _pair(TerrainConfig.mixed() if rough else None, n, device)
    for name in ("friction", "added_mass", "motor_strength"):   # the same per-env physics
        torch.testing.assert_close(cpu.env_params[name], warp.env_params[name].cpu())
    assert warp.env_params["friction"].unique().numel() > 1
    spawn = _spawn(cpu, n, rough)
    default = torch.tensor(cpu.robot.default_joint_pos, dtype=torch.float32).repeat(n, 1)
    for mode, steps in (("standing", 100), ("moving", 10)):
        cpu.reset(*spawn)
        warp.reset(*spawn)
        _check(cpu, warp, f"{mode} after reset")
        for t in range(1, steps + 1):
            phase = 2 * torch.pi * 2.0 * t * cpu.sim_dt * cpu.decimation + 0.7 * torch.arange(12)
            targets = default if mode == "standing" else default + 0.3 * torch.sin(phase)
            bad_c, bad_w = cpu.step(targets), warp.step(targets.to(warp.device))
            assert not bad_c.any() and not bad_w.any()
            if t in (1, 10, 100):
                loose = rough and mode == "moving" and t == 10
                _check(cpu, warp, f"{mode} after {t} steps", ROUGH_MOVING_10 if loose else TOLERANCES)
    assert warp.num_overflow == 0
    cpu.close()
    warp.close()


def _snapshot(st: RobotState) -> dict[str, torch.Tensor]:
    return {f.name: getattr(st, f.name).clone() for f in dataclasses.fields(st) if f.name != "body_names"}


@needs_warp
@pytest.mark.slow
def test_masked_reset_push_and_divergence_touch_only_their_worlds():
    cfg = BackendConfig(num_envs=4, seed=1, warp=WarpConfig(device="cpu"))
    a, b = make_backend("mujoco_warp", cfg), make_backend("mujoco_warp", cfg)
    g = torch.Generator().manual_seed(0)
    base = torch.tensor(a.robot.default_joint_pos, dtype=torch.float32).repeat(4, 1)
    seq = [base + 0.2 * torch.randn(base.shape, generator=g) for _ in range(12)]
    for k, tgt in enumerate(seq):
        if k == 4:   # reset worlds 1 and 3 of b to given states
            ids = torch.tensor([1, 3])
            pos = torch.tensor([[1.0, 2.0, 0.4], [-1.0, 0.5, 0.35]])
            quat = torch.tensor([[0.9238795, 0.0, 0.0, 0.3826834], [0.9950042, 0.0998334, 0.0, 0.0]])
            lin, ang = torch.tensor([[0.5, 0.0, 0.0], [0.0, -0.2, 0.0]]), torch.tensor([[0.0, 0.0, 0.3], [0.0] * 3])
            q = base[:2] + 0.1
            b.reset(ids, pos, quat, lin, ang, q, torch.zeros(2, 12))
            st = b.state
            torch.testing.assert_close(st.root_pos_w[ids], pos)
            torch.testing.assert_close(st.root_quat_w[ids], quat)
            torch.testing.assert_close(st.root_lin_vel_w[ids], lin, atol=1e-6, rtol=0)
            torch.testing.assert_close(st.root_ang_vel_w[ids], ang, atol=1e-6, rtol=0)
            torch.testing.assert_close(st.joint_pos[ids], q)
            torch.testing.assert_close(st.root_lin_vel_b[1], torch.tensor([0.5 * 0.7071068, -0.5 * 0.7071068, 0.0]),
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(st.projected_gravity_b[3], torch.tensor([0.0, -0.1986693, -0.9800666]),
                                       atol=1e-6, rtol=0)
        if k == 6:   # push worlds 0 and 2 of both
            before = b.state.root_lin_vel_w.clone()
            dv = torch.tensor([[0.5, -0.25, 0.0], [0.0, 1.0, 0.0]])
            for x in (a, b):
                x.push(torch.tensor([0, 2]), dv)
            torch.testing.assert_close(b.state.root_lin_vel_w[[0, 2]] - before[[0, 2]], dv, atol=1e-5, rtol=0)
            torch.testing.assert_close(b.state.root_lin_vel_w[[1, 3]], before[[1, 3]])
        if k == 8:   # one joint of world 2 of b explodes
            b._qvel[2, 7] = float("nan")
        bad_a, bad_b = a.step(tgt), b.step(tgt)
        assert not bad_a.any()
        assert bad_b.tolist() == ([False, False, True, False] if k == 8 else [False] * 4)
        if k == 8:   # world 2 is back in its last reset state: the default standing pose at the origin
            np.testing.assert_allclose(b.state.joint_pos[2].numpy(), b.robot.default_joint_pos, atol=1e-6)
            np.testing.assert_allclose(b.state.root_pos_w[2, :2].numpy(), 0.0, atol=1e-7)
    assert b.num_non_finite == 1 and a.num_non_finite == 0
    sa, sb = _snapshot(a.state), _snapshot(b.state)
    for name, t in sb.items():
        if t.is_floating_point():
            assert torch.isfinite(t).all(), name
            # the worlds nobody reset follow the same trajectory in both
            torch.testing.assert_close(sa[name][0], sb[name][0], atol=1e-5, rtol=1e-5, msg=name)
    a.close()
    b.close()


@needs_warp
@pytest.mark.slow
def test_during_sees_the_state_before_the_step_and_the_state_is_updated_in_place():
    """The state's plain fields are views of the backend's readout, not copies of it: while ``during``
    runs they still hold the state before the step, and every step updates the same tensors in place."""
    b = make_backend("mujoco_warp", BackendConfig(num_envs=3, seed=0, warp=WarpConfig(device="cpu")))
    st = b.state
    tensors = {f.name: getattr(st, f.name) for f in dataclasses.fields(st) if f.name != "body_names"}
    g = torch.Generator().manual_seed(0)
    base = torch.tensor(b.robot.default_joint_pos, dtype=torch.float32).repeat(3, 1)
    seen = []
    for _ in range(3):
        before = _snapshot(b.state)
        b.step(base + 0.2 * torch.randn(base.shape, generator=g), during=lambda: seen.append(_snapshot(b.state)))
        for name, t in before.items():
            assert torch.equal(seen[-1][name], t), name
        after = _snapshot(b.state)
        assert not torch.equal(after["joint_pos"], before["joint_pos"])
        assert not torch.equal(after["root_pos_w"], before["root_pos_w"])
    assert b.state is st and all(getattr(st, name) is t for name, t in tensors.items())
    b.close()


@needs_warp
@pytest.mark.slow
def test_a_reset_checks_everything_in_one_sync_and_a_bad_one_names_its_input_and_changes_nothing(monkeypatch):
    """On a GPU every host read drains the device's queue, so a reset reads back once: the ids' range, the
    inputs' finiteness and the quaternions together. A failed check still names what is wrong."""
    b = make_backend("mujoco_warp", BackendConfig(num_envs=3, warp=WarpConfig(device="cpu")))
    assert b.reset_recompute == "forward"     # the CPU device's default: the readout of mujoco_cpu's mj_forward
    st = b.state
    ids = torch.tensor([0, 2])
    good = dict(root_pos_w=torch.tensor([[0.0, 0.0, 0.4], [1.0, 0.0, 0.4]]), root_quat_w=torch.tensor([[1.0, 0, 0, 0]] * 2),
                root_lin_vel_w=torch.zeros(2, 3), root_ang_vel_w=torch.zeros(2, 3),
                joint_pos=torch.tensor(b.robot.default_joint_pos, dtype=torch.float32).repeat(2, 1),
                joint_vel=torch.zeros(2, 12))
    reads = []
    for name in ("tolist", "item", "__bool__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name: (reads.append(_n), _o(self, *a))[1])
    b.reset(ids, **good)
    assert reads == ["tolist"]
    monkeypatch.undo()
    torch.testing.assert_close(st.root_pos_w[ids], good["root_pos_w"])
    before = _snapshot(st)
    bad_inputs = [(torch.tensor([0, 3]), {}, "env_ids must lie in [0, 3), got min 0 max 3"),
                  (ids, {"joint_vel": torch.tensor([[float("nan")] + [0.0] * 11] * 2)}, "joint_vel holds non-finite"),
                  (ids, {"root_quat_w": torch.zeros(2, 4)}, "root_quat_w rows must be non-zero")]
    for bad_ids, change, message in bad_inputs:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            b.reset(bad_ids, **{**good, **change})
    for name, t in _snapshot(st).items():
        torch.testing.assert_close(t, before[name], msg=name)
    b.close()


@needs_warp
@pytest.mark.slow
@needs_warp
def test_measured_buffers_fit_32k_rough_worlds_in_a_fraction_of_80_gb():
    """Device memory per world (Warp's Data arrays, measured, plus the convex-collision workspace each
    step allocates per contact slot) at the buffers measured from the rough scene: 32768 worlds need
    well under 80 GB (the guessed 256 contacts per world asked ~48 GB and ran out of memory on an H100)."""
    from quadforge.envs.terrain import TerrainConfig
    b = make_backend("mujoco_warp", BackendConfig(num_envs=4, terrain=TerrainConfig.mixed(), warp=WarpConfig(device="cpu")))
    mem = b.memory_per_world()
    assert b.contact_load is not None and b.nconmax < 256
    assert 0 < mem["data"] < mem["total"] and mem["total"] * 32768 < 20e9, mem
    b.close()


@pytest.mark.slow
def test_buffer_overflow_is_reported_never_silent():
    from quadforge.envs.backends.mujoco_warp import WarpBufferOverflow
    targets = None
    cfg = BackendConfig(num_envs=2, warp=WarpConfig(device="cpu", nconmax=1, njmax=8))
    b = make_backend("mujoco_warp", cfg)   # four feet on the ground need more than one contact
    targets = torch.tensor(b.robot.default_joint_pos, dtype=torch.float32).repeat(2, 1)
    with pytest.raises(WarpBufferOverflow, match=r"nconmax=1.*raise"):
        for _ in range(20):
            b.step(targets)
    assert b.num_overflow > 0
    t = make_backend("mujoco_warp", dataclasses.replace(cfg, warp=WarpConfig(device="cpu", nconmax=1, njmax=8,
                                                                             on_overflow="terminate")))
    flagged = torch.zeros(2, dtype=torch.bool)
    for _ in range(20):
        flagged |= t.step(targets)
        assert torch.isfinite(t.state.root_pos_w).all()
    assert flagged.all() and t.num_overflow > 0
    b.close()
    t.close()


def test_a_cube_face_is_handed_to_warp_as_mujoco_c_shows_it():
    """The QUARD letters are stored turned for MuJoCo C's cube faces; the picture handed to MuJoCo Warp's
    2D sampler is the upright glyph again (an asymmetric one, so any flip or quarter turn would show)."""
    from quadforge.envs.backends.warp_camera import cube_face_as_shown
    from quadforge.envs.quard.objects import letter_image
    glyph = letter_image("f", 64)
    stored = np.rot90(np.fliplr(np.flipud(glyph)), 1)          # how envs/quard/objects.py stores it
    np.testing.assert_array_equal(cube_face_as_shown(stored), glyph)
    assert not np.array_equal(glyph, np.fliplr(glyph)) and not np.array_equal(glyph, np.flipud(glyph))


def _walk(backend: str, commands: list[list[float]], steps: int, device: str = "cpu"):
    from quadforge.envs.config import EnvConfig
    from quadforge.envs.vec_env import LeggedEnv
    from quadforge.experts.gait import GaitController

    n = len(commands)
    cfg = EnvConfig.flat(num_envs=n, seed=3)
    cfg.backend_name = backend
    cfg.backend.num_threads = 1
    cfg.backend.warp = WarpConfig(device=device)
    cfg.curriculum = False
    cfg.randomization.push_robots = False
    env = LeggedEnv(cfg)
    ctrl = GaitController(env.robot, n, env.dt, gait="trot")
    cmd = env.commands.clone()
    cmd[:, :3] = torch.tensor(commands)
    env.set_commands(torch.arange(n), cmd)
    ctrl.reset(torch.arange(n))
    falls, vel = torch.zeros(n), []
    for t in range(steps):
        # the controller runs on the host; the env moves its actions to the physics device
        _, _, dones, extras = env.step(ctrl.act({k: v.cpu() for k, v in env.terms.items()}))
        falls += (dones & ~extras["time_outs"]).float().cpu()
        if t >= steps // 2:
            vel.append(torch.stack([env.terms["base_lin_vel"][:, 0], env.terms["base_ang_vel"][:, 2]], -1).cpu())
    env.close()
    return falls, torch.stack(vel).mean(0)


@needs_warp
@pytest.mark.slow
@pytest.mark.parametrize("device", WARP_DEVICES)
def test_gait_expert_walks_under_both_backends(device):
    commands = [[0.0, 0.0, 0.0], [0.5, 0.0, 0.0], [-0.5, 0.0, 0.0], [0.5, 0.0, 0.5]]
    target = torch.tensor(commands)
    results = {b: _walk(b, commands, steps=150, device=device) for b in ("mujoco_cpu", "mujoco_warp")}
    for backend, (falls, vel) in results.items():
        assert falls.sum() == 0, backend
        assert (vel[:, 0] - target[:, 0]).abs().max() < 0.15, (backend, vel)
        assert (vel[3, 1] - 0.5).abs() < 0.15, (backend, vel)
    # and the two walk alike (mean forward and turning speed over the second half)
    assert (results["mujoco_cpu"][1] - results["mujoco_warp"][1]).abs().max() < 0.1, results


@needs_warp
@pytest.mark.slow
@pytest.mark.parametrize("device", WARP_DEVICES)
def test_gait_expert_collects_alike_under_both_backends(device, tmp_path):
    """Issue 23: the expert's success and fall rates in collection under Warp equal mujoco_cpu's within
    binomial noise (the same seeds and commands; trajectories part after a few dozen contact-rich steps,
    so the runs are compared as samples, not step for step)."""
    from quadforge.collection.collect import CollectConfig, collect_episodes
    from quadforge.tools.results_report import two_proportion_z
    n = 256
    runs = {}
    for backend in ("mujoco_cpu", "mujoco_warp"):
        warp = WarpConfig(device=device) if backend == "mujoco_warp" else None
        cfg = CollectConfig(out=str(tmp_path / backend), episodes=n, policy="gait", terrain="flat", num_envs=64,
                            seed=0, backend=backend, warp=warp, progress=False).validate()
        runs[backend] = collect_episodes(cfg, "main", n, compact=False)
    cpu, warp = runs["mujoco_cpu"], runs["mujoco_warp"]
    assert cpu["episodes"] == warp["episodes"] == n
    assert cpu["successes"] > 0.7 * n and warp["successes"] > 0.7 * n, (cpu, warp)
    falls = {b: r["reasons"].get("fall", 0) for b, r in runs.items()}
    # p > 0.001: 3.3 standard errors apart would fail (1,024 episodes each measured p = 0.47 and 0.72)
    assert two_proportion_z(cpu["successes"], n, warp["successes"], n)[1] > 1e-3, (cpu, warp)
    assert two_proportion_z(falls["mujoco_cpu"], n, falls["mujoco_warp"], n)[1] > 1e-3, falls


@needs_warp
@pytest.mark.slow
def test_rsl_rl_runner_trains_under_warp(tmp_path):
    from quadforge.experts.loaders import load_expert
    from quadforge.training.ppo import TrainExpertConfig, train
    tiny = {"num_steps_per_env": 4, "actor_hidden_dims": [16], "critic_hidden_dims": [16], "save_interval": 1,
            "num_learning_epochs": 1, "num_mini_batches": 2, "env.episode_length_s": 0.1}
    cfg = TrainExpertConfig(out=str(tmp_path / "run"), num_envs=4, iterations=1, overrides=tiny,
                            backend="mujoco_warp", warp=WarpConfig(device="cpu"))
    last = train(cfg)
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["iter"] == 0 and ckpt["infos"]["quadforge"]["robot"] == "go1"
    policy = load_expert(last, num_envs=4)
    assert policy.layout.name == "legged_gym_48"


@needs_warp
@pytest.mark.slow
def test_batch_renderer_frames_every_world_and_sees_per_env_colours(monkeypatch):
    """The camera term through MuJoCo Warp's batch renderer, on a scene with a ``front`` camera on the
    base (here added to the robot's MJCF; the QUARD object library adds the same)."""
    from types import SimpleNamespace

    from quadforge.envs.robots import RobotSpec
    original = RobotSpec.spec

    def with_camera(self):
        spec = original(self)
        spec.body(self.base_body).add_camera(name="front", pos=[0.3, 0, 0], xyaxes=[0, -1, 0, 0, 0, 1], fovy=60)
        spec.worldbody.add_geom(name="marker", type=2, size=[0.3, 0, 0], pos=[2.0, 0.0, 0.3], rgba=[1, 0, 0, 1],
                                contype=0, conaffinity=0)
        return spec

    monkeypatch.setattr(RobotSpec, "spec", with_camera)
    b = make_backend("mujoco_warp", BackendConfig(num_envs=2, warp=WarpConfig(device="cpu")))
    cam = b.make_camera(SimpleNamespace(width=32, height=24, depth=True, max_depth=10.0))
    rgb, depth = np.zeros((2, 24, 32, 3), np.uint8), np.zeros((2, 24, 32), np.float32)
    cam.render([0, 1], rgb, depth)
    # the red sphere 1.7 m ahead fills the image centre in both worlds; the ground is below the horizon
    assert rgb[:, 12, 16, 0].min() > 100 and rgb[:, 12, 16, 1:].max() < 60, rgb[:, 12, 16]
    np.testing.assert_allclose(depth[:, 12, 16], 1.4, atol=0.05)
    marker = int(__import__("mujoco").mj_name2id(b.mjm, 5, "marker"))
    assert (cam.segment(0)[12, 16] == marker)
    cam.set_colour_geoms(np.array([marker]), np.array([[[1, 0, 0, 1]], [[0, 0, 1, 1]]], dtype=np.float32))
    cam.render([0, 1], rgb)
    assert rgb[0, 12, 16, 0] > 100 and rgb[1, 12, 16, 2] > 100 and rgb[1, 12, 16, 0] < 60, rgb[:, 12, 16]
    cam.close()
    b.close()


@needs_warp
@pytest.mark.slow
@pytest.mark.parametrize("device", WARP_DEVICES)
def test_substeps_without_sensors_change_nothing_under_warp(device):
    """The Warp step skips the sensors of the substeps nobody reads, as mujoco_cpu does: the state and
    readout equal a backend computing them in every substep, bit for bit on the CPU device (same kernels
    otherwise); on a GPU, whose contact order varies run to run, to the equivalence tolerances."""
    from quadforge.envs.terrain import TerrainConfig
    cfg = BackendConfig(num_envs=4, seed=3, terrain=TerrainConfig.mixed(), randomization=RandomizationConfig(),
                        warp=WarpConfig(device=device))
    quiet, every = make_backend("mujoco_warp", cfg), make_backend("mujoco_warp", cfg)
    every.sensors_every_substep = True
    g = torch.Generator().manual_seed(0)
    base = torch.tensor(quiet.robot.default_joint_pos, dtype=torch.float32).repeat(4, 1)
    for _ in range(20 if device == "cpu" else 3):
        targets = (base + 0.3 * torch.randn(base.shape, generator=g)).to(quiet.device)
        quiet.step(targets)
        every.step(targets)
    for name, t in _snapshot(quiet.state).items():
        if device == "cpu":
            assert torch.equal(t, _snapshot(every.state)[name]), name
        elif t.is_floating_point():
            torch.testing.assert_close(t, _snapshot(every.state)[name], atol=TOLERANCES.get(name, 1e-3), rtol=0, msg=name)
    assert device == "cpu" or ("step" in quiet._graphs and "step_all_sensors" in every._graphs)
    quiet.close()
    every.close()


@needs_warp
@pytest.mark.slow
def test_warp_profile_decomposes_the_env_step_on_its_own_worlds():
    """bench warp_profile's layers on the env's worlds (here Warp's CPU device, no event trace): every
    layer is timed (how they compare is the benchmark's to say, on a GPU, not a test's)."""
    from quadforge.tools.bench.warp_profile import decompose
    table, functions = decompose(4, 3, trace=False)
    ms = {r["layer"]: r["ms per policy step"] for r in table.records()}
    assert list(ms) == ["env step", "backend step (graph, readout, flags)", "physics graph alone"] and not functions
    assert all(v > 0 for v in ms.values())


@needs_warp
@pytest.mark.slow
@pytest.mark.parametrize("device", WARP_DEVICES)
def test_quard_scene_on_warp_equals_mujoco_cpu(device):
    """A QUARD task on Warp (its CPU device; a GPU in the gpu lane) against mujoco_cpu, same seed: the same scenes drawn, the objects
    at the same poses in every world, the obstacle's contact sensor reading the same force when a leg
    touches it, and the camera seeing the target on the same pixels (segmentation: rays on the CPU,
    MuJoCo Warp's ray tracer on Warp) in the env's colour."""
    from quadforge.envs.config import InitConfig
    from quadforge.envs.quard.camera import CameraConfig
    from quadforge.envs.quard.env import QuardConfig, QuardEnv
    from quadforge.envs.quard.objects import RGB
    envs = {}
    for backend in ("mujoco_cpu", "mujoco_warp"):
        # images on Warp only: its batch renderer needs no OpenGL (the CPU camera's segmentation neither)
        q = QuardConfig.make("quard:go_to", num_envs=2, seed=4, images=backend == "mujoco_warp", backend=backend)
        q.env.backend.num_threads = 1
        q.env.backend.warp = WarpConfig(device=device)
        # The start pose without its random part: the env draws it from a generator on its own device, and
        # a CUDA generator's stream is not the CPU's (docs/envs.md "Determinism"). With the draw on, the
        # H100 put the robots 1.1 cm apart after 5 steps; the same stream shift on Warp's CPU device, 1.5 cm.
        q.env.init = InitConfig(joint_pos_scale=(1.0, 1.0), root_vel=0.0, spawn_xy=0.0)
        envs[backend] = QuardEnv(q)
    cpu, warp = envs["mujoco_cpu"], envs["mujoco_warp"]
    assert [p["instruction"] for p in cpu.scenes.params] == [p["instruction"] for p in warp.scenes.params]
    for _ in range(5):
        cpu.step(torch.zeros(2, 12))
        warp.step(torch.zeros(2, 12))
    placed = np.stack([d.mocap_pos for d in cpu.backend.datas])              # (N, nmocap, 3)
    np.testing.assert_allclose(warp.backend._mocap_pos.cpu().numpy(), placed, atol=1e-5)
    # every object body where its mocap puts it, in both backends' kinematics
    lib = cpu.library
    for inst in lib.instances:
        body = int(cpu.backend.scene.model.geom_bodyid[inst.geom_ids[0]])
        got = warp.backend._wp.to_torch(warp.backend.d.xpos)[:, body].cpu().numpy()
        np.testing.assert_allclose(got, np.stack([d.xpos[body] for d in cpu.backend.datas]), atol=1e-4)
    torch.testing.assert_close(warp.backend.state.root_pos_w.cpu(), cpu.backend.state.root_pos_w, atol=2e-3, rtol=0)
    # the camera: the target on the same pixels, in its colour
    cams = {k: e.backend.make_camera(CameraConfig()) for k, e in envs.items()}
    for k, e in envs.items():
        cams[k].set_colour_geoms(e.scenes.colour_geoms, e.scenes.rgba)
    frames = np.zeros((2, 64, 64, 3), dtype=np.uint8)
    cams["mujoco_warp"].render(np.arange(2), frames)
    assert warp.terms["images/front_rgb"].shape == (2, 64, 64, 3) and warp.images.any()   # the env's own frames
    for i, p in enumerate(cpu.scenes.params):
        target = lib.instances[lib.find("object", p["target"]["object"], 0)]
        on_cpu = np.isin(cams["mujoco_cpu"].segment(i), target.geom_ids)
        on_warp = np.isin(cams["mujoco_warp"].segment(i), target.geom_ids)
        assert on_cpu.sum() >= 4 and (on_cpu & on_warp).sum() >= 0.8 * (on_cpu | on_warp).sum(), p["instruction"]
        want = np.array(RGB[p["target"]["colour"]])
        seen = frames[i][on_cpu & on_warp].astype(float).mean(0)
        # lit and shaded, the target's pixels point the way of its env's colour (measured cosine >= 0.96)
        assert seen @ want / (np.linalg.norm(seen) * np.linalg.norm(want)) > 0.93, (seen, want)
    # the obstacle's panel (z 0.13-0.45 m) moved into env 0's trunk: the same contact force read on both,
    # right after the placement (set_mocap(forward=True) computes the contacts and the readout)
    obstacle = next(i for i in lib.instances if i.kind == "obstacle")
    cols = cpu.task._obstacle_cols
    pos = placed.copy()
    pos[0, obstacle.mocap] = cpu.backend.state.root_pos_w[0].numpy() * [1, 1, 0] + [0.2, 0.0, 0.0]
    for env in (cpu, warp):
        env.backend.set_mocap(np.arange(2), pos, forward=True)
    f_cpu, f_warp = cpu.backend.sensor_columns(cols), warp.backend.sensor_columns(cols)
    assert np.linalg.norm(f_cpu[0]) > 1.0 and np.linalg.norm(f_cpu[1]) == 0.0, f_cpu
    np.testing.assert_allclose(f_warp, f_cpu, atol=1.0 + 0.1 * np.linalg.norm(f_cpu[0]))
    for e in envs.values():
        e.close()


@needs_warp
@pytest.mark.slow
@pytest.mark.parametrize("device", WARP_DEVICES)
def test_warp_frames_look_like_the_cpu_cameras(device):
    """The same QUARD scenes framed by MuJoCo Warp's ray tracer and by the CPU camera (OpenGL) agree
    pixel for pixel within a few levels: the skybox and the ground's checker texture included. A VLA
    trained on CPU frames reads Warp's (before textures and skybox were on, Warp drew a black sky and a
    white ground, 151 levels off on average, and the shipped VLA timed out where it succeeded on the CPU)."""
    from quadforge.envs.quard.camera import CameraConfig
    from quadforge.envs.quard.env import QuardConfig, QuardEnv
    envs, frames, segs = {}, {}, {}
    for backend in ("mujoco_cpu", "mujoco_warp"):
        q = QuardConfig.make("quard:distinguish", num_envs=2, seed=4, images=False, backend=backend)
        q.env.backend.num_threads = 1
        q.env.backend.warp = WarpConfig(device=device)
        envs[backend] = QuardEnv(q)
    for _ in range(5):
        for e in envs.values():
            e.step(torch.zeros(2, 12))
    for k, e in envs.items():
        try:
            cam = e.backend.make_camera(CameraConfig())
        except RuntimeError as err:       # the CPU camera needs OpenGL (MUJOCO_GL=egl here)
            if "MUJOCO_GL" in str(err):
                pytest.skip(f"no OpenGL here: {err}")
            raise
        cam.set_colour_geoms(e.scenes.colour_geoms, e.scenes.rgba)
        frames[k] = np.zeros((2, 64, 64, 3), np.uint8)
        cam.render(np.arange(2), frames[k])
        segs[k] = np.stack([cam.segment(i) for i in range(2)])
        cam.close()
    diff = np.abs(frames["mujoco_cpu"].astype(float) - frames["mujoco_warp"].astype(float))
    assert diff.mean() < 6.0, diff.mean((0, 1, 2))            # measured 1.4 on Warp's CPU device
    assert np.percentile(diff.max(-1), 95) < 30, np.percentile(diff.max(-1), 95)   # edges may differ
    # the letters themselves (cube textures): measured 14 levels off on the letter boxes' pixels; with
    # the six stacked faces squeezed onto every box face (stripes, unreadable) it was 56
    letters = np.concatenate([i.geom_ids for i in envs["mujoco_cpu"].library.instances if i.kind == "letter"])
    on = np.isin(segs["mujoco_cpu"], letters) & np.isin(segs["mujoco_warp"], letters)
    assert on.sum() >= 50 and diff[on].mean() < 20, (on.sum(), diff[on].mean())
    for e in envs.values():
        e.close()


@needs_warp
@pytest.mark.slow
@pytest.mark.parametrize("device", WARP_DEVICES)
def test_quard_collection_and_vla_eval_run_on_warp(device, tmp_path, capsys):
    """The vision-language half end to end on Warp (its CPU device; a GPU in the gpu lane): the privileged
    expert collects episodes with frames through their ends, recording its high-level commands, and the
    shipped VLA is evaluated. On a GPU both once met host tensors beside the env's CUDA ones at the first
    recorded step and the first episode end (the unit checks on ``meta``: tests/envs/test_quard.py,
    tests/experts/test_hierarchical.py)."""
    import json

    from quadforge.data.store import TrajectoryStore
    from quadforge.tools.cli import main
    warp = ["--backend", "mujoco_warp", "--warp-device", device]
    store = tmp_path / "quard"
    assert main(["collect", "--task", "quard:go_to", "--policy", "quard_expert", "--episodes", "4", "--num-envs",
                 "2", "--store", str(store), "--no-progress", "--seed", "3", *warp]) == 0
    s = TrajectoryStore.open(store)
    assert s.num_episodes == 4
    commands = s.array("hl_commands")[:]
    assert commands.shape[1] == 12 and np.isfinite(commands).all() and np.abs(commands).max() > 0
    assert s.array("images/front_rgb")[:].max() > 0
    pytest.importorskip("wordllama")   # the shipped VLA's instruction encoder
    capsys.readouterr()
    out = tmp_path / "eval"
    assert main(["eval", "--task", "quard:go_to", "--policy", "experts/checkpoints/vla_rt1.pt", "--colours", "train",
                 "--episodes-per-cell", "2", "--num-envs", "2", "--seed", "7", "--out", str(out), *warp]) == 0
    row = json.loads((out / "eval.json").read_text())["families"]["train"]["go_to"]
    assert row["episodes"] == 2 and sum(row["outcomes"].values()) == 2
