"""The env layer's speed-ups keep its arithmetic: the flat-index terrain lookup, the reused yaw of the
height scan, the air-time buffers, and the torch thread setting."""
import contextlib
import math

import pytest
import torch

from quadforge.envs.config import EnvConfig, RandomizationConfig
from quadforge.envs.observations import make_term_fns, scan_points_b, TermCache
from quadforge.envs.rewards import FeetAirTime
from quadforge.envs.terrain import TerrainConfig, generate
from quadforge.envs.vec_env import LeggedEnv


def _small_terrain():
    return TerrainConfig.of_types(["stairs_up", "rough_slope", "gaps"], num_levels=3, num_cols=3, tile_size=4.0,
                                  border=2.0)


def _two_triangle_height(t, xy: torch.Tensor) -> torch.Tensor:
    """The lookup as first written: four 2-D gathers, both triangles, pick by the diagonal."""
    H = torch.as_tensor(t.heights)
    nx, ny = H.shape
    hs = t.cfg.horizontal_scale
    u = (xy[..., 0].to(H.dtype) / hs + (nx - 1) / 2).clamp(0, nx - 1)
    v = (xy[..., 1].to(H.dtype) / hs + (ny - 1) / 2).clamp(0, ny - 1)
    i, j = u.floor().long().clamp(max=nx - 2), v.floor().long().clamp(max=ny - 2)
    fu, fv = u - i, v - j
    h00, h10, h01, h11 = H[i, j], H[i + 1, j], H[i, j + 1], H[i + 1, j + 1]
    lower = h00 + fu * (h10 - h00) + fv * (h11 - h10)
    upper = h00 + fv * (h01 - h00) + fu * (h11 - h01)
    return torch.where(fu >= fv, lower, upper)


def test_flat_index_lookup_is_bitwise_the_two_triangle_lookup():
    t = generate(_small_terrain())
    nx, ny = t.heights.shape
    half = torch.tensor([nx, ny]) * t.cfg.horizontal_scale / 2
    g = torch.Generator().manual_seed(0)
    xy = (torch.rand(20000, 2, generator=g) * 2.4 - 1.2) * half        # inside and outside the field
    vertices = torch.round(xy / t.cfg.horizontal_scale) * t.cfg.horizontal_scale
    diagonal = (torch.floor(xy / t.cfg.horizontal_scale) + 0.5) * t.cfg.horizontal_scale  # fu == fv
    for pts in (xy, vertices, diagonal, xy.view(100, 200, 2)[:, ::3]):  # strided batch too
        got = t.height_at(pts)                                       # the CPU's numpy path
        assert got.shape == pts.shape[:-1]
        assert torch.equal(got, _two_triangle_height(t, pts))
        assert torch.equal(t.height_at_reference(pts), got)          # the torch path (a GPU's)
    xy64 = xy.double()                                               # cast to the heights' dtype first
    assert torch.equal(t.height_at(xy64), t.height_at_reference(xy64))
    leaf = xy[:50].clone().requires_grad_(True)                      # autograd keeps the torch path
    assert torch.equal(t.height_at(leaf), t.height_at_reference(xy[:50]))


def test_terrain_lookup_scratch_buffers_are_per_thread_and_the_terrain_still_pickles():
    import pickle
    import threading
    t = generate(_small_terrain())
    errors = []

    def work(seed):
        g = torch.Generator().manual_seed(seed)
        for k in range(40):  # shapes change under the other threads' feet: the scratch is per thread
            pts = torch.randn(8 + (k + seed) % 5, 37, 2, generator=g) * 6
            if not torch.equal(t.height_at(pts), t.height_at_reference(pts)):
                errors.append(seed)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    pts = torch.randn(5, 9, 2)
    assert torch.equal(pickle.loads(pickle.dumps(t)).height_at(pts), t.height_at(pts))


def test_height_scan_with_the_reused_yaw_equals_a_fresh_scan():
    cfg = EnvConfig.rough(num_envs=4, terrain=_small_terrain(), randomization=RandomizationConfig.off(),
                          episode_length_s=5.0)
    env = LeggedEnv(cfg)
    g = torch.Generator().manual_seed(1)
    reused = 0
    try:
        for _ in range(15):
            obs, _, dones, _ = env.step(0.1 * torch.randn(4, 12, generator=g))
            if dones.any():  # a reset moved robots: the scan recomputed the yaw itself
                continue
            reused += 1
            # a view without the commands' yaw recomputes it from the quaternions
            fresh_view = env.task.view(env.backend.state, env.actions, env.last_actions, env.backend.env_params,
                                       env.backend.terrain_height, env.terrain.flat)
            fresh = TermCache(make_term_fns(scan_points_b()), fresh_view)["height_scan"]
            assert env.task.yaw is not None
            assert torch.equal(env.terms["height_scan"], fresh)
            assert torch.equal(obs["critic"], env._critic_obs.build(TermCache(env._term_fns, fresh_view)))
    finally:
        env.close()
    assert reused >= 10


def test_air_time_returned_is_the_callers_to_keep():
    air = FeetAirTime(2, "cpu")
    contact = torch.tensor([[False] * 4, [True] * 4])
    _, a1 = air.update(contact, 0.02)
    kept = a1.clone()
    first, a2 = air.update(~contact, 0.02)
    assert torch.equal(a1, kept)                                  # not overwritten by the next update
    assert torch.allclose(a2[0], torch.full((4,), 0.04))          # env 0 was airborne two steps
    assert first[0].all() and not first[1].any()


def test_env_sets_torch_threads_and_validates_them():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        env = LeggedEnv(EnvConfig.flat(num_envs=2, randomization=RandomizationConfig.off()))
        env.close()
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        env = LeggedEnv(EnvConfig.flat(num_envs=2, randomization=RandomizationConfig.off(), torch_threads=None))
        env.close()
        assert torch.get_num_threads() == 2                       # None leaves torch's setting alone
    finally:
        torch.set_num_threads(before)
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="torch_threads"):
            EnvConfig.flat(num_envs=2, torch_threads=bad).validate()


def test_scan_points_match_the_batched_rotation_matmul(monkeypatch):
    from types import SimpleNamespace

    from quadforge.envs import observations
    from quadforge.envs.rotations import yaw_from_quat
    from quadforge.envs.observations import scan_points_w
    g = torch.Generator().manual_seed(2)
    pb = scan_points_b()
    for n in (1, 5, 64):
        q = torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=1)
        st = SimpleNamespace(root_quat_w=q, root_pos_w=30 * torch.randn(n, 3, generator=g))
        yaw = yaw_from_quat(q)
        c, s = torch.cos(yaw), torch.sin(yaw)
        expected = torch.matmul(pb, torch.stack((c, s, -s, c), dim=1).view(-1, 2, 2)) + st.root_pos_w[:, None, :2]
        got = scan_points_w(st, pb)
        assert got.shape == (n, pb.shape[0], 2)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)  # bitwise on this machine's kernels
        assert torch.equal(scan_points_w(st, pb, yaw), got)
        with_base = scan_points_w(st, pb, yaw, append_base=True)
        assert torch.equal(with_base[:, :-1], got) and torch.equal(with_base[:, -1], st.root_pos_w[:, :2])
        with monkeypatch.context() as m:  # the torch arithmetic a GPU runs: the CPU's numpy bits
            m.setattr(observations, "cpu_arrays", lambda *tensors: None)
            assert torch.equal(scan_points_w(st, pb, yaw), got)
            assert torch.equal(scan_points_w(st, pb, yaw, append_base=True), with_base)


def test_in_place_heading_steering_is_the_yaw_command_formula():
    from quadforge.envs.commands import CommandManager
    from quadforge.envs.rotations import wrap_to_pi, yaw_from_quat
    from quadforge.envs.config import CommandsConfig
    cfg = CommandsConfig()
    g = torch.Generator().manual_seed(4)
    cm = CommandManager(cfg, 64, 0.02, g)
    cm.reset(torch.arange(64))
    cm.set_commands(torch.arange(5), torch.full((5, 15), 0.25))           # pinned envs keep their yaw command
    for _ in range(3):
        q = torch.nn.functional.normalize(torch.randn(64, 4, generator=g), dim=1)
        before = cm.commands.clone()
        yaw = cm.step(q)
        assert torch.equal(yaw, yaw_from_quat(q))
        lo, hi = cfg.range("ang_vel_yaw")
        steer = (cfg.heading_gain * wrap_to_pi(cm.heading - yaw)).clamp(lo, hi)
        expected = torch.where(cm.pinned, before[:, 2], steer)
        assert torch.equal(cm.commands[:, 2], expected)
        assert torch.equal(cm.commands[:, 2][:5], torch.full((5,), 0.25))


def test_heading_steering_fast_path_equals_its_torch_reference():
    """The numpy steering and the torch reference a GPU runs write the same bits, wrap edges included."""
    from quadforge.envs.commands import CommandManager
    from quadforge.envs.config import CommandsConfig
    from quadforge.envs.fast_paths import torch_references
    g = torch.Generator().manual_seed(7)
    twins = [CommandManager(CommandsConfig(), 4096, 0.02, torch.Generator().manual_seed(1)) for _ in range(2)]
    for cm in twins:
        cm.reset(torch.arange(4096))
        cm.set_commands(torch.arange(3), torch.full((3, 15), 0.25))
        cm.heading[3:9] = torch.tensor([math.pi, -math.pi, 0.0, 1.0, -3.0, 3.14159])
    for _ in range(3):
        q = torch.nn.functional.normalize(torch.randn(4096, 4, generator=g), dim=1)
        q[3:9] = torch.tensor([0.0, 0.0, 0.0, 1.0])   # yaw pi: heading - yaw on the wrap's edges
        twins[0].step(q)
        with torch_references():
            twins[1].step(q)
        assert torch.equal(twins[0].commands, twins[1].commands)


def test_work_overlapped_with_the_physics_changes_nothing():
    """LeggedEnv hands its physics-independent work (noise draw, counters, extras) to the backend to run
    while the workers simulate; doing it serially before the physics gives the same step, bit for bit."""
    def make():
        return LeggedEnv(EnvConfig.rough(num_envs=6, terrain=_small_terrain(), episode_length_s=0.5))
    overlapped, serial = make(), make()
    step = serial.backend.step

    def serial_step(targets, during=None):
        if during is not None:
            during()
        return step(targets)
    serial.backend.step = serial_step
    g = torch.Generator().manual_seed(5)
    try:
        for _ in range(40):  # episodes of 25 steps: time-outs and resets included
            a = 0.5 * torch.randn(6, 12, generator=g)
            o1, r1, d1, e1 = overlapped.step(a)
            o2, r2, d2, e2 = serial.step(a)
            assert torch.equal(o1["policy"], o2["policy"]) and torch.equal(o1["critic"], o2["critic"])
            assert torch.equal(r1, r2) and torch.equal(d1, d2) and torch.equal(e1["time_outs"], e2["time_outs"])
            assert all(torch.equal(e1["episode_end"][k], e2["episode_end"][k]) for k in e1["episode_end"])
    finally:
        overlapped.close()
        serial.close()


def test_yaw_cpu_fast_path_is_bitwise_the_torch_formula():
    from quadforge.envs.fast_paths import yaw_from_quat_numpy
    from quadforge.envs.rotations import yaw_from_quat, yaw_from_quat_reference
    g = torch.Generator().manual_seed(6)
    q = torch.nn.functional.normalize(torch.randn(20000, 4, generator=g), dim=1)
    q[:100, 1:3] = 0.0                                             # exact zeros and signs too
    q = torch.cat([q, -q, torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, -1], [-0.0, 0, 0, 1]])])

    def torch_formula(x):
        w, x_, y, z = x.unbind(-1)
        return torch.atan2(2 * (w * z + x_ * y), 1 - 2 * (y * y + z * z))
    for batch in (q, q.view(-1, 4, 4)[:, ::2], q[:, :].t().contiguous().t()):  # strided and batched
        got = yaw_from_quat(batch)
        assert got.dtype == torch.float32 and got.shape == batch.shape[:-1]
        assert torch.equal(got, torch_formula(batch))
        assert torch.equal(yaw_from_quat_numpy(batch), yaw_from_quat_reference(batch))
    leaf = q[:5].clone().requires_grad_(True)                      # autograd keeps the torch path
    assert torch.equal(yaw_from_quat(leaf).detach(), torch_formula(q[:5]))
    assert yaw_from_quat_numpy(leaf) is None and yaw_from_quat_numpy(q.bfloat16()) is None


def test_termination_numpy_path_equals_the_torch_path():
    from types import SimpleNamespace

    from quadforge.envs.config import TerminationsConfig
    from quadforge.envs.scene import TRACKED
    from quadforge.envs.terminations import Terminations
    g = torch.Generator().manual_seed(7)
    n = 200
    state = SimpleNamespace(projected_gravity_b=torch.randn(n, 3, generator=g),
                            contact_forces=0.5 * torch.randn(n, len(TRACKED), 3, generator=g))
    height = 0.3 * torch.rand(n, generator=g)
    non_finite, time_out = torch.rand(n, generator=g) > 0.9, torch.rand(n, generator=g) > 0.7
    codes = set()
    for bodies in (("base",), ("base", "thigh"), ()):
        t = Terminations(TerminationsConfig(contact_bodies=bodies), 0.3, TRACKED)
        got = t.outcome(state, height, non_finite, time_out)              # CPU: numpy
        fn = torch.linalg.vector_norm(state.contact_forces, dim=-1) if bodies else None
        ref = t._outcome(torch, t._gz(state.projected_gravity_b), height, non_finite, time_out, fn)
        for a, b in zip(got, ref):
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert got.reason.dtype == torch.int64
        codes |= set(got.reason.tolist())
    assert codes == {0, 1, 2, 3, 4}                                      # every reason occurred


def test_air_time_numpy_path_equals_the_torch_path():
    g = torch.Generator().manual_seed(8)
    fast, ref = FeetAirTime(50, "cpu"), FeetAirTime(50, "cpu")
    torch_path_buffers = (torch.zeros(50, 4), torch.zeros(50, 4, dtype=torch.bool))
    for step in range(60):
        contact = torch.rand(50, 4, generator=g) > 0.6
        f1, a1 = fast.update(contact, 0.02)
        # the torch expressions on the reference's buffers
        filt = contact | ref.last_contact
        ref.last_contact.copy_(contact)
        f2 = (ref.air_time > 0) & filt
        a2 = ref.air_time + 0.02
        torch.where(filt, torch.zeros(()), a2, out=ref.air_time)
        assert torch.equal(f1, f2) and torch.equal(a1, a2) and torch.equal(fast.air_time, ref.air_time)
        # and the shared expressions run by torch (the path of other devices) give the same bits
        air_t, last_t = torch_path_buffers
        f3, a3 = FeetAirTime._update(torch, air_t, last_t, contact, 0.02)
        assert torch.equal(f3, f2) and torch.equal(a3, a2) and torch.equal(air_t, ref.air_time)
        if step == 30:
            air_t[:10], last_t[:10] = 0.0, False
            fast.reset(torch.arange(10))
            ref.reset(torch.arange(10))


def test_fast_paths_give_the_bits_of_the_torch_references_over_a_rollout_with_resets():
    """The whole env, its numpy fast paths on (the CPU) and off (``torch_references``: what a GPU runs),
    from the same seed: the same observations, rewards and dones bit for bit, resets and rough ground
    included, and the fast paths on again after the block."""
    from quadforge.envs import fast_paths
    from quadforge.envs.builder import make_env
    runs = []
    for references in (False, True):
        env = make_env("go1", "mixed", num_envs=16, seed=3, overrides={"episode_length_s": 0.5})
        g = torch.Generator().manual_seed(0)
        out, ends = [], 0
        with fast_paths.torch_references() if references else contextlib.nullcontext():
            assert (fast_paths.cpu_arrays(torch.zeros(1)) is None) == references
            for _ in range(40):
                obs, rew, done, _ = env.step(0.5 * torch.randn(16, 12, generator=g))
                out.append(torch.cat([obs["policy"].flatten(), obs["critic"].flatten(), rew, done.float()]))
                ends += int(done.sum())
        env.close()
        runs.append(torch.stack(out))
        assert ends >= 16                      # every env ended an episode at least once
    assert fast_paths.cpu_arrays(torch.zeros(1)) is not None
    assert torch.equal(runs[0], runs[1])


def test_bench_times_the_layer_in_the_step_and_with_the_physics_stubbed_and_restores_the_backend(monkeypatch):
    from quadforge.tools.bench import env_step

    made = []
    real_make = env_step._settled_env

    def keep(*args, **kwargs):
        made.append(real_make(*args, **kwargs))
        return made[-1]
    monkeypatch.setattr(env_step, "_settled_env", keep)
    r = env_step.layer_in_and_out_of_step("flat", 4, 1, steps=2, rounds=1)
    assert r["in step"] > 0 and r["physics stubbed"] > 0 and r["ratio"] == r["in step"] / r["physics stubbed"]
    (env, _, _), = made
    assert "step" not in env.backend.__dict__ and "_during_physics" not in env.__dict__   # the env's own methods again


def test_bench_counts_the_gait_experts_operations_and_times_act_beside_the_step():
    from quadforge.tools.bench import env_step

    r = env_step.expert_act("flat", 4, steps=3, compiled_twin=False)   # the compile: test_compile_expert.py
    assert r["aten ops"] > r["kernels"] > 100 and r["torch calls"] > 100
    # 631 kernels a control step before the Jacobian's FK passes, the command columns and the scan's
    # corner lookups were batched (420 with torch 2.13); the slack is for other torch versions
    assert r["kernels"] < 500
    assert r["act ms"] > 0 and r["step ms"] > 0 and 0 < r["act share"] < 1
    assert math.isnan(r["compiled act ms"]) and math.isnan(r["compiled first act s"])
