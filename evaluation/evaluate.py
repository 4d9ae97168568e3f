"""Closed-loop evaluation of any policy over terrain types x levels x command sets.

The job (``EvalConfig`` -> ``evaluate`` -> ``write_outputs``); its command line, ``quadforge eval``, is
``evaluation.evaluate_cmd``:

    quadforge eval --policy gait|CHECKPOINT --terrain stairs_up,slope_up --levels 0-3 --episodes-per-cell 8
                   [--commands walking] [--commands turning] [--num-envs 16] [--seed 0] --out DIR [--video]

The policy comes from the one registry (``experts.registry.load_policy``: the gait expert, outside/PPO
experts through ``experts.loaders``, models trained here through ``experts.learned``, which rebuilds the
observation layout and normalisation from the checkpoint and checks the env's terms against it) in the same rollout loop as collection (``collection.rollout.Rollout``).

Sweep. The terrain is one grid with one column per requested type and ``--num-levels`` rows (10 by
default, as in training, so "level 3" is the same difficulty whatever levels are evaluated); the
curriculum is off, so an env stays on its tile and every episode it runs belongs to its cell. Cells
(type, level) of a command set are placed on the envs in rounds of at most ``num_envs`` cells; env i of a
round runs ``ceil(N / envs in its cell)`` episodes and each cell keeps its first N by (episode index,
env) - an order fixed before any outcome is known, so stopping never favours short (failed) episodes.
Commands are drawn at each reset from the command set (a skill or skill mix of ``collection.skills``)
and held for the episode; pushes are off; the rest of the env (physics randomization) is the default.

Writes ``DIR/eval.json`` (config, every episode's metrics, per-cell summaries, latency, machine),
``DIR/report.md`` and ``DIR/success_vs_level.png`` / ``DIR/return_vs_level.png`` (``tools.reports``).
Metrics: ``evaluation.metrics``. Latency: wall time of ``policy.act`` per control step for the whole
batch of envs (and per env), timed around the call only.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from quadforge.cli_flags import field_flag
from quadforge.collection.labels import LabelRule
from quadforge.evaluation.metrics import episode_metrics, summarize
from quadforge.evaluation.reports import eval_report_markdown, plot_vs_level
from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.collection.skills import SkillCommandSampler, parse_skills
from quadforge.envs.backends.base import WarpConfig
from quadforge.envs.builder import make_env
from quadforge.envs.config import EnvConfig
from quadforge.envs.robots import ROBOTS
from quadforge.envs.terrain import terrain_types
from quadforge.experts.registry import check_policy_spec, policy_for_env
from quadforge.seeding import derive_seed, seed_everything
from quadforge.output_paths import check_output_dir, is_eval_dir
from quadforge.progress import progress_bar


# the command-line flag of a config field whose name differs from it (errors name what the user typed)
FLAGS = {"episodes": "--episodes-per-cell"}


@dataclass
class EvalConfig:
    policy: str = "gait"
    out: str = "runs/eval"
    robot: str = "go1"
    terrain: str = "flat"                     # comma list of envs.terrain.TERRAIN_TYPES, or "mixed"
    levels: str = "0"                         # "0-3", "0,2,5" or "4"
    episodes: int = 4                         # per cell (type x level x command set)
    commands: list[str] = field(default_factory=lambda: ["walking"])  # skills / skill mixes
    num_envs: int = 8
    num_levels: int = 10                      # rows of the terrain grid (difficulty = level / (rows - 1))
    seed: int = 0
    max_episode_s: float = 4.0                # as collection's default: what the data and labels assume
    num_threads: int = 1
    backend: str = "mujoco_cpu"               # envs.backends name
    warp: WarpConfig | None = None            # mujoco_warp options (None: defaults)
    video: bool = False
    video_steps: int = 150                    # 3 s of env 0 at 50 Hz
    progress: bool = True
    allow_robot_mismatch: bool = False        # a checkpoint trained for another robot (refused otherwise)
    label_rule: LabelRule = field(default_factory=LabelRule)

    def __post_init__(self) -> None:
        if isinstance(self.commands, str):   # one command set by name: a list of one, not of its letters
            self.commands = [self.commands]

    def validate(self) -> "EvalConfig":
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(f"{field_flag(name, FLAGS)}={getattr(self, name)!r} is invalid; allowed: {allowed}")
        for name in ("episodes", "num_envs", "num_levels", "num_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(name, "an integer >= 1")
        if not (self.max_episode_s > 0 and math.isfinite(self.max_episode_s)):
            raise bad("max_episode_s", "a finite number > 0 (seconds)")
        if self.robot not in ROBOTS:
            raise bad("robot", ", ".join(ROBOTS))
        terrain_types(self.terrain)
        levels = parse_levels(self.levels)
        if max(levels) >= self.num_levels:
            raise ValueError(f"--levels={self.levels!r} reaches level {max(levels)}; the grid has --num-levels="
                             f"{self.num_levels} (levels 0..{self.num_levels - 1})")
        if not self.commands:
            raise bad("commands", "one or more skills or skill mixes, e.g. walking or walking=0.5,turning=0.5")
        for c in self.commands:
            parse_skills(c)
        check_policy_spec(self.policy)
        check_output_dir(self.out, "evaluation report", owns=is_eval_dir)   # before the sweep, not after it
        return self


def parse_levels(text: str) -> list[int]:
    """'0-3' -> [0, 1, 2, 3]; '0,2,5' -> [0, 2, 5]; '4' -> [4]."""
    levels: list[int] = []
    try:
        for part in str(text).split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                levels.extend(range(lo, hi + 1))
            else:
                levels.append(int(part))
    except ValueError:
        raise ValueError(f"--levels={text!r} is invalid; allowed: a range '0-3', a list '0,2,5' or one level") from None
    if not levels or min(levels) < 0:
        raise ValueError(f"--levels={text!r} is invalid; levels are integers >= 0")
    return sorted(set(levels))


def build_env(cfg: EvalConfig, seed: int) -> Any:
    """One column per type, ``num_levels`` rows, curriculum off, commands held per episode, no pushes."""
    return make_env(cfg.robot, cfg.terrain, num_envs=cfg.num_envs, seed=seed, num_threads=cfg.num_threads,
                    backend=cfg.backend, warp=cfg.warp, one_column_per_type=True,
                    terrain_grid={"num_levels": cfg.num_levels, "seed": derive_seed(seed, "eval/terrain") % (2**31)},
                    adjust=lambda env: _evaluation_settings(cfg, env))


def _evaluation_settings(cfg: EvalConfig, env: EnvConfig) -> EnvConfig:
    """The env under evaluation: curriculum off, ``--max-episode-s`` episodes, commands held, no pushes."""
    return replace(env, curriculum=False, episode_length_s=cfg.max_episode_s,
                   commands=replace(env.commands, resample=False),
                   randomization=replace(env.randomization, push_robots=False))


class TimedPolicy:
    """A Policy that times ``act`` of the one it wraps (seconds per call) and calls ``before_act(terms)``
    first (outside the timing) - the video recorder's hook. Everything else is the wrapped policy's."""

    def __init__(self, policy: Any, before_act: Callable[[Mapping[str, torch.Tensor]], None] | None = None):
        self._policy = policy
        self.before_act = before_act
        self.seconds: list[float] = []
        self._cuda = str(getattr(policy, "device", "cpu")).startswith("cuda")

    def __getattr__(self, name: str) -> Any:  # policy_id, obs_terms, action_space, hl_commands, ...
        return getattr(self._policy, name)

    def reset(self, env_ids: torch.Tensor) -> None:
        self._policy.reset(env_ids)

    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if self.before_act is not None:
            self.before_act(obs)
        if self._cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        actions = self._policy.act(obs)
        if self._cuda:
            torch.cuda.synchronize()
        self.seconds.append(time.perf_counter() - t0)
        return actions


def _rounds(cells: list[tuple[str, int]], num_envs: int) -> list[list[tuple[str, int]]]:
    return [cells[i:i + num_envs] for i in range(0, len(cells), num_envs)]


def run_round(env: Any, rollout: Rollout, cells: list[tuple[str, int]], episodes: int,
              col_of: Mapping[str, int]) -> dict[tuple[str, int], list[Any]]:
    """Place the envs on ``cells`` (env i on cells[i % len]) and return each cell's first ``episodes``
    episodes by (episode index, env id) (``Rollout.first_episodes_by_group``)."""
    n = env.num_envs
    assignment = [cells[i % len(cells)] for i in range(n)]
    ids = torch.arange(n, device=env.device)
    env.set_terrain_levels(ids, torch.tensor([a[1] for a in assignment]),
                           torch.tensor([col_of[a[0]] for a in assignment]))

    def on_its_cell(ep: Any) -> None:
        i = int(ep.info["env_id"])
        if (ep.info.get("terrain_type"), int(ep.info.get("terrain_level", -1))) != assignment[i]:
            raise RuntimeError(f"env {i} ran an episode on {ep.info.get('terrain_type')}/level "
                               f"{ep.info.get('terrain_level')}, not its cell {assignment[i]}; was the curriculum on?")

    return rollout.first_episodes_by_group(episodes, assignment, reset=False, check=on_its_cell)


def load_policy(cfg: EvalConfig, env: Any) -> Any:
    policy = policy_for_env(cfg.policy, env, cfg.robot, allow_robot_mismatch=cfg.allow_robot_mismatch)
    check = getattr(policy, "check_terms", None)
    if callable(check):  # a checkpoint whose terms the env does not provide: a clear error before running
        check(env.terms)
    return policy


def evaluate(cfg: EvalConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the sweep; the result dict that ``write_outputs`` saves (see the module doc)."""
    cfg.validate()
    if cfg.video:
        from quadforge.evaluation.video import prepare_gl
        prepare_gl()
    torch.set_num_threads(cfg.num_threads)
    seed_everything(cfg.seed)
    env_seed = derive_seed(cfg.seed, "eval/env") % (2**31)
    env = build_env(cfg, env_seed)
    t_start = time.perf_counter()
    try:
        policy = load_policy(cfg, env)
        recorder = None
        if cfg.video:
            from quadforge.evaluation.video import VideoRecorder
            recorder = VideoRecorder.try_create(env, cfg.video_steps, log)
        timed = TimedPolicy(policy, recorder.capture if recorder is not None else None)
        col_of = {name: col for col, name in enumerate(
            env.terrain_types[int(t)] for t in env.terrain.col_type_idx.tolist())}
        cells = [(t, lv) for t in terrain_types(cfg.terrain) for lv in parse_levels(cfg.levels)]
        episodes: list[dict[str, Any]] = []
        summaries: list[dict[str, Any]] = []
        bar = progress_bar(len(cfg.commands) * len(cells) * cfg.episodes, desc=f"eval {policy.policy_id}",
                           unit="ep", enabled=cfg.progress)
        for ci, command_set in enumerate(cfg.commands):
            mix = parse_skills(command_set)
            skills = SkillCommandSampler(mix, env.num_envs, derive_seed(cfg.seed, f"eval/commands/{ci}"))
            rollout = Rollout(env, timed, RolloutConfig(record=True, seed=cfg.seed, label_rule=cfg.label_rule),
                              skills=skills, info_extra={"command_set": command_set})
            for cells_now in _rounds(cells, env.num_envs):
                t0 = time.perf_counter()
                by_cell = run_round(env, rollout, cells_now, cfg.episodes, col_of)
                for (ttype, level), eps in by_cell.items():
                    rows = []
                    for ep in eps:
                        m = episode_metrics(ep.info, ep.features.get("actions"), float(env.dt))
                        m.update(terrain_type=ttype, terrain_level=level, command_set=command_set,
                                 task=ep.info.get("task"), gait=ep.info.get("gait"))
                        rows.append(m)
                    episodes.extend(rows)
                    summaries.append({"terrain_type": ttype, "terrain_level": level, "command_set": command_set,
                                      **summarize(rows)})
                bar.update(len(cells_now) * cfg.episodes)
                if cfg.progress:
                    done = ", ".join(f"{t}/{lv}" for t, lv in cells_now)
                    log(f"eval {policy.policy_id}: [{command_set}] {done}: {len(cells_now) * cfg.episodes} episodes "
                        f"in {time.perf_counter() - t0:.1f}s")
        bar.close()
        video = recorder.save(Path(cfg.out)) if recorder is not None else None
    finally:
        env.close()
    lat = timed.seconds
    latency = {"act_ms_mean": 1e3 * sum(lat) / max(len(lat), 1),
               "act_ms_per_env": 1e3 * sum(lat) / max(len(lat), 1) / cfg.num_envs,
               "calls": len(lat), "batch": cfg.num_envs}
    cfg_dict = asdict(cfg)
    return {
        "policy": cfg.policy, "policy_id": policy.policy_id, "config": cfg_dict,
        "overall": summarize(episodes), "cells": summaries, "episodes": episodes, "latency": latency,
        "video": str(video) if video else None,
        "smoothness": "share of action energy above 5 Hz (50 Hz control), see evaluation/metrics.py",
        "wall_s": time.perf_counter() - t_start,
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


# what one `quadforge eval` writes into its --out (write_outputs, write_task_outputs, the video, the QUARD frames)
EVAL_OUTPUTS = ("eval.json", "report.md", "episode.gif", "*_vs_level.png", "frames_*.png")


def replace_earlier_report(out: str | Path, who: str = "eval") -> None:
    """An --out holding an earlier evaluation is replaced (docs/evaluation.md): say so, and remove its files
    first, so none of them (a GIF, a family's frames) stays beside the new report as if it were its own."""
    out = Path(out)
    earlier = sorted({p for pattern in EVAL_OUTPUTS for p in out.glob(pattern) if p.is_file()
                      and not p.name.startswith("experts_")})
    if earlier:
        print(f"{who}: replacing the earlier evaluation in {out} ({', '.join(p.name for p in earlier[:4])}"
              f"{' ...' if len(earlier) > 4 else ''})", flush=True)
        for p in earlier:
            p.unlink()


def write_outputs(result: dict[str, Any], out: str | Path, title: str | None = None) -> dict[str, Path]:
    """eval.json, report.md and the PNG plots into ``out``; the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "eval.json", "report": out / "report.md"}
    paths["json"].write_text(json.dumps(result, indent=1, default=str))
    paths.update(plot_vs_level({result["policy_id"]: result}, out))
    paths["report"].write_text(eval_report_markdown(result, plots={k: v.name for k, v in paths.items()
                                                                    if k.endswith("_png")}, title=title))
    return paths
