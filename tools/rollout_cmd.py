"""`quadforge rollout`: run a policy (zero actions, the gait expert or any checkpoint) in LeggedEnv for a few seconds and
print a summary: env steps/s, episodes and how they ended, mean base velocity vs command, terrain levels.
"""
from __future__ import annotations

import argparse
import time

import torch

from quadforge.cli_flags import add_json, add_num_envs, add_num_threads, add_robot, add_seed, write_json
from quadforge.envs.backends import add_backend_arguments, backend_from_args
from quadforge.envs.builder import make_env
from quadforge.envs.config import RandomizationConfig
from quadforge.envs.terminations import TERMINATION_REASONS
from quadforge.envs.terrain import TERRAIN_SPEC_HELP
from quadforge.experts.registry import check_policy_spec, policy_for_env, spec_help
from quadforge.layout import COMMAND_NAMES
from quadforge.seeding import seed_everything



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="locomotion",
                        help="locomotion (joystick commands), or a QUARD task: quard:<family> | quard:all "
                             "(families go_to, go_avoid, stop, distinguish, go_through; --policy expert or zero)")
    parser.add_argument("--images", action="store_true", help="QUARD tasks: render the front camera (5 Hz)")
    parser.add_argument("--colours", default="train", choices=("train", "held_out", "all"),
                        help="QUARD tasks: object colours (train: blue green red yellow; held_out: gold orange "
                             "pink purple)")
    add_robot(parser)
    add_num_envs(parser, 16)
    parser.add_argument("--seconds", type=float, default=5.0, help="simulated seconds per env")
    parser.add_argument("--policy", default="zero", help=spec_help())
    parser.add_argument("--gait", default=None, help="gait of the gait expert (same as --policy gait:<gait>)")
    parser.add_argument("--terrain", default="flat", help=TERRAIN_SPEC_HELP)
    parser.add_argument("--command", default=None, metavar="VX,VY,WZ",
                        help="pin this joystick command in every env (default: drawn per episode)")
    parser.add_argument("--no-randomization", action="store_true", help="nominal physics, no pushes, no latency")
    add_num_threads(parser, None)
    add_seed(parser)
    add_json(parser, "the summary")
    add_backend_arguments(parser)


def _command(text: str | None):
    if text is None:
        return None
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if len(vals) != 3:
        raise ValueError(f"--command {text!r}: expected three numbers VX,VY,WZ (m/s, m/s, rad/s)")
    return vals


def build_env(args: argparse.Namespace):
    if args.num_envs < 1:
        raise ValueError(f"--num-envs {args.num_envs}: allowed: an integer >= 1")
    if not args.seconds > 0:
        raise ValueError(f"--seconds {args.seconds}: allowed: > 0")
    overrides = {"randomization": RandomizationConfig.off()} if args.no_randomization else {}
    backend, warp = backend_from_args(args)
    return make_env(args.robot, args.terrain, num_envs=args.num_envs, seed=args.seed, num_threads=args.num_threads,
                    overrides=overrides, backend=backend, warp=warp)


def rollout(env, policy, seconds: float, command=None) -> dict:
    """Run ``seconds`` of simulated time in every env; the summary as a dict."""
    n, dev = env.num_envs, env.device
    all_ids = torch.arange(n, device=dev)
    pinned = None
    if command is not None:
        pinned = env.commands.clone()
        pinned[:, :3] = torch.tensor(command, device=dev)
        env.set_commands(all_ids, pinned)
    policy.reset(all_ids)
    steps = max(1, int(round(seconds / env.dt)))
    reasons = torch.zeros(len(TERMINATION_REASONS), dtype=torch.long)
    vel_sum = torch.zeros(3)
    cmd_sum = torch.zeros(3)
    t0 = time.perf_counter()
    for _ in range(steps):
        terms = env.terms if policy.obs_terms else {}   # the zero policy reads nothing: skip building terms
        actions = policy.act(terms)
        cmd_sum += env.commands[:, :3].sum(0).cpu()
        _, _, dones, extras = env.step(actions)
        st = env.backend.state
        vel_sum += torch.cat([st.root_lin_vel_b[:, :2], st.root_ang_vel_b[:, 2:3]], 1).sum(0).cpu()
        done_ids = dones.nonzero(as_tuple=False).flatten()
        if done_ids.numel():
            reasons += torch.bincount(extras["episode_end"]["termination_reason"][done_ids].cpu(),
                                      minlength=len(TERMINATION_REASONS))
            policy.reset(done_ids)
            if pinned is not None:
                env.set_commands(done_ids, pinned[done_ids])
    wall = time.perf_counter() - t0
    samples = steps * n
    levels = env.terrain.log() if env.terrain.terrain is not None else {}
    return {
        "num_envs": n, "steps": steps, "sim_seconds": steps * env.dt, "wall_seconds": wall,
        "env_steps_per_s": samples / wall,
        "episodes_ended": int(reasons[1:].sum()),
        "terminations": {name: int(reasons[i]) for i, name in enumerate(TERMINATION_REASONS) if i > 0},
        "mean_velocity": dict(zip(("vx", "vy", "wz"), (vel_sum / samples).tolist())),
        "mean_command": dict(zip(COMMAND_NAMES[:3], (cmd_sum / samples).tolist())),
        "terrain_levels": levels,
    }


def format_summary(s: dict, policy: str, terrain: str) -> str:
    lines = [f"rollout: policy={policy} terrain={terrain} envs={s['num_envs']} "
             f"{s['sim_seconds']:.1f} s simulated in {s['wall_seconds']:.1f} s wall",
             f"  env steps/s      {s['env_steps_per_s']:.0f}",
             f"  episodes ended   {s['episodes_ended']}  "
             + "  ".join(f"{k}={v}" for k, v in s["terminations"].items()),
             "  mean velocity    " + "  ".join(f"{k}={v:+.3f}" for k, v in s["mean_velocity"].items()),
             "  mean command     " + "  ".join(f"{k}={v:+.3f}" for k, v in s["mean_command"].items())]
    if s["terrain_levels"]:
        lines.append("  terrain levels   " + "  ".join(
            f"{k.rsplit('/', 1)[-1]}={v:.2f}" for k, v in s["terrain_levels"].items()))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.task != "locomotion":
        return run_quard(args)
    spec = args.policy
    if args.gait is not None:
        if spec != "gait":
            raise ValueError(f"--gait {args.gait!r} applies to --policy gait only (got --policy {spec!r})")
        spec = f"gait:{args.gait}"
    check_policy_spec(spec)
    command = _command(args.command)
    seed_everything(args.seed)
    # The env's per-step torch work is many small batched ops: intra-op threads only add hand-off cost
    # (tens of ms per op on a loaded machine); the physics has its own thread pool (--threads).
    torch.set_num_threads(1)
    env = build_env(args)
    try:
        policy = policy_for_env(spec, env, args.robot)
        summary = rollout(env, policy, args.seconds, command)
    finally:
        env.close()
    print(format_summary(summary, args.policy, args.terrain))
    if args.json:
        write_json(args.json, summary)
        if args.json != "-":
            print(f"wrote {args.json}")
    return 0


def run_quard(args: argparse.Namespace) -> int:
    """``--task quard:...``: the QUARD env under the privileged expert (or zero actions) for
    ``--seconds`` of simulated time per env; per family: episodes, success rate, outcomes."""
    import collections

    from quadforge.collection.rollout import Rollout, RolloutConfig
    from quadforge.envs.quard.env import QuardConfig, QuardEnv
    from quadforge.envs.quard.instructions import task_families
    from quadforge.envs.terrain import terrain_config

    task_families(args.task)   # a one-line error for a bad task name
    if args.policy not in ("expert", "zero"):
        raise ValueError(f"--policy {args.policy!r} with --task {args.task}: allowed: expert, zero")
    if args.num_envs < 1 or not args.seconds > 0:
        raise ValueError("--num-envs must be >= 1 and --seconds > 0")
    seed_everything(args.seed)
    torch.set_num_threads(1)
    env = QuardEnv(QuardConfig.make(args.task, robot=args.robot, num_envs=args.num_envs, seed=args.seed,
                                    terrain=terrain_config(args.terrain), images=args.images,
                                    colours=args.colours))
    try:
        if args.policy == "expert":
            from quadforge.experts.quard_expert import make_quard_expert
            policy = make_quard_expert(env)
        else:
            policy = policy_for_env("zero", env, args.robot)
        steps = max(1, int(round(args.seconds / env.dt)))
        t0 = time.perf_counter()
        outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for ep in Rollout(env, policy, RolloutConfig(record=False)).episodes(max_steps=steps):
            outcomes[ep.info["task"]][ep.info["quard_outcome"]] += 1
        wall = time.perf_counter() - t0
    finally:
        env.close()
    summary = {"task": args.task, "policy": args.policy, "num_envs": args.num_envs, "sim_seconds": steps * env.dt,
               "wall_seconds": wall, "env_steps_per_s": steps * args.num_envs / wall,
               "families": {t: {"episodes": sum(c.values()), "success_rate": c["success"] / max(sum(c.values()), 1),
                                "outcomes": dict(c)} for t, c in sorted(outcomes.items())}}
    print(f"rollout: task={args.task} policy={args.policy} envs={args.num_envs} "
          f"{summary['sim_seconds']:.1f} s simulated in {wall:.1f} s wall ({summary['env_steps_per_s']:.0f} env steps/s)")
    for t, f in summary["families"].items():
        print(f"  {t:18s} episodes {f['episodes']:4d}  success {f['success_rate']:.3f}  "
              + "  ".join(f"{k}={v}" for k, v in sorted(f["outcomes"].items())))
    if args.json:
        write_json(args.json, summary)
    return 0
