"""`quadforge bench sim`: policy steps/s of the env and the backend against raw MuJoCo, in one run.

Three layers on the same compiled scene, the same decimation and the same thread count, measured
interleaved (raw, backend, env, raw, ...) so that load from other users of the machine hits them alike:

- raw: ``mujoco.rollout`` (C thread pool, no Python per env) from the envs' states, nstep = steps x
  decimation, the standing targets as constant control;
- backend: ``MujocoCpuBackend.step`` with the standing targets (physics + batched readout); its first
  substeps skip MuJoCo's sensors, whose values nobody reads (``envs.backends.common.without_sensors``);
- backend, all sensors: the same with every substep computing them (``sensors_every_substep``), as raw
  does: the gain of skipping them, measured in the same rounds;
- env: ``envs.vec_env.LeggedEnv.step`` with zero actions (= the standing targets), domain
  randomization off, robots spawned standing (the full task: observations, rewards, terminations,
  resets). With the env, the backend row steps the env's own backend and raw starts from its robots.

Reported: policy steps/s (env steps x N per second, median over rounds of wall time) and the ratios
backend/raw and env/raw (the median over rounds of each round's ratio, which cancels load that drifts
between rounds), from wall time and from the process's CPU time (all threads), which time spent
descheduled by other users of the machine does not inflate.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import mujoco
import numpy as np
import torch
from mujoco import rollout

from quadforge.envs.backends.base import BackendConfig
from quadforge.envs.backends.mujoco_cpu import MujocoCpuBackend
from quadforge.envs.builder import make_env
from quadforge.envs.config import InitConfig, RandomizationConfig
from quadforge.envs.terrain import terrain_config
from quadforge.tools.bench.common import Table, report

STATE_SPEC = mujoco.mjtState.mjSTATE_FULLPHYSICS


def _terrain_config(name: str):
    """flat (a plane) or mixed (legged_gym's mix): the one terrain-spec parser."""
    return terrain_config(name)


def _make_env(num_envs: int, threads: int, terrain: str, **overrides):
    # robots spawn standing still in the default pose, as the backend-only rows do
    return make_env("go1", terrain, num_envs=num_envs, num_threads=threads,
                    overrides={"randomization": RandomizationConfig.off(),
                               "init": InitConfig(joint_pos_scale=(1.0, 1.0), root_vel=0.0), **overrides})


class _Raw:
    """mujoco.rollout over the backend's model from its envs' current states."""

    def __init__(self, backend: MujocoCpuBackend, threads: int, steps: int):
        m = backend.models[0]
        n = backend.num_envs
        self.model, self.nstep = m, steps * backend.decimation
        self.state0 = np.empty((n, mujoco.mj_stateSize(m, STATE_SPEC)))
        for i, d in enumerate(backend.datas):
            mujoco.mj_getState(m, d, self.state0[i], STATE_SPEC)
        ctrl = np.asarray(backend.robot.default_joint_pos, dtype=np.float64)
        self.control = np.broadcast_to(ctrl, (n, self.nstep, m.nu)).copy()
        self.datas = [mujoco.MjData(m) for _ in range(threads)]
        self.out_state = np.empty((n, self.nstep, self.state0.shape[1]))
        self.out_sens = np.empty((n, self.nstep, m.nsensordata))
        self.runner = rollout.Rollout(nthread=threads)

    def __call__(self) -> None:
        self.runner.rollout(self.model, self.datas, self.state0, self.control, state=self.out_state,
                            sensordata=self.out_sens)

    def close(self) -> None:
        self.runner.close()


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process, every thread included) of one call."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _measure(terrain: str, n: int, threads: int, steps: int, rounds: int, with_env: bool) -> dict:
    """All layers step the same scene and robots: with the env, its own backend is the backend row and
    raw starts from its robots' states, so every layer simulates the same physics."""
    tcfg = _terrain_config(terrain)
    env, env_note = None, ""
    if with_env:
        try:
            env = _make_env(n, threads, terrain)
        except Exception as err:  # the env layer belongs to another team: report, do not crash
            env_note = f"env unavailable: {type(err).__name__}: {err}"
    backend = env.backend if env is not None else \
        MujocoCpuBackend(BackendConfig(num_envs=n, num_threads=threads, terrain=tcfg))
    targets = torch.tensor(backend.robot.default_joint_pos, dtype=torch.float32).repeat(n, 1)
    for _ in range(20):  # settle from the drop onto the ground
        backend.step(targets)
    raw = _Raw(backend, threads, steps)
    layers: dict[str, Callable[[], None]] = {"raw": raw}

    def run_backend(every_substep: bool = False) -> None:
        backend.sensors_every_substep = every_substep
        for _ in range(steps):
            backend.step(targets)
        backend.sensors_every_substep = False
    layers["backend"] = run_backend
    layers["backend, all sensors"] = lambda: run_backend(every_substep=True)
    if env is not None:
        zeros = torch.zeros(n, env.num_actions)

        def run_env() -> None:
            for _ in range(steps):
                env.step(zeros)
        layers["env"] = run_env

    samples: dict[str, list[float]] = {k: [] for k in layers}
    cpu: dict[str, list[float]] = {k: [] for k in layers}
    for fn in layers.values():  # warm-up: thread pools, caches, first-call allocations
        fn()
    for _ in range(rounds):
        for name, fn in layers.items():
            wall, cpu_s = _timed(fn)
            samples[name].append(wall)
            cpu[name].append(cpu_s)
    raw.close()
    (env if env is not None else backend).close()
    rate = {k: n * steps / statistics.median(v) for k, v in samples.items()}
    # ratios from the same round (raw and the layer ran back to back), then the median over rounds
    ratio = {k: statistics.median(r / t for r, t in zip(samples["raw"], v)) for k, v in samples.items()}
    # CPU seconds are not inflated by time spent descheduled: the steadier ratio on a loaded machine
    ratio_cpu = {k: statistics.median(r / t for r, t in zip(cpu["raw"], v)) for k, v in cpu.items()}
    return {"rate": rate, "ratio": ratio, "ratio_cpu": ratio_cpu, "note": env_note}


def main(quick: bool = False, json_path: str | None = None) -> int:
    torch.set_num_threads(1)
    sizes = (16, 64, 256)
    work = 512 if quick else 4096           # env-steps x envs per timed call
    rounds = 5 if quick else 7
    table = Table("sim: policy steps/s (N envs x env steps per second), decimation 4",
                  ["terrain", "envs", "threads", "raw mujoco", "backend", "env", "backend/raw", "env/raw",
                   "backend/raw cpu", "env/raw cpu", "backend all sensors/raw"])
    notes: list[str] = []
    for terrain in ("flat", "mixed"):
        for n in sizes:
            for threads in (1, 2):
                steps = max(4, work // n)
                try:
                    r = _measure(terrain, n, threads, steps, rounds, with_env=True)
                except (ImportError, NotImplementedError) as err:
                    notes.append(f"{terrain}: skipped ({type(err).__name__}: {err})")
                    break
                rate = r["rate"]
                if r["note"] and r["note"] not in notes:
                    notes.append(r["note"])
                ratio, ratio_cpu, nan = r["ratio"], r["ratio_cpu"], float("nan")
                table.add(terrain, n, threads, rate["raw"], rate["backend"], rate.get("env", nan),
                          ratio["backend"], ratio.get("env", nan), ratio_cpu["backend"], ratio_cpu.get("env", nan),
                          ratio["backend, all sensors"])
            else:
                continue
            break
    for note in notes:
        print(note)
    report("sim", [table], json_path, extra={"notes": notes, "quick": quick})
    return 0
