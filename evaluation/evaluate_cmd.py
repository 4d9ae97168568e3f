"""`quadforge eval`: the command line of the evaluation job (``evaluation.evaluate``).

Flags follow docs/cli.md; ``eval-expert`` (``evaluation.evaluate_expert``) reuses them.
"""
from __future__ import annotations

import argparse

from quadforge.cli_flags import add_num_envs, add_num_threads, add_seed, deprecated
from quadforge.envs.robots import add_robot
from quadforge.evaluation.evaluate import EvalConfig, evaluate, replace_earlier_report, write_outputs
from quadforge.evaluation.reports import cells_table
from quadforge.envs.backends import add_backend_arguments, backend_from_args
from quadforge.envs.builder import get_task
from quadforge.experts.registry import spec_help


# the flags of the QUARD evaluation and their defaults (the terrain sweep refuses any other value)
TASK_DEFAULTS = {"task": "locomotion", "colours": "train,held_out", "instructions": "original"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = EvalConfig()
    p.add_argument("--policy", default=None, help=spec_help() + f" (default: {d.policy}; on --task quard:... "
                   "the task's own, quard_expert)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory: eval.json, report.md, PNG plots")
    add_robot(p, d.robot)
    p.add_argument("--terrain", default=d.terrain, help="'mixed' (every type) or a comma list of terrain types, "
                   "one grid column each")
    p.add_argument("--levels", default=d.levels, help="levels to evaluate: '0-3', '0,2,5' or '4'")
    p.add_argument("--num-levels", type=int, default=d.num_levels, help="rows of the terrain grid (difficulty scale)")
    p.add_argument("--episodes-per-cell", type=int, default=d.episodes, dest="episodes",
                   help="episodes per terrain type x level x command set")
    deprecated(p, "--episodes", "--episodes-per-cell", "episodes", type=int)
    p.add_argument("--commands", action="append", default=None,
                   help="command set: a skill or a skill mix (repeatable; default: walking)")
    add_num_envs(p, d.num_envs)
    add_seed(p, d.seed)
    p.add_argument("--max-episode-s", type=float, default=d.max_episode_s, help="episode time limit, s")
    add_num_threads(p, d.num_threads)
    p.add_argument("--video", action="store_true", help="also render a short GIF of env 0 (MUJOCO_GL=egl)")
    p.add_argument("--allow-robot-mismatch", action="store_true",
                   help="evaluate a checkpoint on --robot although it was trained for another robot")
    p.add_argument("--task", default=TASK_DEFAULTS["task"],
                   help="locomotion (the terrain sweep), or a QUARD task quard:<family> | quard:all: success, failure "
                        "reasons, time to success, path length, obstacle contacts per family (--policy quard_expert "
                        "or a VLA checkpoint; --episodes-per-cell is then per family and colour set)")
    p.add_argument("--colours", default=TASK_DEFAULTS["colours"],
                   help="with --task quard:...: colour sets to evaluate, comma list of train, held_out, all")
    p.add_argument("--instructions", default=TASK_DEFAULTS["instructions"],
                   help="with --task quard:...: instruction sets to evaluate, comma list of original, swapped "
                        "(swapped: the same scenes with the instruction naming the other object; its success is "
                        "the instruction-following rate, its wrong-target rate going to the originally named one)")
    add_backend_arguments(p)


# flags of the terrain sweep that a QUARD task has no use for (its scenes, arena and time limits are its own)
LOCOMOTION_ONLY = ("terrain", "levels", "num_levels", "commands", "max_episode_s", "video")


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """Which of these flags were set to something other than their default (an unused flag is refused, not
    dropped without a word)."""
    d = EvalConfig()
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n, None) not in (None, False, getattr(d, n, None))]


def run_task(args: argparse.Namespace) -> int:
    """``--task quard:...``: the QUARD evaluation (evaluation.evaluate_task)."""
    from quadforge.evaluation.evaluate_task import TaskEvalConfig, evaluate_task, write_task_outputs
    unused = _given(args, LOCOMOTION_ONLY)
    if unused:
        raise ValueError(f"{', '.join(unused)}: the terrain sweep's flags; --task {args.task} draws its own scenes "
                         f"and time limits (leave them out)")
    policy = args.policy or get_task(args.task).default_policy
    cfg = TaskEvalConfig(task=args.task, policy=policy, out=args.out, robot=args.robot,
                         colours=tuple(c.strip() for c in args.colours.split(",") if c.strip()),
                         instructions=tuple(c.strip() for c in args.instructions.split(",") if c.strip()),
                         episodes=args.episodes, num_envs=args.num_envs, seed=args.seed,
                         num_threads=args.num_threads, allow_robot_mismatch=args.allow_robot_mismatch,
                         **dict(zip(("backend", "warp"), backend_from_args(args)))).validate()
    replace_earlier_report(cfg.out)
    paths = write_task_outputs(evaluate_task(cfg), cfg.out)
    print(f"report: {paths['report']}  json: {paths['json']}")
    return 0


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    return EvalConfig(policy=getattr(args, "policy", None) or EvalConfig().policy, out=args.out, robot=args.robot, terrain=args.terrain, levels=args.levels,
                      num_levels=args.num_levels, episodes=args.episodes, commands=args.commands or ["walking"],
                      num_envs=args.num_envs, seed=args.seed, max_episode_s=args.max_episode_s,
                      num_threads=args.num_threads, video=args.video,
                      allow_robot_mismatch=args.allow_robot_mismatch,
                      **dict(zip(("backend", "warp"), backend_from_args(args))))


def run(args: argparse.Namespace) -> int:
    if args.task != TASK_DEFAULTS["task"]:
        return run_task(args)
    if args.instructions != TASK_DEFAULTS["instructions"]:
        raise ValueError(f"--instructions {args.instructions}: instruction sets apply to --task quard:... only")
    if args.colours != TASK_DEFAULTS["colours"]:
        raise ValueError(f"--colours {args.colours}: colour sets apply to --task quard:... only")
    cfg = config_from_args(args).validate()
    replace_earlier_report(cfg.out)
    result = evaluate(cfg)
    paths = write_outputs(result, cfg.out)
    print(cells_table([result]))
    print(f"report: {paths['report']}  json: {paths['json']}")
    return 0
