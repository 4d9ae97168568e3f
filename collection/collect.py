"""`quadforge collect`: labelled episodes into a zarr trajectory store, to a target count.

The job is a count, not a loop: on start it counts the episodes already in the store or staged and
collects only the missing number, so re-running the same command after a crash (or after it finished)
resumes (or does nothing). Each finished episode is written durably through ``StagingWriter``
(episode ids ``<collector_id>-<counter>``, the counter resuming after the collector's highest id) by a
background thread (``BackgroundWriter``, so fsyncs overlap simulation); the store is compacted every
``--compact-every`` episodes and at the end. A kill loses at most the episodes in flight: those
still running in the envs and the few queued for writing. The run's seed is derived from ``--seed``,
the collector id and the counter the run starts at, so a resumed run never replays the episodes it
already has.

``--workers K`` hands the job to K Ray actors (``collection.distributed``).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from quadforge.collection.background_writer import BackgroundWriter
from quadforge.collection.labels import LabelRule
from quadforge.collection.progress import Progress, Tally
from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.collection.skills import SkillCommandSampler, parse_skills
from quadforge.tools.seeding import derive_seed, seed_everything

POLICY_HELP = "'gait' (the gait controller expert) or a checkpoint path"
# vision-language tasks (seed 003, Table I); `quard:all` mixes the families per episode
QUARD_FAMILIES = ("go_to", "go_avoid", "stop", "distinguish", "go_through")
TASKS = ("locomotion",) + tuple(f"quard:{f}" for f in QUARD_FAMILIES + ("all",))


@dataclass
class CollectConfig:
    out: str
    episodes: int
    policy: str = "gait"
    robot: str = "go1"
    terrain: str = "flat"               # flat | mixed | comma-separated terrain types
    skills: str = "all"
    num_envs: int = 16
    seed: int = 0
    workers: int = 0                    # 0: this process; K >= 1: K Ray actors
    address: str | None = None          # Ray cluster address (None: a local Ray)
    action_noise: float = 0.0           # std of Gaussian noise on the normalised actions
    push: float = 0.0                   # max push velocity (m/s); 0: no pushes
    push_interval_s: float = 2.0
    max_episode_s: float = 4.0          # FCNet's dataset averages 192 steps (3.8 s at 50 Hz)
    collector_id: str = "main"
    task: str = "locomotion"            # locomotion (skills over the gait command) | quard:<family> | quard:all
    frame_stride: int = 10              # control steps per recorded camera frame (10: 5 Hz at 50 Hz)
    compact_every: int = 100            # episodes between compactions (0: only at the end)
    num_threads: int = 1                # physics threads per env batch
    progress: bool = True
    label_rule: LabelRule = field(default_factory=LabelRule)

    def validate(self) -> "CollectConfig":
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(f"--{name.replace('_', '-')}={getattr(self, name)!r} is invalid; allowed: {allowed}")
        if not isinstance(self.episodes, int) or self.episodes < 1:
            raise bad("episodes", "an integer >= 1 (the target count of episodes in the store)")
        if not isinstance(self.num_envs, int) or self.num_envs < 1:
            raise bad("num_envs", "an integer >= 1")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise bad("workers", "an integer >= 0 (0: no Ray)")
        if not (self.action_noise >= 0 and math.isfinite(self.action_noise)):
            raise bad("action_noise", "a finite number >= 0")
        if not (self.push >= 0 and math.isfinite(self.push)):
            raise bad("push", "a finite number >= 0 (m/s)")
        if not self.push_interval_s > 0:
            raise bad("push_interval_s", "> 0 seconds")
        if not (self.max_episode_s > 0 and math.isfinite(self.max_episode_s)):
            raise bad("max_episode_s", "a finite number > 0 (seconds)")
        if self.compact_every < 0:
            raise bad("compact_every", "an integer >= 0")
        if self.num_threads < 1:
            raise bad("num_threads", "an integer >= 1")
        from quadforge.envs.robots import ROBOTS
        if self.robot not in ROBOTS:
            raise bad("robot", ", ".join(ROBOTS))
        terrain_config(self.terrain)
        if self.task not in TASKS:
            raise bad("task", ", ".join(TASKS))
        if not isinstance(self.frame_stride, int) or self.frame_stride < 1:
            raise bad("frame_stride", "an integer >= 1 (control steps per camera frame; 10 = 5 Hz at 50 Hz)")
        parse_skills(self.skills)
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise ValueError(f"--out {self.out!r} is a file; give a trajectory store directory (created if missing)")
        if self.policy != "gait" and not Path(self.policy).exists():
            raise FileNotFoundError(f"--policy {self.policy!r}: no such checkpoint file; use {POLICY_HELP}")
        return self


def terrain_config(spec: str) -> Any:
    """``flat`` -> None (a plane), ``mixed`` -> the legged_gym mix, else a comma list of types."""
    spec = spec.strip()
    if spec == "flat":
        return None
    from quadforge.envs.terrain import TERRAIN_TYPES, TerrainConfig
    if spec == "mixed":
        return TerrainConfig.mixed()
    types = [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in types if t not in TERRAIN_TYPES]
    if unknown or not types:
        raise ValueError(f"--terrain={spec!r}: unknown terrain types {unknown}; allowed: 'flat', 'mixed' "
                         f"or a comma list of {', '.join(TERRAIN_TYPES)}")
    return TerrainConfig.of_types(types)


def build_task_env(cfg: CollectConfig, seed: int) -> Any:
    """The vision-language env of ``cfg.task`` (``quard:<family>``): scenes, camera every
    ``cfg.frame_stride`` steps, instructions, per-episode task parameters.

    The hook for the QUARD envs (issue 14, env side): the rollout and the store already take what such
    an env emits (``images/<camera>``, ``instruction``, ``task_*`` terms; ``env.task_params(i)``,
    ``env.instruction_table``, ``env.frame_stride``; see ``collection.rollout``)."""
    raise NotImplementedError(f"--task {cfg.task}: the QUARD task envs are not in this build yet (issue 14's env "
                              f"side); collect.build_task_env is where they plug in")


def build_env(cfg: CollectConfig, seed: int) -> Any:
    """The env for one collector: commands fixed per episode (one skill each), optional pushes."""
    if cfg.task != "locomotion":
        return build_task_env(cfg, seed)
    from quadforge.envs.config import EnvConfig
    from quadforge.envs.vec_env import LeggedEnv

    env_cfg = EnvConfig.flat(robot=cfg.robot, num_envs=cfg.num_envs, seed=seed)
    env_cfg.terrain = terrain_config(cfg.terrain)
    env_cfg.backend.num_threads = cfg.num_threads
    env_cfg.episode_length_s = cfg.max_episode_s
    env_cfg.commands.resample = False
    env_cfg.randomization.push_robots = cfg.push > 0
    env_cfg.randomization.max_push_vel_xy = cfg.push
    env_cfg.randomization.push_interval_s = cfg.push_interval_s
    return LeggedEnv(env_cfg)


def build_policy(cfg: CollectConfig, env: Any) -> Any:
    return make_policy(cfg.policy, env, cfg.robot)


def make_policy(spec: str, env: Any, robot: str | None = None) -> Any:
    """The gait expert (``spec == "gait"``), or a checkpoint through ``training.deploy.load_policy``
    (outside/PPO experts and models trained here alike); a policy emitting high-level commands runs
    over the gait expert."""
    from quadforge.experts.gait import GaitController
    from quadforge.experts.hierarchical import HierarchicalPolicy
    from quadforge.training.deploy import load_policy

    def gait() -> GaitController:
        return GaitController(env.robot, env.num_envs, env.dt, device=str(env.device))

    if spec == "gait":
        return gait()
    policy = load_policy(spec, env.num_envs, str(env.device), robot=robot)
    return HierarchicalPolicy(policy, gait()) if policy.action_space == "command" else policy


def store_count(out: str) -> int:
    """Episodes already in the store or staged (complete staging files only)."""
    from quadforge.data.store import TrajectoryStore
    return len(TrajectoryStore.existing_episode_ids(out))


def compact_store(out: str) -> None:
    """Compact what is staged (a no-op store-wise when nothing is)."""
    from quadforge.data.store import compact
    if Path(out).is_dir():
        compact(out)


def collect_episodes(cfg: CollectConfig, collector_id: str, quota: int,
                     on_episode: Callable[[Tally, float], None] | None = None,
                     compact: bool = True) -> dict[str, Any]:
    """Collect ``quota`` episodes as ``collector_id`` into ``cfg.out``'s staging area.

    The worker of both the local command and each Ray actor. ``on_episode(tally, steps_per_s)`` is
    called after every stored episode (steps_per_s: env-steps simulated per second of rollout). With
    ``compact`` it compacts every ``cfg.compact_every`` episodes.
    """
    import torch
    from quadforge.data.staging import StagingWriter

    torch.set_num_threads(cfg.num_threads)
    writer = StagingWriter(cfg.out, collector_id)
    run_seed = derive_seed(cfg.seed, f"collect:{collector_id}:{writer.counter}") % (2**31)
    seed_everything(run_seed)
    mix = parse_skills(cfg.skills)
    env = build_env(cfg, run_seed)
    try:
        policy = build_policy(cfg, env)
        # a task env sets its own commands (the policy's high-level command); skills are for locomotion
        skills = SkillCommandSampler(mix, env.num_envs, run_seed) if cfg.task == "locomotion" else None
        info_extra = {"robot": cfg.robot, "control_dt": float(env.dt), "terrain_spec": cfg.terrain,
                      "skill_mix": mix.to_string(), "seed": run_seed, "push_vel": cfg.push,
                      "collector_id": collector_id}
        rollout = Rollout(env, policy, RolloutConfig(action_noise_std=cfg.action_noise, seed=run_seed,
                                                     frame_stride=cfg.frame_stride,
                                                     label_rule=cfg.label_rule),
                          skills=skills, info_extra=info_extra)
        tally = Tally()
        t0 = time.perf_counter()
        with BackgroundWriter(writer) as background:
            for episode in rollout.episodes(max_episodes=quota):
                background.submit(episode.features, episode.info)
                tally.add(episode.info)
                if on_episode is not None:
                    on_episode(tally, rollout.env_steps / max(time.perf_counter() - t0, 1e-9))
                if compact and cfg.compact_every and tally.episodes % cfg.compact_every == 0:
                    background.flush()
                    compact_store(cfg.out)
        seconds = time.perf_counter() - t0
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
    return {"collector_id": collector_id, "seed": run_seed, "seconds": seconds, "env_steps": rollout.env_steps,
            **tally.to_dict()}


def run_local(cfg: CollectConfig) -> dict[str, Any]:
    done = store_count(cfg.out)
    missing = max(cfg.episodes - done, 0)
    summary: dict[str, Any] = {"target": cfg.episodes, "already": done, "collected": 0}
    if missing:
        bar = Progress(cfg.episodes, done, enabled=cfg.progress)
        try:
            result = collect_episodes(cfg, cfg.collector_id, missing, on_episode=bar.update)
        finally:
            bar.close()
        summary.update(collected=result["episodes"], run=result)
    compact_store(cfg.out)
    summary["in_store"] = store_count(cfg.out)
    return summary


# --- the CLI -----------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    d = CollectConfig(out="", episodes=0)
    p.add_argument("--out", required=True, help="trajectory store path (created if missing)")
    p.add_argument("--episodes", type=int, required=True, help="target number of episodes in the store")
    p.add_argument("--policy", default=d.policy, help=POLICY_HELP)
    p.add_argument("--robot", default=d.robot, help="go1 | aliengo")
    p.add_argument("--terrain", default=d.terrain, help="flat | mixed | comma list of terrain types")
    p.add_argument("--skills", default=d.skills,
                   help="'all' or a weighted mix, e.g. walking=0.5,running=0.2,turning=0.3")
    p.add_argument("--num-envs", type=int, default=d.num_envs, help="envs per collector")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--workers", type=int, default=d.workers, help="Ray actors (0: collect in this process)")
    p.add_argument("--address", default=d.address, help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--action-noise", type=float, default=d.action_noise,
                   help="std of Gaussian noise added to the normalised actions (sub-optimal data)")
    p.add_argument("--push", type=float, default=d.push, help="max random push velocity, m/s (0: none)")
    p.add_argument("--push-interval-s", type=float, default=d.push_interval_s)
    p.add_argument("--max-episode-s", type=float, default=d.max_episode_s, help="episode time limit, s")
    p.add_argument("--task", default=d.task, help=" | ".join(TASKS))
    p.add_argument("--frame-stride", type=int, default=d.frame_stride,
                   help="control steps per recorded camera frame (10: 5 Hz at 50 Hz control)")
    p.add_argument("--collector-id", default=d.collector_id, help="prefix of episode ids written by this run")
    p.add_argument("--compact-every", type=int, default=d.compact_every,
                   help="compact the store every N episodes (0: only at the end)")
    p.add_argument("--num-threads", type=int, default=d.num_threads, help="physics threads per collector")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> CollectConfig:
    return CollectConfig(
        out=args.out, episodes=args.episodes, policy=args.policy, robot=args.robot, terrain=args.terrain,
        skills=args.skills, num_envs=args.num_envs, seed=args.seed, workers=args.workers,
        address=args.address, action_noise=args.action_noise, push=args.push,
        push_interval_s=args.push_interval_s, max_episode_s=args.max_episode_s, task=args.task,
        frame_stride=args.frame_stride,
        collector_id=args.collector_id, compact_every=args.compact_every, num_threads=args.num_threads,
        progress=not args.no_progress,
    ).validate()


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if cfg.workers:
        from quadforge.collection.distributed import run_distributed
        summary = run_distributed(cfg)
    else:
        summary = run_local(cfg)
    print(json.dumps(summary, indent=None, default=float))
    return 0
