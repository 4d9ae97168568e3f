"""`quadforge rollout`: run a policy (zero actions, the gait expert or any checkpoint) in LeggedEnv for a few seconds and
print a summary: env steps/s, episodes and how they ended, mean base velocity vs command, terrain levels.
On a QUARD task (``--task quard:...``) any policy ``load_policy`` knows runs over the task's env (the
privileged expert by default, a VLA checkpoint with the camera on); the summary is per family. Any other
registered task on ``LeggedEnv`` (``envs.builder.register_task``) runs as locomotion does, under its
``default_policy`` unless ``--policy`` names one.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from quadforge.cli_flags import add_json, add_num_envs, add_num_threads, add_seed, write_json
from quadforge.envs.robots import add_robot
from quadforge.envs.backends import add_backend_arguments, backend_from_args
from quadforge.envs.builder import get_task, make_env, task_names
from quadforge.envs.config import RandomizationConfig, command_outside_limits
from quadforge.envs.terminations import TERMINATION_REASONS
from quadforge.envs.terrain import TERRAIN_SPEC_HELP
from quadforge.experts.registry import check_policy_spec, policy_for_env, spec_help, task_blindness
from quadforge.layout import COMMAND_NAMES
from quadforge.seeding import seed_everything



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="locomotion",
                        help=f"a registered task: {' | '.join(task_names())} (locomotion: joystick commands; on a "
                             f"QUARD task any policy: the privileged quard_expert by default, a VLA checkpoint, ...)")
    parser.add_argument("--images", action="store_true",
                        help="QUARD tasks: render the front camera (5 Hz); on by itself for a policy that reads it")
    parser.add_argument("--colours", default="train", choices=("train", "held_out", "all"),
                        help="QUARD tasks: object colours (train: blue green red yellow; held_out: gold orange "
                             "pink purple)")
    add_robot(parser)
    add_num_envs(parser, 16)
    parser.add_argument("--seconds", type=float, default=5.0, help="simulated seconds per env")
    parser.add_argument("--policy", default=None,
                        help=f"{spec_help()} (default: zero on locomotion, the task's own elsewhere: quard_expert "
                             f"on quard:*)")
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
    for name, value in zip(COMMAND_NAMES, vals):
        why = command_outside_limits(name, value)
        if why:
            raise ValueError(f"--command {text!r}: {why}")
    return vals


def build_env(args: argparse.Namespace, images: bool = False):
    """The env of ``--task`` (``make_env``); a QUARD task's camera renders only with ``images``. Only a task with
    its own env class (``Task.own_env``: QUARD's) gets the camera's task options."""
    if args.num_envs < 1:
        raise ValueError(f"--num-envs {args.num_envs}: allowed: an integer >= 1")
    if not args.seconds > 0:
        raise ValueError(f"--seconds {args.seconds}: allowed: > 0")
    backend, warp = backend_from_args(args)
    common = dict(num_envs=args.num_envs, seed=args.seed, num_threads=args.num_threads, backend=backend, warp=warp)
    if get_task(args.task).own_env:
        return make_env(args.robot, args.terrain, task=args.task,
                        task_options={"images": bool(images), "colours": args.colours}, **common)
    nominal = (lambda cfg: replace(cfg, randomization=RandomizationConfig.off())) if args.no_randomization else None
    return make_env(args.robot, args.terrain, args.task, adjust=nominal, **common)


def _policy_spec(args: argparse.Namespace) -> str:
    """``--policy``, or the task's default: zero actions on locomotion, the task's own policy elsewhere
    (``Task.default_policy``: the privileged expert on quard:*); ``--gait`` picks the gait expert's gait."""
    spec = args.policy or ("zero" if args.task == "locomotion" else get_task(args.task).default_policy)
    if args.gait is not None:
        if spec != "gait":
            raise ValueError(f"--gait {args.gait!r} applies to --policy gait only (got --policy {spec!r})")
        spec = f"gait:{args.gait}"
    return spec


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
    # the sums stay on the env's device (a copy to the host each step would wait for a GPU's queue)
    reasons = torch.zeros(len(TERMINATION_REASONS), dtype=torch.long, device=dev)
    vel_sum = torch.zeros(3, device=dev)
    cmd_sum = torch.zeros(3, device=dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        terms = env.terms if policy.obs_terms else {}   # the zero policy reads nothing: skip building terms
        actions = policy.act(terms)
        cmd_sum += env.commands[:, :3].sum(0)
        _, _, dones, extras = env.step(actions)
        st = env.backend.state
        vel_sum += torch.cat([st.root_lin_vel_b[:, :2], st.root_ang_vel_b[:, 2:3]], 1).sum(0)
        done_ids = dones.nonzero(as_tuple=False).flatten()
        if done_ids.numel():
            reasons += torch.bincount(extras["episode_end"]["termination_reason"][done_ids],
                                      minlength=len(TERMINATION_REASONS))
            policy.reset(done_ids)
            if pinned is not None:
                env.set_commands(done_ids, pinned[done_ids])
    reasons, vel_sum, cmd_sum = reasons.cpu(), vel_sum.cpu(), cmd_sum.cpu()   # the run ends: its one read back
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
    if get_task(args.task).own_env:    # a one-line error naming the tasks for a bad name
        if args.command is not None:   # refused, not dropped without a word
            raise ValueError(f"--command {args.command}: the locomotion task's joystick; on --task {args.task} the "
                             f"policy's high level commands the gait (leave it out)")
        return run_quard(args)
    if args.images or args.colours != "train":   # the QUARD camera's flags: refused, not dropped without a word
        raise ValueError(f"--images/--colours: the QUARD tasks' camera and objects; the {args.task} task has neither "
                         "(give --task quard:...)")
    spec = _policy_spec(args)
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
    print(format_summary(summary, spec, args.terrain))
    if args.json:
        write_json(args.json, summary)
        if args.json != "-":
            print(f"wrote {args.json}")
    return 0


def run_quard(args: argparse.Namespace) -> int:
    """``--task quard:...``: the QUARD env under any policy (default: the privileged expert) for
    ``--seconds`` of simulated time per env; per family: episodes, success rate, outcomes."""
    import collections

    from quadforge.collection.rollout import Rollout, RolloutConfig

    spec = _policy_spec(args)
    check_policy_spec(spec)
    seed_everything(args.seed)
    torch.set_num_threads(1)
    env, policy = _quard_env_and_policy(args, spec)
    try:
        blind = task_blindness(policy, env)
        if blind:
            print(f"warning: --policy {spec} on --task {args.task}: {blind}")
        steps = max(1, int(round(args.seconds / env.dt)))
        t0 = time.perf_counter()
        outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for ep in Rollout(env, policy, RolloutConfig(record=False)).episodes(max_steps=steps):
            outcomes[ep.info["task"]][ep.info["quard_outcome"]] += 1
        wall = time.perf_counter() - t0
    finally:
        env.close()
    summary = {"task": args.task, "policy": spec, "policy_id": policy.policy_id, "num_envs": args.num_envs,
               "sim_seconds": steps * env.dt, "wall_seconds": wall, "env_steps_per_s": steps * args.num_envs / wall,
               "families": {t: {"episodes": sum(c.values()), "success_rate": c["success"] / max(sum(c.values()), 1),
                                "outcomes": dict(c)} for t, c in sorted(outcomes.items())}}
    print(f"rollout: task={args.task} policy={spec} envs={args.num_envs} "
          f"{summary['sim_seconds']:.1f} s simulated in {wall:.1f} s wall ({summary['env_steps_per_s']:.0f} env steps/s)")
    for t, f in summary["families"].items():
        print(f"  {t:18s} episodes {f['episodes']:4d}  success {f['success_rate']:.3f}  "
              + "  ".join(f"{k}={v}" for k, v in sorted(f["outcomes"].items())))
    if not summary["families"]:   # an empty table would read as a run that judged nothing wrong
        print(f"  no episode ended in {summary['sim_seconds']:.1f} s: the families' episodes last up to "
              f"{env.qcfg.env.episode_length_s:g} s; give --seconds at least that to judge one")
    if args.json:
        write_json(args.json, summary)
    return 0


def _quard_env_and_policy(args: argparse.Namespace, spec: str):
    """The QUARD env and the policy over it; the camera renders when ``--images`` asks for it or the policy
    reads camera frames (a VLA checkpoint), found when it is loaded for the env."""
    env = build_env(args, images=args.images)
    try:
        policy = policy_for_env(spec, env, args.robot)
        if args.images or not any(t.startswith("images/") for t in policy.obs_terms):
            return env, policy
    except BaseException:
        env.close()
        raise
    env.close()
    env = build_env(args, images=True)
    try:
        return env, policy_for_env(spec, env, args.robot)
    except BaseException:
        env.close()
        raise
