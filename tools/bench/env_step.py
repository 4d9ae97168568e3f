"""`quadforge bench env_step`: where one `LeggedEnv.step` spends its time, beside raw MuJoCo.

The same scenes, robots and thread counts as `bench sim` (its env and raw rollout are reused), timed
interleaved (raw, env, raw, ...). Each env step is split by wrapping its parts with timers:

- backend: `MujocoCpuBackend.step` (physics on the thread pool + readout), CPU time of the process
  (all its threads);
- task: `LocomotionTask.post_step` (statistics, terminations, rewards, gait clock, commands);
- obs: the observation build after the resets (policy and critic groups, height scan);
- during: the env's physics-independent work (noise draw, counters, fresh extras, previous joint
  velocities) that the backend runs on the caller's thread while its workers simulate; part of
  backend, where on two threads its cost is shared with the physics;
- rest: everything else in `step` (action clamp, targets, resets, pushes, episode bookkeeping).

Task, obs and rest are torch math on the caller's thread (one torch thread): they are reported in
that thread's CPU time, which time spent descheduled by other users of the machine does not inflate.
Also reported: raw and env wall time per step and their ratio (the env/raw of `bench sim`), and
torch calls per step (every torch function, operator and tensor method the env calls from Python:
the dispatch count that sets the per-step cost at small N).

A second table times the same env eager and with ``EnvConfig.compile_task`` (the task's score through
``torch.compile``), both interleaved with raw rounds in one run: the task's and its score's CPU time per
step and each env's env/raw (docs/scale.md).

A third table times the env layer (all of ``step`` but the caller's share of the physics) in the real
step and with the physics stubbed out, alternating rounds: a layer timed without MuJoCo running
between its calls costs less than it does in the step, and the ratio says how much.

A fourth table counts the torch calls a GPU dispatches (``envs.fast_paths.torch_references``: the numpy
fast paths off), in steps where no episode ends and in steps where some do (episodes of 1 s, their ends
staggered so that about N/50 envs reset each step). On a GPU every call is a kernel launch and its
Python, and at thousands of worlds some world resets in every step, so the second count, not the math,
sets what the layer above the physics costs there (docs/scale.md).

A fifth table puts the gait expert beside the env it drives, both built as ``quadforge collect`` builds
them (the collection's terrain and commands, 4 s episodes, the expert reset where episodes end): the
aten operations of one ``act`` (all of them, and those that are not views: on a GPU each of those is a
kernel launch), its torch calls from Python, and per control step the wall ms of ``act`` and of
``env.step`` and act's share of the two (median over steps).
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import replace

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# the env and the raw-rollout layer exactly as `bench sim` builds them (team backend's module)
from quadforge.collection.collect import CollectConfig, build_env, build_policy
from quadforge.envs.backends import BACKENDS
from quadforge.envs.fast_paths import torch_references
from quadforge.tools.bench.sim import _make_env, _Raw
from quadforge.tools.bench.common import Table, report, timed_method


class _CountTorchCalls(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


class _CountAtenOps(TorchDispatchMode):
    """Aten operations under the Python API: all of them, and those that are not views (kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.kernels += not func.is_view
        return func(*args, **(kwargs or {}))


def _settled_env(terrain: str, n: int, threads: int, **overrides) -> tuple:
    """(env, zero actions, seconds) after 20 steps that settle its robots from the drop, as bench sim does
    (with ``compile_task`` the seconds include the compile, or loading torch's cache)."""
    env = _make_env(n, threads, terrain, **overrides)
    zeros = torch.zeros(n, env.num_actions)
    t0 = time.perf_counter()
    for _ in range(20):
        env.step(zeros)
    return env, zeros, time.perf_counter() - t0


def _measure(terrain: str, n: int, threads: int, steps: int, rounds: int) -> dict[str, float]:
    env, zeros, _ = _settled_env(terrain, n, threads)
    raw = _Raw(env.backend, threads, steps)
    acc: dict[str, float] = defaultdict(float)
    timed_method(env.backend, "step", acc, "backend", time.process_time)
    timed_method(env.backend, "step", acc, "backend_thread", time.thread_time)  # the caller's share of it
    timed_method(env.task, "post_step", acc, "task", time.thread_time)
    timed_method(env, "_compute_obs", acc, "obs", time.thread_time)
    timed_method(env, "_during_physics", acc, "during", time.thread_time)

    def run_env() -> None:
        for _ in range(steps):
            env.step(zeros)
    samples: dict[str, list[float]] = defaultdict(list)
    run_env()
    raw()
    for _ in range(rounds):
        t0 = time.perf_counter()
        raw()
        samples["raw"].append(time.perf_counter() - t0)
        acc.clear()
        t0, c0 = time.perf_counter(), time.thread_time()
        run_env()
        samples["env"].append(time.perf_counter() - t0)
        samples["env_thread"].append(time.thread_time() - c0)
        for k, v in acc.items():
            samples[k].append(v)
    counter = _CountTorchCalls()
    with counter:
        for _ in range(10):
            env.step(zeros)
    raw.close()
    env.close()
    ms = {k: 1e3 * statistics.median(v) / steps for k, v in samples.items()}
    # the caller thread's CPU time in step, less its share of the backend and the timed parts
    ms["rest"] = ms["env_thread"] - ms["backend_thread"] - ms["task"] - ms["obs"]
    ms.setdefault("during", 0.0)
    ms["env/raw"] = statistics.median(r / e for r, e in zip(samples["raw"], samples["env"]))
    ms["calls"] = counter.calls / 10
    return ms


def compiled_pair(terrain: str, n: int, threads: int, steps: int, rounds: int) -> dict[str, float]:
    """The same env eager and with ``EnvConfig.compile_task``, each round raw, eager, compiled back to back:
    the task's caller-thread CPU ms per step (``post_step``, the score inside it) and env/raw wall of
    each, and the compiled env's first 20 steps in seconds (its compile, or loading torch's cache)."""
    eager, zeros, _ = _settled_env(terrain, n, threads)
    compiled, _, first = _settled_env(terrain, n, threads, compile_task=True)
    envs = {"eager": eager, "compiled": compiled}
    raw = _Raw(eager.backend, threads, steps)
    acc: dict[str, float] = defaultdict(float)
    for label, env in envs.items():
        timed_method(env.task, "post_step", acc, f"task {label}", time.thread_time)
        timed_method(env.task, "_score", acc, f"score {label}", time.thread_time)
    samples: dict[str, list[float]] = defaultdict(list)
    raw()
    for _ in range(rounds):
        acc.clear()
        t0 = time.perf_counter()
        raw()
        samples["raw"].append(time.perf_counter() - t0)
        for label, env in envs.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                env.step(zeros)
            samples[label].append(time.perf_counter() - t0)
        for k, v in acc.items():
            samples[k].append(v)
    raw.close()
    for env in envs.values():
        env.close()
    out = {k: 1e3 * statistics.median(v) / steps for k, v in samples.items() if k.startswith(("task", "score"))}
    for label in envs:
        out[f"env/raw {label}"] = statistics.median(r / e for r, e in zip(samples["raw"], samples[label]))
    out["first_steps_s"] = first
    return out


def layer_in_and_out_of_step(terrain: str, n: int, threads: int, steps: int, rounds: int) -> dict[str, float]:
    """The env layer's caller-thread CPU ms per step (everything in ``step`` but the caller's share of the
    physics) inside the real step and with the physics stubbed out (the backend's step runs only the
    env's ``during`` work and leaves the state as it is: the same standing robots, the same layer
    work), alternating rounds. A layer timed without the physics reads what the step would cost if
    MuJoCo did not run between its calls; the ratio is what running beside the physics adds."""
    env, zeros, _ = _settled_env(terrain, n, threads)
    backend = env.backend
    acc: dict[str, float] = defaultdict(float)
    undo_during = timed_method(env, "_during_physics", acc, "during", time.thread_time)
    finite = torch.zeros(n, dtype=torch.bool)

    def stubbed_step(targets: torch.Tensor, during=None) -> torch.Tensor:
        if during is not None:
            during()
        return finite
    samples: dict[str, list[float]] = defaultdict(list)
    try:
        for _ in range(rounds):
            for label, step in (("in step", backend.step), ("physics stubbed", stubbed_step)):
                backend.step = step
                undo = timed_method(backend, "step", acc, "backend", time.thread_time)
                env.step(zeros)   # one untimed step after the switch
                acc.clear()
                c0 = time.thread_time()
                for _ in range(steps):
                    env.step(zeros)
                layer = time.thread_time() - c0 - (acc["backend"] - acc["during"])
                samples[label].append(1e3 * layer / steps)
                undo()
                del backend.step   # the class's method again
    finally:
        backend.__dict__.pop("step", None)
        undo_during()
        env.close()
    out = {k: statistics.median(v) for k, v in samples.items()}
    out["ratio"] = statistics.median(a / b for a, b in zip(samples["in step"], samples["physics stubbed"]))
    return out


def gpu_calls(terrain: str, n: int, steps: int = 100, backend: str = "mujoco_cpu") -> dict[str, float]:
    """Torch calls per env step on the torch references (as on a GPU): steps without episode ends and
    steps with some (1 s episodes, ends staggered over the envs), and the envs reset per such step.
    ``backend`` ``mujoco_warp`` runs on its default device (Warp's CPU device without a GPU): its calls
    are the same on either."""
    env = _make_env(n, 1, terrain, episode_length_s=1.0, backend_name=backend)
    zeros = torch.zeros(n, env.num_actions)
    calls: dict[bool, list[int]] = {False: [], True: []}
    resets: list[int] = []
    with torch_references():
        # the first half episode: every episode just began, none ends (robots standing); then the ends staggered
        for t in range(env.max_episode_length // 2 + steps):
            if t == env.max_episode_length // 2:
                env.episode_length_buf.copy_(torch.arange(n) * env.max_episode_length // n)
            counter = _CountTorchCalls()
            with counter:
                _, _, dones, _ = env.step(zeros)
            k = int(dones.sum())
            calls[k > 0].append(counter.calls)
            if k:
                resets.append(k)
    env.close()
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    return {"without": med(calls[False]), "with": med(calls[True]), "resets": med(resets),
            "steps_with": len(calls[True]), "steps": len(calls[False]) + len(calls[True])}


def expert_act(terrain: str, n: int, steps: int, compiled_twin: bool = True) -> dict[str, float]:
    """The gait expert driving the env, both as ``quadforge collect`` builds them: ops and calls of one
    ``act``, wall ms of ``act`` and of ``env.step`` per control step and act's share (medians over steps).
    Beside it a second expert built with ``--compile-expert`` acts on the same states (its actions are
    not applied): its ms per act and the seconds of its first act (the compile, or loading torch's cache);
    NaN without a C++ compiler or ``compiled_twin``."""
    cfg = CollectConfig(out="", episodes=1, terrain=terrain, num_envs=n, max_episode_s=4.0, seed=0)
    env = build_env(cfg, 0)
    policy = build_policy(cfg, env)
    compiled = None
    if compiled_twin:
        try:
            compiled = build_policy(replace(cfg, compile_expert=True), env)
        except RuntimeError:   # no C++ compiler: the eager columns only
            pass
    experts = [p for p in (policy, compiled) if p is not None]
    for p in experts:
        p.reset(torch.arange(n))
    act_s, step_s, compiled_s, first_s = [], [], [], float("nan")
    for t in range(20 + steps):   # the first 20 settle the drop
        t0 = time.perf_counter()
        actions = policy.act(env.terms)
        t1 = time.perf_counter()
        if compiled is not None:
            compiled.act(env.terms)
        t2 = time.perf_counter()
        _, _, dones, _ = env.step(actions)
        t3 = time.perf_counter()
        ended = dones.nonzero().flatten()
        if len(ended):
            for p in experts:
                p.reset(ended)
        if t == 0:
            first_s = t2 - t1 if compiled is not None else float("nan")
        if t >= 20:
            act_s.append(t1 - t0)
            compiled_s.append(t2 - t1)
            step_s.append(t3 - t2)
    aten, calls = _CountAtenOps(), _CountTorchCalls()
    with calls, aten:
        policy.act(env.terms)
    env.close()
    compiled_ms = 1e3 * statistics.median(compiled_s) if compiled is not None else float("nan")
    return {"aten ops": aten.ops, "kernels": aten.kernels, "torch calls": calls.calls,
            "act ms": 1e3 * statistics.median(act_s), "step ms": 1e3 * statistics.median(step_s),
            "act share": statistics.median(a / (a + b) for a, b in zip(act_s, step_s)),
            "compiled act ms": compiled_ms, "compiled first act s": first_s}


def main(quick: bool = False, json_path: str | None = None) -> int:
    torch.set_num_threads(1)
    work = 512 if quick else 2048
    rounds = 3 if quick else 5
    table = Table("env_step: ms per env step (median over rounds), decimation 4; raw and env wall time, "
                  "backend process CPU, during/task/obs/rest caller-thread CPU",
                  ["terrain", "envs", "threads", "raw", "env", "backend", "during", "task", "obs", "rest",
                   "task+obs+rest", "torch calls/step", "env/raw"])
    compiled = Table("env_step: the task eager and with EnvConfig.compile_task (its score through torch.compile), "
                     "interleaved with raw rounds; caller-thread CPU ms per step of the task (post_step) and of the "
                     "score in it; first 20 steps s of the compiled env (its compile, or loading torch's cache)",
                     ["terrain", "envs", "threads", "task eager", "task compiled", "score eager", "score compiled",
                      "task compiled/eager", "env/raw eager", "env/raw compiled", "first 20 steps s"])
    for terrain in ("flat", "mixed"):
        for n in ((64,) if quick else (16, 64, 256)):
            r = _measure(terrain, n, 2, max(4, work // n), rounds)
            table.add(terrain, n, 2, r["raw"], r["env"], r["backend"], r["during"], r["task"], r["obs"], r["rest"],
                      r["task"] + r["obs"] + r["rest"], r["calls"], r["env/raw"])
            c = compiled_pair(terrain, n, 2, max(4, work // n), rounds)
            compiled.add(terrain, n, 2, c["task eager"], c["task compiled"], c["score eager"], c["score compiled"],
                         c["task compiled"] / c["task eager"], c["env/raw eager"], c["env/raw compiled"],
                         c["first_steps_s"])
    calls = Table("env_step: torch calls per env step as a GPU dispatches them (numpy fast paths off), "
                  "median over steps without and with episode ends; every installed backend (mujoco_warp "
                  "on its default device, a CUDA GPU else Warp's CPU device; 64 envs: the count does not "
                  "depend on N)",
                  ["backend", "terrain", "envs", "steps without ends", "steps with ends",
                   "envs reset per such step", "steps with ends / all"])
    beside = Table("env_step: the env layer's caller-thread CPU ms per step (all of step but the caller's share of "
                   "the physics) inside the real step and with the physics stubbed out (the same standing "
                   "robots), alternating rounds", ["terrain", "envs", "threads", "layer in the step",
                                                   "layer, physics stubbed", "in step / stubbed"])
    for terrain in ("flat", "mixed"):
        for n in ((64,) if quick else (64, 256)):
            r = layer_in_and_out_of_step(terrain, n, 2, max(4, work // n), rounds + 2)
            beside.add(terrain, n, 2, r["in step"], r["physics stubbed"], r["ratio"])
    for backend in (b.name for b in BACKENDS.values() if b.installed()):
        for terrain in ("flat", "mixed"):
            for n in ((64,) if quick or backend != "mujoco_cpu" else (64, 256)):
                c = gpu_calls(terrain, n, backend=backend)
                calls.add(backend, terrain, n, c["without"], c["with"], c["resets"], f"{c['steps_with']}/{c['steps']}")
    expert = Table("env_step: the gait expert driving the env as `quadforge collect` builds both (its default: 1 physics thread): "
                   "aten ops of one act (all, and not views: a GPU's kernel launches), its torch calls, and per "
                   "control step wall ms of act and of env.step and act's share (medians); a --compile-expert "
                   "twin acting on the same states: its ms per act and its first act's s (the compile)",
                   ["terrain", "envs", "aten ops/act", "non-view ops/act", "torch calls/act", "act ms",
                    "env.step ms", "act share", "compiled act ms", "compiled/eager", "compiled first act s"])
    for terrain in ("flat", "mixed"):
        for n in ((16,) if quick else (16, 64, 256)):
            e = expert_act(terrain, n, max(20, work // n))
            expert.add(terrain, n, e["aten ops"], e["kernels"], e["torch calls"], e["act ms"], e["step ms"],
                       e["act share"], e["compiled act ms"], e["compiled act ms"] / e["act ms"],
                       e["compiled first act s"])
    report("env_step", [table, compiled, beside, calls, expert], json_path, extra={"quick": quick})
    return 0
