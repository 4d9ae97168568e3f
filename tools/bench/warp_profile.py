"""`quadforge bench warp_profile`: where one MuJoCo Warp physics step of the Go1 rough scene goes.

Issue 23 asks why the ``mujoco_warp`` backend's own rate sits below MuJoCo Warp's published heightfield
figures. ``bench scale`` times whole policy steps; this one opens a physics step up. It writes the
backend's exact scene (``envs.scene.build_scene``: Go1, legged_gym's mixed terrain grid, the sensors)
as a binary model and hands it to MuJoCo Warp's own benchmark, ``mujoco_warp.testspeed`` (one CUDA
graph per physics step, ``--event_trace``: GPU time per MuJoCo function, from CUDA events recorded
inside the graph), once per variant of ``VARIANTS``:

- ``defaults``: the scene as every env simulates it;
- ``no self-collision``: the robot's geoms collide with the ground only (legged_gym's A1/Go1 configs
  disable self-collisions: ``asset.self_collisions = 1``);
- ``no hip rotors``: the four hip-rotor cylinders do not collide (a cylinder against a heightfield goes
  through MuJoCo Warp's general convex path, GJK/EPA per prism; the other geoms have primitive colliders);
- ``flat ground``: the same robot on a plane instead of the heightfield (what the heightfield's prism
  colliders cost; standing, MuJoCo C finds 6 contacts on the platform against 4 on a plane).

The variants change what collides, so they are measurements of where the time goes, not options of the
env. The robots drop straight-legged onto one tile's platform and stand (zero controls hold the default
pose: the position actuators' bias is shifted by it); every world starts alike.
GPU only: ``mujoco_warp.testspeed`` refuses Warp's CPU device; without CUDA this says so and exits 0.

Then the same on the env's own worlds (``decompose``): an H100 ran the standing scene at 523k policy
steps/s in testspeed while the backend gave 200k in the env (docs/scale.md), so this builds the env
(``mujoco_warp``, the same world count, zero actions, 50 steps: spawns, resets, some robots down) and
times, per policy step, the env's step, the backend's step (physics graph, readout, the flags' host
read), the backend's physics graph alone, and one MuJoCo Warp physics step of its Data (per-world
randomised model, these worlds' states) under the event trace, times the decimation. Each layer's
difference to the next is where the rest goes. On Warp's CPU device the timings run without the trace.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time

import mujoco
import numpy as np
import torch

from quadforge.tools.bench.common import Table, report

OPTIONS = ("num_envs",)
VARIANTS = ("defaults", "no self-collision", "no hip rotors", "flat ground")
# the event trace's functions shown in the per-function table: nested at most this deep (step = 0); the
# JSON keeps every entry
TRACE_DEPTH = 3
# testspeed's own metrics in its JSON (every other key is a traced function)
METRICS = ("jit_duration", "run_time", "steps_per_second", "converged_worlds", "model_memory", "data_memory",
           "total_memory", "ncon_mean", "ncon_p95", "nefc_mean", "nefc_p95", "solver_niter_mean", "solver_niter_p95")


def standing_scene(variant: str = "defaults") -> mujoco.MjModel:
    """The backend's Go1 rough scene (flat: its plane), the robot dropped onto the first tile's platform
    with zero controls holding the default pose, with ``variant``'s collision change."""
    from quadforge.envs.builder import make_env

    env = make_env("go1", "flat" if variant == "flat ground" else "mixed", num_envs=1, num_threads=1,
                   backend="mujoco_cpu")
    scene, robot = env.backend.scene, env.robot
    m = copy.deepcopy(scene.model)
    m.opt.disableflags &= ~int(mujoco.mjtDisableBit.mjDSBL_AUTORESET)   # as MujocoWarpBackend does
    q0 = np.asarray(robot.default_joint_pos, dtype=np.float64)
    for a, name in enumerate(robot.actuator_names):
        i = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_ACTUATOR, name)
        # position actuator: force = kp * ctrl - kp * q - kv * qdot; + kp * q0 makes ctrl 0 hold q0
        m.actuator_biasprm[i, 0] = m.actuator_gainprm[i, 0] * q0[a]
    # qpos0 of a hinge is its reference angle (the kinematics turn by qpos - qpos0), so only the free
    # joint's part is set: the legs start straight, high enough to clear the ground, and the actuators
    # fold them into the default pose as the robot drops onto the tile's platform
    origin = scene.terrain.origins.numpy()[0, 0].astype(np.float64) if scene.terrain is not None else np.zeros(3)
    m.qpos0[0:3] = origin + [0.0, 0.0, robot.thigh_length + robot.calf_length + robot.foot_radius + 0.05]
    m.qpos0[3:7] = [1.0, 0.0, 0.0, 0.0]
    robot_geoms = [g for g in range(m.ngeom) if g != scene.ground_geom and m.geom_bodyid[g] != 0
                   and (m.geom_contype[g] or m.geom_conaffinity[g])]
    if variant == "no self-collision":
        # (contype 2, conaffinity 1): ground (1, 1) meets a robot geom, two robot geoms never meet
        m.geom_contype[robot_geoms] = 2
        m.geom_conaffinity[robot_geoms] = 1
    elif variant == "no hip rotors":
        rotors = [g for g in robot_geoms if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_CYLINDER]
        if not rotors:
            raise ValueError("no hip-rotor cylinders in this robot's scene")
        m.geom_contype[rotors] = 0
        m.geom_conaffinity[rotors] = 0
    elif variant not in ("defaults", "flat ground"):
        raise ValueError(f"unknown variant {variant!r}; allowed: {VARIANTS}")
    env.close()
    return m


def scene_buffers(terrain: str) -> tuple[int, int]:
    """(nconmax, njmax) per world as ``MujocoWarpBackend`` sizes them for this terrain's scene."""
    from quadforge.envs.backends.mujoco_warp import buffers_for, measure_contact_load
    from quadforge.envs.builder import make_env

    env = make_env("go1", terrain, num_envs=1, num_threads=1, backend="mujoco_cpu")
    try:
        return buffers_for(measure_contact_load(env.backend.scene, env.backend.decimation))
    finally:
        env.close()


def run_testspeed(model_path: str, nworld: int, nstep: int, buffers: tuple[int, int],
                  timeout_s: float = 300) -> dict:
    """MuJoCo Warp's testspeed on ``model_path`` with the backend's buffers: its JSON metrics and
    flattened event trace (nanoseconds per world and step: testspeed scales CUDA events' milliseconds by 1e6 / (steps x worlds))."""
    cmd = [sys.executable, "-m", "mujoco_warp.testspeed", model_path, f"--nworld={nworld}", f"--nstep={nstep}",
           f"--nconmax={buffers[0]}", f"--njmax={buffers[1]}",
           "--event_trace=true", "--format=json", "--overflow_behavior=continue"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"mujoco_warp.testspeed failed (rc {out.returncode}): {out.stderr.strip()[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def function_table(records: dict[str, dict], nworld: int) -> Table:
    """ns per world and physics step of each traced function (nested at most ``TRACE_DEPTH`` deep), one
    column per variant, in the trace's order."""
    keys: list[str] = []
    for r in records.values():
        keys += [k for k in r if k not in METRICS and k.count(".") <= TRACE_DEPTH and k not in keys]
    table = Table(f"MuJoCo Warp event trace, {nworld} worlds: ns per world and physics step",
                  ["function", *records])
    for k in keys:
        table.add(k, *(r.get(k, float("nan")) for r in records.values()))
    return table


def _traced_physics_step(backend, nstep: int) -> tuple[float, dict[str, float]]:
    """(ms per physics step, ns per world and physics step of each traced function) of MuJoCo Warp's
    ``step`` on the backend's own Model and Data, one CUDA graph per step as testspeed does, replayed
    ``nstep`` times; the worlds move on from the env's state under their last controls."""
    import warp as wp
    from mujoco_warp._src import warp_util

    mjw, n = backend._mjw, backend.num_envs
    totals: dict[str, float] = {}

    def add(trace: dict, prefix: str = "") -> None:     # keys as testspeed flattens them: a.b[i]
        for name, (times, sub_trace) in trace.items():
            for i, t in enumerate(times):
                key = f"{prefix}{name}" + (f"[{i}]" if len(times) > 1 else "")
                totals[key] = totals.get(key, 0.0) + t
            add(sub_trace, f"{prefix}{name}.")
    with backend._scope(), warp_util.EventTracer(enabled=True) as tracer:
        with wp.ScopedCapture(device=backend.wp_device) as capture:
            mjw.step(backend.m, backend.d)
        elapsed = 0.0
        for _ in range(nstep):
            t0 = time.perf_counter()
            wp.capture_launch(capture.graph)
            wp.synchronize_device(backend.wp_device)
            elapsed += time.perf_counter() - t0
            add(tracer.trace())
    return 1e3 * elapsed / nstep, {k: 1e6 * v / (nstep * n) for k, v in totals.items()}


def decompose(nworld: int, steps: int, trace: bool) -> tuple[Table, dict[str, float]]:
    """Milliseconds per policy step of each layer on the env's own worlds (module doc), and the traced
    physics step's functions (empty without ``trace``)."""
    from quadforge.envs.backends.base import WarpConfig
    from quadforge.envs.builder import make_env
    from quadforge.tools.bench.common import device_sync, rate_per_second

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    env = make_env("go1", "mixed", num_envs=nworld, num_threads=1, backend="mujoco_warp",
                   warp=WarpConfig(device=device, on_overflow="terminate"))
    b = env.backend
    zeros = torch.zeros(nworld, 12, device=env.device)
    for _ in range(50):
        env.step(zeros)
    targets = env.joint_targets.clone()

    def per_step(fn) -> float:
        fn()                          # the first call may capture a graph
        return 1e3 * nworld / rate_per_second(fn, nworld, steps, 1, device_sync)
    rows = {"env step": per_step(lambda: env.step(zeros)),
            "backend step (graph, readout, flags)": per_step(lambda: b.step(targets)),
            "physics graph alone": per_step(b._physics)}
    functions: dict[str, float] = {}
    if trace:
        ms, functions = _traced_physics_step(b, steps * b.decimation)
        rows[f"{b.decimation} x one traced physics step"] = b.decimation * ms
    env.close()
    table = Table(f"mujoco_warp on the env's own worlds, {nworld} worlds, Go1 rough, zero actions after 50 "
                  f"steps: ms per policy step", ["layer", "ms per policy step", "policy steps/s"])
    for name, ms in rows.items():
        table.add(name, ms, 1e3 * nworld / ms)
    return table, functions


def main(quick: bool = False, json_path: str | None = None, num_envs: int | None = None) -> int:
    if num_envs is not None and num_envs < 1:
        raise ValueError(f"bench warp_profile --num-envs {num_envs}: the number of worlds, >= 1 (default 4096)")
    if not torch.cuda.is_available():
        print("bench warp_profile: needs a CUDA GPU (mujoco_warp.testspeed refuses Warp's CPU device); nothing measured")
        return 0
    nworld = num_envs or 4096
    nstep = 100 if quick else 400
    table = Table(f"MuJoCo Warp physics step, Go1 rough scene standing, {nworld} worlds, {nstep} steps "
                  f"(ns per world and physics step; event trace)",
                  ["variant", "buffers con/rows", "physics steps/s", "policy steps/s (4 substeps)", "contacts/world",
                   "rows (largest world)", "Newton its"])
    records = {}
    buffers = {t: scene_buffers(t) for t in ("mixed", "flat")}
    with tempfile.TemporaryDirectory(prefix="quadforge-warp-profile-") as tmp:
        for variant in VARIANTS:
            path = os.path.join(tmp, variant.replace(" ", "_") + ".mjb")
            mujoco.mj_saveModel(standing_scene(variant), path)
            try:
                r = records[variant] = run_testspeed(path, nworld, nstep,
                                                     buffers["flat" if variant == "flat ground" else "mixed"])
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                print(f"  {variant}: {err}", flush=True)
                continue
            rate = r["steps_per_second"]
            b = buffers["flat" if variant == "flat ground" else "mixed"]
            table.add(variant, f"{b[0]}/{b[1]}", rate, rate / 4, r["ncon_mean"], r["nefc_mean"],
                      r["solver_niter_mean"])
            print(f"  {variant}: {rate:,.0f} physics steps/s", flush=True)
    layers, env_functions = decompose(nworld, 20 if quick else 50, trace=True)
    records["env's worlds"] = env_functions
    report("warp_profile", [table, layers, function_table(records, nworld)], json_path,
           {"gpu_name": torch.cuda.get_device_name(0), "records": records, "nworld": nworld, "nstep": nstep})
    return 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv))
