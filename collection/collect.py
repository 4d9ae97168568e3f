"""The collection job: labelled episodes into a zarr trajectory store, to a target count
(``quadforge collect``, whose command line is ``collection.collect_cmd``).

The job is a count, not a loop: on start it counts the episodes already in the store or staged and
collects only the missing number, so re-running the same command after a crash (or after it finished)
resumes (or does nothing). Each finished episode is written durably through ``StagingWriter``
(episode ids ``<collector_id>-<counter>``, the counter resuming after the collector's highest id) by a
background thread (``BackgroundWriter``, so fsyncs overlap simulation); the store is compacted every
``--compact-every`` episodes or ``--compact-every-s`` seconds, whichever comes first, but within a tenth
of the wall time (``CompactionSchedule``), and at the end, so a collection stopped early leaves a readable store of what it
had a while ago. A kill loses at most the episodes in flight: those
still running in the envs and the few queued for writing. The run's seed is derived from ``--seed``,
the collector id and the counter the run starts at, so a resumed run never replays the episodes it
already has.

``--workers K`` hands the job to K Ray actors (``collection.distributed``, over ``collect_episodes``).
"""
from __future__ import annotations

import math
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from quadforge.cli_flags import field_flag
from quadforge.collection.background_writer import BackgroundWriter
from quadforge.collection.counterfactual import check_ratio, collect_paired_episodes
from quadforge.collection.labels import LabelRule
from quadforge.collection.progress import Progress, Tally
from quadforge.collection.relabel import RelabelledPolicy
from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.collection.skills import SkillCommandSampler, parse_skills
from quadforge.data.admission import check_store_accepts, features_the_store_predates
from quadforge.data.compaction import compact as compact_staged
from quadforge.data.locks import acquire
from quadforge.data.staging import COLLECTOR_ID_RE, COLLECTOR_ID_RULE, list_quarantined, list_staged
from quadforge.data.store import MANIFEST, TrajectoryStore
from quadforge.data.writer import StagingWriter
from quadforge.envs.backends.base import WarpConfig
from quadforge.envs.builder import get_task, make_env, task_names
from quadforge.envs.config import EnvConfig
from quadforge.envs.robots import ROBOTS
from quadforge.envs.terrain import terrain_types
from quadforge.experts.policy import compile_experts
from quadforge.experts.registry import check_compile_expert, check_policy_spec, policy_for_env, task_blindness
from quadforge.seeding import derive_seed, seed_everything
from quadforge.output_paths import check_output_dir, is_store_dir, made_folder_removed_on_failure



def default_policy(task: str) -> str:
    """The policy a collection of ``task`` uses when none is named: the task's own
    (``envs.builder.Task.default_policy``), one that can succeed there - the gait expert on locomotion,
    the privileged QUARD expert on ``quard:*``."""
    return get_task(task).default_policy


def collect_tasks() -> tuple[str, ...]:
    """The tasks ``collect --task`` takes: every registered task (``envs.builder.task_names``, read when asked):
    locomotion and any task registered on ``LeggedEnv`` (collected with skills, ``--max-episode-s`` and pushes),
    a QUARD task per registered family (``envs.quard.families``) plus ``quard:all`` (the families mixed per
    episode), and any other task with its own env class (``camera_task``)."""
    return task_names()


def camera_task(task: str) -> bool:
    """Whether ``task`` builds its own env class (``Task.make``: QUARD's, with its camera, scenes and own
    commands) - collected with ``--frame-stride`` and ``--images`` - rather than a ``LeggedEnv`` under the
    collection's settings (skills, ``--max-episode-s``, pushes)."""
    return get_task(task).own_env


def check_ray_address(address: str) -> None:
    """A Ray cluster answers at ``address`` (HOST:PORT or ray://HOST:PORT; ``auto`` is Ray's own lookup):
    ``ray.init`` would otherwise retry an address nobody serves for minutes, printing only warnings."""
    if address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--address {address!r}: give HOST:PORT (the head's port, 6379 unless changed), "
                         f"ray://HOST:PORT or auto")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise ValueError(f"--address {address}: no Ray cluster answers there ({err.strerror or err}); start one "
                         f"with `ray start --head` there, or leave --address out for a Ray on this machine") from None


@dataclass
class CollectConfig:
    out: str
    episodes: int
    policy: str = ""                    # "": the task's default (gait; quard_expert on quard:*), see default_policy
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
    task: str = "locomotion"            # locomotion (skills over the gait command) | quard:<family> | quard:all | any registered task
    frame_stride: int = 10              # control steps per recorded camera frame (10: 5 Hz at 50 Hz)
    images: bool = True                 # task envs: render the camera (False: proprioception + task terms only)
    compact_every: int = 100            # episodes between compactions (0: not by count)
    compact_every_s: float = 120.0      # seconds between compactions (0: not by time); whichever comes first
    num_threads: int = 1                # physics threads per env batch
    backend: str = "mujoco_cpu"         # envs.backends name
    warp: WarpConfig | None = None      # mujoco_warp options (None: defaults)
    progress: bool = True
    relabel: str = ""                   # a policy spec ("gait"): --policy drives, this one labels (DAgger)
    expert_drive_prob: float = 0.0      # with relabel: share of episodes the expert itself drives (beta)
    allow_robot_mismatch: bool = False  # drive --robot with a policy trained for another robot
    # QUARD: share of scenes also recorded with the instruction naming the other candidate (the same scene
    # seed, the expert's demonstration for it: collection.counterfactual); 0: off
    counterfactual: float = 0.0
    label_rule: LabelRule = field(default_factory=LabelRule)
    # the env's per-step task score through torch.compile (EnvConfig.compile_task; docs/scale.md): labels
    # equal to the eager env's within float rounding
    compile_task: bool = False
    # the gait expert's control law through torch.compile (GaitController.compile_expert; docs/experts.md):
    # actions equal to the eager expert's to ~1e-3, not bit for bit
    compile_expert: bool = False

    def env_overrides(self) -> dict[str, Any]:
        """The ``EnvConfig`` fields every env of this collection gets besides its own settings."""
        return {"compile_task": True} if self.compile_task else {}

    def validate(self) -> "CollectConfig":
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(f"{field_flag(name)}={getattr(self, name)!r} is invalid; allowed: {allowed}")
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
        if self.robot in ROBOTS and self.max_episode_s < (dt := EnvConfig.flat(robot=self.robot).dt):
            raise bad("max_episode_s", f">= the control dt {dt:g} s (an episode of one control step at least)")
        if self.compact_every < 0:
            raise bad("compact_every", "an integer >= 0")
        if not (self.compact_every_s >= 0 and math.isfinite(self.compact_every_s)):
            raise bad("compact_every_s", "a finite number of seconds >= 0 (0: compact by count only)")
        if self.num_threads < 1:
            raise bad("num_threads", "an integer >= 1")
        if not COLLECTOR_ID_RE.match(str(self.collector_id)):
            raise bad("collector_id", COLLECTOR_ID_RULE)
        if self.robot not in ROBOTS:
            raise bad("robot", ", ".join(ROBOTS))
        terrain_types(self.terrain)
        if self.task not in collect_tasks():
            raise bad("task", ", ".join(collect_tasks()))
        if not self.images and not camera_task(self.task):
            raise ValueError("--no-images applies to camera tasks (--task quard:...); the locomotion task has no camera")
        _refuse_flags_the_task_ignores(self)
        if not isinstance(self.frame_stride, int) or self.frame_stride < 1:
            raise bad("frame_stride", "an integer >= 1 (control steps per camera frame; 10 = 5 Hz at 50 Hz)")
        try:
            parse_skills(self.skills)
        except ValueError as err:   # the mix's own words, after the flag they are about
            raise ValueError(f"--skills {self.skills!r}: {err}") from None
        check_output_dir(self.out, "trajectory store", owns=is_store_dir, flag="--store")
        self.policy = self.policy or default_policy(self.task)
        check_policy_spec(self.policy)
        if self.relabel:
            check_policy_spec(self.relabel, flag="--relabel")
            if self.relabel == self.policy:
                raise ValueError(f"--relabel {self.relabel!r} is --policy itself: it would relabel its own actions; "
                                 "give the driving checkpoint as --policy and the expert as --relabel")
        if self.compile_expert:
            check_compile_expert([self.policy, self.relabel])
        if not 0.0 <= self.expert_drive_prob <= 1.0:
            raise bad("expert_drive_prob", "a number in [0, 1]")
        if self.expert_drive_prob and not self.relabel:
            raise ValueError(f"--expert-drive-prob {self.expert_drive_prob}: the share of episodes the --relabel expert "
                             "drives itself; it needs --relabel")
        if self.address and not self.workers:
            raise ValueError(f"--address {self.address}: the Ray cluster that --workers K collectors run on; give "
                             f"--workers (without it the collection runs in this process)")
        if self.workers and self.address:
            check_ray_address(self.address)
        check_ratio(self.counterfactual, self.task, self.workers)
        check_store_accepts(self.out, robot=self.robot, what=f"--robot {self.robot}")
        if camera_task(self.task) and self.images:
            check_store_accepts(self.out, frame_stride=self.frame_stride, what="--frame-stride asks for")
        return self


# the settings of one kind of task only: given to the other, they would be dropped without a word
LOCOMOTION_ONLY = ("skills", "max_episode_s", "push", "push_interval_s")
CAMERA_TASK_ONLY = ("frame_stride",)


def _refuse_flags_the_task_ignores(cfg: CollectConfig) -> None:
    """A setting changed from its default that ``cfg.task`` does not use is refused, naming its flag."""
    legged = not camera_task(cfg.task)
    ignored = CAMERA_TASK_ONLY if legged else LOCOMOTION_ONLY
    default = CollectConfig(out="", episodes=1)
    changed = [field_flag(name) for name in ignored if getattr(cfg, name) != getattr(default, name)]
    if changed:
        why = ("applies to the camera tasks (--task quard:...)" if legged else
               "applies to --task locomotion: a QUARD family sets its own episodes (20 s, 15 s for go_through), "
               "commands and start")
        raise ValueError(f"{', '.join(changed)} {why}; --task {cfg.task} does not use it: drop it")


def build_task_env(cfg: CollectConfig, seed: int) -> Any:
    """The vision-language env of ``cfg.task`` (``quard:<family>`` | ``quard:all``): scenes, the front camera,
    instructions, per-episode task parameters (``envs.quard``). Its episode limits are the family's own
    (20 s, 15 s for go_through), so ``--max-episode-s`` does not apply; the rollout records the camera
    every ``cfg.frame_stride`` steps (a multiple of the env's own camera rate, 10 steps = 5 Hz); with
    ``cfg.images`` off the env has no camera and the episodes no image features."""
    return make_env(cfg.robot, cfg.terrain, task=cfg.task, num_envs=cfg.num_envs, seed=seed,
                    num_threads=cfg.num_threads, backend=cfg.backend, warp=cfg.warp,
                    task_options={"images": cfg.images}, overrides=cfg.env_overrides())


def build_env(cfg: CollectConfig, seed: int) -> Any:
    """The env for one collector: commands fixed per episode (one skill each), optional pushes."""
    if camera_task(cfg.task):
        return build_task_env(cfg, seed)
    return make_env(cfg.robot, cfg.terrain, cfg.task, num_envs=cfg.num_envs, seed=seed, num_threads=cfg.num_threads,
                    backend=cfg.backend, warp=cfg.warp, adjust=lambda env: _collection_settings(cfg, env),
                    overrides=cfg.env_overrides())


def _collection_settings(cfg: CollectConfig, env: EnvConfig) -> EnvConfig:
    """The locomotion env under collection: ``--max-episode-s`` episodes, commands held per episode (one
    skill each), pushes of up to ``--push`` m/s every ``--push-interval-s``."""
    return replace(env, episode_length_s=cfg.max_episode_s, commands=replace(env.commands, resample=False),
                   randomization=replace(env.randomization, push_robots=cfg.push > 0, max_push_vel_xy=cfg.push,
                                         push_interval_s=cfg.push_interval_s))


def build_policy(cfg: CollectConfig, env: Any, seed: int = 0) -> Any:
    """The policy that drives (and, with ``--relabel``, the one that labels); refused when the labels could
    never succeed on the task: a policy that reads none of a task's own terms (``task_blindness``)."""
    spec = cfg.policy or default_policy(cfg.task)
    policy = policy_for_env(spec, env, cfg.robot, allow_robot_mismatch=cfg.allow_robot_mismatch)
    if cfg.relabel:
        policy = RelabelledPolicy(policy, policy_for_env(cfg.relabel, env, cfg.robot), env.num_envs,
                                  expert_drive_prob=cfg.expert_drive_prob, seed=seed, device=env.device)
    if cfg.compile_expert:
        compile_experts(policy)
    blind = task_blindness(policy, env)
    if blind:
        flag = f"--relabel {cfg.relabel}" if cfg.relabel else f"--policy {spec}"
        raise ValueError(f"collect {flag} on --task {cfg.task}: {blind}; collect with --policy "
                         f"{default_policy(cfg.task)} (the default) or a checkpoint trained on the task")
    return policy


def store_count(out: str) -> int:
    """Episodes already in the store or staged (complete staging files only)."""
    return len(TrajectoryStore.existing_episode_ids(out))


def compact_store(out: str) -> None:
    """Compact what is staged (a no-op store-wise when nothing is)."""
    if Path(out).is_dir():
        compact_staged(out)


# Compaction's most share of a collection's wall time. When a compaction rewrote the store's whole episode
# table its cost grew with the store (2026-11-28: 3.8 s at 12k episodes, 18 s at 60k) and a collection
# compacting every 100 episodes spent most of its time on it (21 -> 11 episodes/s between 5k and 12k).
# The table's segments (data/episode_table.py) removed that growth; the guard stays for compactions slow
# for other reasons (long episodes, a slow disk, the occasional merge of the whole table). After a
# compaction of d seconds the next waits at least d (1 - s) / s.
MAX_COMPACTION_SHARE = 0.1


class CompactionSchedule:
    """When a collection compacts: after ``every`` new episodes or ``every_s`` seconds since the last
    compaction, whichever comes first (0 turns either off), and only when there are new episodes - but
    never sooner after a compaction than keeps compaction within ``MAX_COMPACTION_SHARE`` of the time."""

    def __init__(self, every: int, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.every_s, self.clock = every, every_s, clock
        self.episodes, self.since, self.min_gap = 0, clock(), 0.0

    def due(self, episodes: int) -> bool:
        new = episodes - self.episodes
        if new <= 0:
            return False
        waited = self.clock() - self.since
        if waited < self.min_gap:
            return False
        return bool((self.every and new >= self.every) or (self.every_s and waited >= self.every_s))

    def compact(self, episodes: int, compact: Callable[[], Any]) -> None:
        """Run ``compact`` now, timed, and count it as the compaction of ``episodes``."""
        start = self.clock()
        compact()
        self.compacted(episodes, self.clock() - start)

    def compacted(self, episodes: int, seconds: float = 0.0) -> None:
        self.episodes, self.since = episodes, self.clock()
        self.min_gap = seconds * (1 - MAX_COMPACTION_SHARE) / MAX_COMPACTION_SHARE


def collect_episodes(cfg: CollectConfig, collector_id: str, quota: int,
                     on_episode: Callable[[Tally, float], None] | None = None,
                     compact: bool = True) -> dict[str, Any]:
    """Collect ``quota`` episodes as ``collector_id`` into ``cfg.out``'s staging area.

    The worker of both the local command and each Ray actor. ``on_episode(tally, steps_per_s)`` is
    called after every stored episode (steps_per_s: env-steps simulated per second of rollout). With
    ``compact`` it compacts on ``cfg``'s schedule (``CompactionSchedule``).
    """
    torch.set_num_threads(cfg.num_threads)
    writer = StagingWriter(cfg.out, collector_id)
    run_seed = derive_seed(cfg.seed, f"collect:{collector_id}:{writer.counter}") % (2**31)
    seed_everything(run_seed)
    mix = parse_skills(cfg.skills)
    env = build_env(cfg, run_seed)
    try:
        check_store_accepts(cfg.out, robot=cfg.robot, control_dt=float(env.dt), what=f"collector {collector_id}")
        policy = build_policy(cfg, env, run_seed)
        # a task env sets its own commands (the policy's high-level command); skills are for locomotion
        skills = None if camera_task(cfg.task) else SkillCommandSampler(mix, env.num_envs, run_seed)
        info_extra = {"robot": cfg.robot, "control_dt": float(env.dt), "terrain_spec": cfg.terrain,
                      "skill_mix": mix.to_string(), "seed": run_seed, "push_vel": cfg.push,
                      "collector_id": collector_id}
        if cfg.relabel:
            info_extra.update(relabelled_by=cfg.relabel, expert_drive_prob=cfg.expert_drive_prob)
        rollout = Rollout(env, policy, RolloutConfig(action_noise_std=cfg.action_noise, seed=run_seed,
                                                     frame_stride=cfg.frame_stride,
                                                     label_rule=cfg.label_rule),
                          skills=skills, info_extra=info_extra)
        tally = Tally()
        schedule = CompactionSchedule(cfg.compact_every, cfg.compact_every_s)
        t0 = time.perf_counter()
        predates = features_the_store_predates(cfg.out)   # e.g. `pushed`, into a store written before it
        with BackgroundWriter(writer) as background:
            for episode in rollout.episodes(max_episodes=quota):
                features = {k: v for k, v in episode.features.items() if k not in predates}
                if tally.episodes == 0:   # the feature set, before the first episode reaches the store
                    check_store_accepts(cfg.out, features=features, what=f"collector {collector_id}")
                background.submit(features, episode.info)
                tally.add(episode.info)
                if on_episode is not None:
                    on_episode(tally, rollout.env_steps / max(time.perf_counter() - t0, 1e-9))
                if compact and schedule.due(tally.episodes):
                    background.flush()
                    schedule.compact(tally.episodes, lambda: compact_store(cfg.out))
        seconds = time.perf_counter() - t0
    finally:
        writer.close()   # its collector lock: a later run in this process may write as the same collector
        close = getattr(env, "close", None)
        if close is not None:
            close()
    return {"collector_id": collector_id, "seed": run_seed, "seconds": seconds, "env_steps": rollout.env_steps,
            **tally.to_dict()}


def collect_lock(out: str):
    """One collect job per store at a time (``data.locks``): the target is the store's total, so a
    second job would overshoot it; it is refused with an error naming the running one."""
    return acquire(Path(out) / ".collect.lock", "collect",
                   hint="one collect per store at a time: wait for it to finish (a re-run resumes to the target), "
                        "or collect into another --store")


# rounds of collection after the first that replace episodes a compaction quarantined (see run_to_target)
MAX_TOP_UPS = 3


def run_to_target(cfg: CollectConfig, collect_missing: Callable[[int, int], dict[str, Any]]) -> dict[str, Any]:
    """The job around a collector, local or Ray: the store's collect lock, the count of missing
    episodes, ``collect_missing(missing, done) -> summary entries``, the final compaction and the summary.
    A run that made the store folder and fails before its first episode (an error found once the env or
    the policy is built) removes it again: no empty store is left to be taken for one."""
    with made_folder_removed_on_failure(cfg.out, holds_work=_holds_an_episode):
        return _run_to_target(cfg, collect_missing)


def _holds_an_episode(store: Path) -> bool:
    """Committed, staged or set aside: more than the skeleton a collection makes before its first episode."""
    return bool((store / MANIFEST).exists() or list_staged(store) or list_quarantined(store))


def _run_to_target(cfg: CollectConfig, collect_missing: Callable[[int, int], dict[str, Any]]) -> dict[str, Any]:
    with collect_lock(cfg.out):
        done = store_count(cfg.out)
        summary: dict[str, Any] = {"target": cfg.episodes, "already": done, "collected": 0}
        for _ in range(1 + MAX_TOP_UPS):
            missing = max(cfg.episodes - done, 0)
            if missing:
                collected = summary["collected"]
                summary.update(collect_missing(missing, done))
                summary["collected"] += collected
            compact_store(cfg.out)
            in_store = store_count(cfg.out)
            # a compaction quarantines staged files it cannot merge (damaged by a crash before this run, or
            # refused): they counted as done, so collect again what they leave missing - unless this round's
            # own episodes got the store no nearer its target (then another round would fare the same)
            if in_store >= cfg.episodes or (missing and in_store <= done):
                break
            done = in_store
        summary["in_store"] = in_store
        quarantined = list_quarantined(cfg.out)
        if quarantined:   # set aside by compaction (docs/data.md): say so, the target counts only merged episodes
            summary["quarantined"] = [str(p) for p, _ in quarantined]
        return summary


def run_local(cfg: CollectConfig) -> dict[str, Any]:
    def collect_here(missing: int, done: int) -> dict[str, Any]:
        bar = Progress(cfg.episodes, done, enabled=cfg.progress)
        try:
            if cfg.counterfactual > 0:
                result = collect_paired_episodes(cfg, cfg.collector_id, missing, build_policy, on_episode=bar.update)
            else:
                result = collect_episodes(cfg, cfg.collector_id, missing, on_episode=bar.update)
        finally:
            bar.close()
        return {"collected": result["episodes"], "run": result}
    return run_to_target(cfg, collect_here)
