"""`quadforge collect`: the command line of the collection job (``collection.collect``).

``--workers K`` hands the job to K Ray actors (``collection.distributed``; Ray is imported only then).
"""
from __future__ import annotations

import argparse
import json
import sys

from quadforge.collection.collect import CollectConfig, collect_tasks, run_local
from quadforge.data.staging import list_staged
from quadforge.errors import Interrupted
from quadforge.cli_flags import add_num_envs, add_num_threads, add_seed, add_store, require
from quadforge.envs.robots import add_robot
from quadforge.envs.backends import add_backend_arguments, backend_from_args
from quadforge.envs.terrain import TERRAIN_SPEC_HELP
from quadforge.experts.registry import spec_help


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = CollectConfig(out="", episodes=0)
    add_store(p, "written to (created if missing)", old="--out")
    p.add_argument("--episodes", type=int, required=True, help="target number of episodes in the store (a total)")
    p.add_argument("--policy", default=d.policy,
                   help=f"{spec_help()} (default: the task's - gait for locomotion, quard_expert for quard:*)")
    add_robot(p, d.robot)
    p.add_argument("--terrain", default=d.terrain, help=TERRAIN_SPEC_HELP)
    p.add_argument("--skills", default=d.skills,
                   help="'all' or a weighted mix, e.g. walking=0.5,running=0.2,turning=0.3")
    add_num_envs(p, d.num_envs, "envs per collector")
    add_seed(p, d.seed)
    p.add_argument("--workers", type=int, default=d.workers, help="Ray actors (0: collect in this process)")
    p.add_argument("--address", default=d.address, help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--action-noise", type=float, default=d.action_noise,
                   help="std of Gaussian noise added to the normalised actions (sub-optimal data)")
    p.add_argument("--push", type=float, default=d.push, help="max random push velocity, m/s (0: none)")
    p.add_argument("--push-interval-s", type=float, default=d.push_interval_s, help="seconds between pushes")
    p.add_argument("--max-episode-s", type=float, default=d.max_episode_s, help="episode time limit, s")
    p.add_argument("--task", default=d.task, help=" | ".join(collect_tasks()))
    p.add_argument("--frame-stride", type=int, default=d.frame_stride,
                   help="control steps per recorded camera frame (10: 5 Hz at 50 Hz control); a multiple of the "
                        "task camera's own stride (10 on the QUARD tasks)")
    p.add_argument("--no-images", action="store_true",
                   help="camera tasks (quard:*): no camera - proprioception, commands, instructions and task terms only")
    p.add_argument("--counterfactual", type=float, default=d.counterfactual, metavar="R",
                   help="quard:* tasks: share of scenes also recorded with the instruction naming the other "
                        "candidate (same scene, same first frame; the expert's demonstration for it). 0: off, "
                        "1: every scene for both candidates; the --episodes total counts both (docs/collection.md)")
    p.add_argument("--collector-id", default=d.collector_id, help="prefix of episode ids written by this run")
    p.add_argument("--compact-every", type=int, default=d.compact_every,
                   help=f"compact the store every N new episodes (default {d.compact_every}; 0: not by count)")
    p.add_argument("--compact-every-s", type=float, default=d.compact_every_s, metavar="SECONDS",
                   help=f"... or every SECONDS, whichever comes first (default {d.compact_every_s:g}; 0: not by "
                        "time), so a collection stopped early leaves a readable store; never sooner after a "
                        "compaction than 9x its duration (compaction, whose cost grows with the store, stays "
                        "within a tenth of the time)")
    add_num_threads(p, d.num_threads, "physics threads per collector")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--relabel", default=d.relabel,
                   help="a policy spec, e.g. 'gait': --policy drives, this policy labels every visited state "
                        "(DAgger data: actions = its label, applied_actions = what --policy applied)")
    p.add_argument("--expert-drive-prob", type=float, default=d.expert_drive_prob,
                   help="with --relabel: share of episodes the labeller drives itself (DAgger's beta)")
    p.add_argument("--allow-robot-mismatch", action="store_true",
                   help="drive --robot with a checkpoint trained for another robot (refused otherwise)")
    p.add_argument("--compile-task", action="store_true",
                   help="the env's per-step task score (rewards, terminations) through torch.compile: fewer, fused "
                        "kernels; labels equal to the eager env's within float rounding; the first step compiles "
                        "(docs/scale.md)")
    p.add_argument("--compile-expert", action="store_true",
                   help="the gait expert's control law through torch.compile: a few fused kernels instead of ~420 "
                        "a step; actions equal to the eager expert's to ~1e-3, not bit for bit; the first step "
                        "compiles (docs/experts.md)")
    add_backend_arguments(p)


def config_from_args(args: argparse.Namespace) -> CollectConfig:
    return CollectConfig(
        out=require(args, "store", "--store"), episodes=args.episodes, policy=args.policy, robot=args.robot, terrain=args.terrain,
        skills=args.skills, num_envs=args.num_envs, seed=args.seed, workers=args.workers,
        address=args.address, action_noise=args.action_noise, push=args.push,
        push_interval_s=args.push_interval_s, max_episode_s=args.max_episode_s, task=args.task,
        frame_stride=args.frame_stride, images=not args.no_images,
        collector_id=args.collector_id, compact_every=args.compact_every, compact_every_s=args.compact_every_s,
        num_threads=args.num_threads,
        progress=not args.no_progress, allow_robot_mismatch=args.allow_robot_mismatch, relabel=args.relabel,
        expert_drive_prob=args.expert_drive_prob, counterfactual=args.counterfactual,
        compile_task=args.compile_task, compile_expert=args.compile_expert,
        **dict(zip(("backend", "warp"), backend_from_args(args))),
    ).validate()


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    compiled = [flag for flag, on in (("--compile-task", cfg.compile_task), ("--compile-expert", cfg.compile_expert)) if on]
    if compiled:   # else a silent first minute: the first control step compiles
        print(f"collect: {' and '.join(compiled)}: the first control step compiles (~15-35 s on 2 cores from an "
              f"empty torch.compile cache, a few s from a warm one)", file=sys.stderr, flush=True)
    try:
        if cfg.workers:
            from quadforge.collection.distributed import run_distributed
            summary = run_distributed(cfg)
        else:
            summary = run_local(cfg)
    except KeyboardInterrupt:
        raise Interrupted(interrupted_note(cfg.out)) from None
    print(json.dumps(summary, indent=None, default=float))
    if summary["in_store"] < cfg.episodes:   # episodes quarantined, and collecting again did not replace them
        print(f"quadforge collect: {cfg.out} holds {summary['in_store']} of the {cfg.episodes} episodes asked for: "
              f"{len(summary.get('quarantined', []))} staged file(s) could not be merged (the reasons are in "
              f"{cfg.out}/quarantine/*.reason.txt)", file=sys.stderr)
        return 1
    return 0


def interrupted_note(store: str) -> str:
    """What a Ctrl-C left: every episode written whole is kept (committed or staged), and how to go on."""
    staged = len(list_staged(store))
    return (f"the episodes written whole are kept ({staged} staged in {store}/staging, not yet merged): run the "
            f"same command again to resume and top up, or `quadforge dataset compact --store {store}` to merge them")
