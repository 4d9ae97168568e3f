"""`quadforge eval-tracking`: velocity tracking and fall rate of an expert per terrain type, the
measurement behind MODEL_CARD.md.

    quadforge eval-tracking --policy PATH|gait [--level L] [--envs-per-type K] [--json OUT] [env.KEY=VALUE ...]

One ``LeggedEnv`` with a plane row (``flat`` plane) or a tile grid of every terrain type, the curriculum
off and every env pinned to (level L, a column of its type); the policy runs through
``collection.rollout.Rollout`` (the loop collection and evaluation share) for one episode length, and
each env's *first* episode is scored (taking later ones would over-count early failures, which restart
sooner). Commands come from the training distribution: the env defaults (joystick, heading mode, legged_gym
ranges) with the ``env.*`` overrides the checkpoint records (or those given on the command line);
physics randomization is on as in training. Per terrain: the env's episode numbers ``lin_vel_error``
(mean |v_xy - cmd_xy|, m/s), ``lin_vel_x_error``, ``ang_vel_error`` (rad/s), the fall rate (episodes ended
by ``fall``, ``base_collision`` or ``non_finite``; ``base_collision_rate`` is the base-contact share of it),
mean length and distance.
"""
from __future__ import annotations

import argparse
import ast
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quadforge.cli_flags import add_json, add_num_threads, add_seed, write_json
from quadforge.envs.robots import add_robot
from quadforge.envs.backends import add_backend_arguments, backend_from_args
from quadforge.evaluation.reports import markdown_table
from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.envs.builder import make_env, make_env_config
from quadforge.envs.terrain import TERRAIN_TYPES
from quadforge.experts.registry import check_policy_spec, policy_for_env, spec_help
from quadforge.overrides import parse_overrides

FAILURES = ("fall", "base_collision", "non_finite")


def _policy(spec: str, env: Any):
    return policy_for_env(spec, env)


def training_overrides(policy_spec: str) -> dict[str, Any]:
    """The ``env.*`` overrides a ``quadforge train-expert`` checkpoint was trained with (its task)."""
    path = Path(policy_spec)
    if policy_spec == "gait" or not path.is_file():
        return {}
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return {}
    meta = (raw.get("infos") or {}).get("quadforge") if isinstance(raw, dict) else None
    if not meta:
        return {}
    return {k: ast.literal_eval(v) for k, v in meta.get("overrides", {}).items() if k.startswith("env.")}


def _env(terrain: str, num_envs: int, robot: str, seed: int, episode_s: float, num_threads: int,
         overrides: dict[str, Any], backend: tuple[str, Any] = ("mujoco_cpu", None)):
    """A plane row (``plane``) or a grid with one column per terrain type; curriculum off."""
    env_overrides = {k[len("env."):]: v for k, v in overrides.items() if k.startswith("env.")}
    spec = "flat" if terrain == "plane" else ",".join(TERRAIN_TYPES)
    return make_env(robot, spec, num_envs=num_envs, seed=seed, num_threads=num_threads,
                    backend=backend[0], warp=backend[1], one_column_per_type=terrain != "plane",
                    overrides={"curriculum": False, "episode_length_s": episode_s, **env_overrides})


def _first_episodes(env: Any, policy: Any) -> list[dict[str, Any]]:
    rollout = Rollout(env, policy, RolloutConfig(record=False))
    first: dict[int, dict[str, Any]] = {}
    for ep in rollout.episodes(max_steps=int(env.max_episode_length)):
        first.setdefault(ep.info["env_id"], ep.info)
    return [first[i] for i in sorted(first)]


def _summary(infos: list[dict[str, Any]], dt: float) -> dict[str, float]:
    mean = lambda k: float(np.mean([float(i[k]) for i in infos]))  # noqa: E731
    return {"episodes": len(infos), "lin_vel_error": mean("lin_vel_error"), "lin_vel_x_error": mean("lin_vel_x_error"),
            "ang_vel_error": mean("ang_vel_error"),
            "fall_rate": float(np.mean([i["termination_reason"] in FAILURES for i in infos])),
            "base_collision_rate": float(np.mean([i["termination_reason"] == "base_collision" for i in infos])),
            "mean_length_s": mean("length") * dt, "mean_distance_m": mean("distance")}


def evaluate(policy_spec: str, robot: str = "go1", level: int = 0, envs_per_type: int = 16, seed: int = 0,
             episode_s: float = 10.0, num_threads: int = 1,
             overrides: dict[str, Any] | None = None,
             backend: tuple[str, Any] = ("mujoco_cpu", None)) -> dict[str, dict[str, float]]:
    """{terrain: summary}: "plane" plus every terrain type at ``level``. ``overrides``: ``env.*`` settings
    (default: the ones the checkpoint was trained with, e.g. its command ranges); ``backend``: (name,
    WarpConfig or None) of the physics backend."""
    overrides = training_overrides(policy_spec) if overrides is None else overrides
    env_overrides = {k[len("env."):]: v for k, v in overrides.items() if k.startswith("env.")}
    levels = make_env_config(robot, ",".join(TERRAIN_TYPES), one_column_per_type=True,
                             overrides=env_overrides).terrain.num_levels
    if not (isinstance(level, int) and 0 <= level < levels):   # before the first rollout, naming the flag
        raise ValueError(f"--level={level!r} is invalid; allowed: an integer in [0, {levels - 1}] (the grid's levels)")

    results: dict[str, dict[str, float]] = {}
    env = _env("plane", envs_per_type, robot, seed, episode_s, num_threads, overrides, backend)
    try:
        results["plane"] = _summary(_first_episodes(env, _policy(policy_spec, env)), env.dt)
    finally:
        env.close()
    n = envs_per_type * len(TERRAIN_TYPES)
    env = _env("grid", n, robot, seed, episode_s, num_threads, overrides, backend)
    try:
        col_types = env.terrain.col_type_idx.cpu()
        type_of_env = torch.arange(n) // envs_per_type           # env i runs type i // k
        cols = torch.stack([(col_types == env.terrain_types.index(TERRAIN_TYPES[t])).nonzero()[0, 0]
                            for t in type_of_env.tolist()])
        env.set_terrain_levels(torch.arange(n), torch.full((n,), level), cols)
        infos = _first_episodes(env, _policy(policy_spec, env))
        for t, name in enumerate(TERRAIN_TYPES):
            results[name] = _summary([i for i in infos if i["env_id"] // envs_per_type == t], env.dt)
    finally:
        env.close()
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", required=True, help=spec_help())
    add_robot(p)
    p.add_argument("--level", type=int, default=0, help="terrain difficulty level (0 easiest)")
    p.add_argument("--envs-per-type", type=int, default=16, help="envs (= scored episodes) per terrain type")
    p.add_argument("--episode-s", type=float, default=10.0, help="episode length, s")
    add_seed(p)
    add_num_threads(p)
    add_json(p, "the results")
    add_backend_arguments(p)
    p.add_argument("overrides", nargs="*", metavar="env.KEY=VALUE",
                   help="env settings, over those the checkpoint was trained with")


def run(args: argparse.Namespace) -> int:
    check_policy_spec(args.policy)   # a bad spec fails before any env is built
    if args.envs_per_type < 1:
        raise ValueError(f"--envs-per-type {args.envs_per_type}: give the scored episodes per terrain type, >= 1")
    if not args.episode_s > 0:
        raise ValueError(f"--episode-s {args.episode_s}: give the episode length in seconds, > 0")
    given = parse_overrides(args.overrides)
    stray = sorted(k for k in given if not k.startswith("env."))
    if stray:   # only env settings reach the env: anything else would be dropped without a word
        raise ValueError(f"override {', '.join(stray)}: eval-tracking takes env settings only, as env.KEY=VALUE "
                         f"(e.g. env.episode_length_s=5)")
    torch.set_num_threads(1)
    t0 = time.time()
    # the checkpoint's own task (its command ranges, ...) stays; what is given replaces its keys only
    overrides = {**training_overrides(args.policy), **given}
    print(f"env overrides: {overrides}")
    res = evaluate(args.policy, args.robot, args.level, args.envs_per_type, args.seed, args.episode_s,
                   num_threads=args.num_threads, overrides=overrides, backend=backend_from_args(args))
    columns = list(next(iter(res.values())))
    print(f"### {args.policy} on {args.robot}, level {args.level}\n")
    print(markdown_table(["terrain"] + columns, [[name, *row.values()] for name, row in res.items()]))
    print(f"\n({time.time() - t0:.0f} s wall)")
    write_json(args.json, {"policy": args.policy, "args": vars(args),
                           "env_overrides": {k: repr(v) for k, v in overrides.items()}, "results": res})
    return 0
