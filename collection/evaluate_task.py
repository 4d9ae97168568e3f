"""`quadforge eval --task quard:<family>|quard:all`: closed-loop evaluation on the QUARD vision-language tasks.

For every family of the task and every colour set (``train``: the colours seen in training; ``held_out``:
gold, orange, pink, purple), ``episodes`` episodes of the policy over the gait controller: success rate,
failure reasons (``envs.quard.rules.OUTCOMES``), mean time to success, path length and obstacle
contacts, and a strip of the camera frames of one episode per family (``frames_<family>.png``).
``eval.json`` carries ``overall`` {success, episodes} like the locomotion eval, so reports read either.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.envs.quard.env import QuardConfig, QuardEnv
from quadforge.envs.quard.env import COLOUR_SETS
from quadforge.envs.quard.instructions import task_families
from quadforge.experts.registry import check_policy_spec, policy_for_env
from quadforge.progress import progress_bar
from quadforge.seeding import derive_seed, seed_everything

STRIP_FRAMES = 8


@dataclass
class TaskEvalConfig:
    task: str = "quard:all"
    policy: str = "quard_expert"
    out: str = ""
    robot: str = "go1"
    colours: tuple[str, ...] = ("train", "held_out")
    episodes: int = 20          # per family and colour set
    num_envs: int = 8
    seed: int = 0
    num_threads: int = 1
    allow_robot_mismatch: bool = False
    frames: bool = True         # a PNG strip of camera frames per family

    def validate(self) -> "TaskEvalConfig":
        task_families(self.task)
        check_policy_spec(self.policy)
        bad = [c for c in self.colours if c not in COLOUR_SETS]
        if bad or not self.colours:
            raise ValueError(f"--colours {','.join(self.colours)!r}: allowed sets {', '.join(COLOUR_SETS)}")
        if self.episodes < 1 or self.num_envs < 1:
            raise ValueError(f"--episodes-per-cell {self.episodes} and --num-envs {self.num_envs} must be >= 1")
        return self


def _family_rows(episodes: list[Any], dt: float) -> dict[str, Any]:
    outcomes: dict[str, int] = {}
    for ep in episodes:
        outcomes[ep.info["quard_outcome"]] = outcomes.get(ep.info["quard_outcome"], 0) + 1
    wins = [ep for ep in episodes if ep.info["success"]]
    n = len(episodes)
    return {
        "episodes": n, "success": len(wins) / max(n, 1), "outcomes": outcomes,
        "time_to_success_s": float(np.mean([ep.info["time_to_success"] for ep in wins])) if wins else None,
        "path_length_m": float(np.mean([ep.info["path_length"] for ep in episodes])) if n else None,
        "obstacle_contacts_mean": float(np.mean([ep.info["obstacle_contacts"] for ep in episodes])) if n else None,
        "episode_s_mean": float(np.mean([ep.info["length"] for ep in episodes]) * dt) if n else None,
    }


def _frame_strip(frames: np.ndarray, path: Path, title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picks = np.linspace(0, len(frames) - 1, num=min(STRIP_FRAMES, len(frames))).round().astype(int)
    fig, axes = plt.subplots(1, len(picks), figsize=(1.6 * len(picks), 1.9), squeeze=False)
    for ax, j in zip(axes[0], picks):
        ax.imshow(frames[j])
        ax.set_axis_off()
    fig.suptitle(title, fontsize=7)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def evaluate_task(cfg: TaskEvalConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    cfg.validate()
    torch.set_num_threads(cfg.num_threads)
    seed_everything(cfg.seed)
    out = Path(cfg.out)
    families = task_families(cfg.task)
    t_start = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    strips: dict[str, str] = {}
    policy_id = None
    bar = progress_bar(len(families) * len(cfg.colours) * cfg.episodes, desc="eval quard", unit="ep")
    for colours in cfg.colours:
        for family in families:
            env_seed = derive_seed(cfg.seed, f"eval/quard/{family}/{colours}") % (2**31)
            env = QuardEnv(QuardConfig.make(f"quard:{family}", robot=cfg.robot, num_envs=cfg.num_envs,
                                            seed=env_seed, images=True, colours=colours))
            try:
                policy = policy_for_env(cfg.policy, env, cfg.robot, allow_robot_mismatch=cfg.allow_robot_mismatch)
                policy_id = policy.policy_id
                rollout = Rollout(env, policy, RolloutConfig(record=cfg.frames, seed=cfg.seed))
                episodes = list(rollout.episodes(max_episodes=cfg.episodes))
                results.setdefault(colours, {})[family] = _family_rows(episodes, float(env.dt))
            finally:
                env.close()
            bar.update(cfg.episodes)
            if cfg.frames and episodes and "images/front_rgb" in episodes[0].features:
                ep = episodes[0]
                out.mkdir(parents=True, exist_ok=True)
                name = f"frames_{family}_{colours}.png"
                _frame_strip(np.asarray(ep.features["images/front_rgb"]), out / name,
                             f"{ep.info['instruction']} -> {ep.info['quard_outcome']}")
                strips[f"{family}/{colours}"] = name
            r = results[colours][family]
            log(f"eval quard:{family} [{colours}] success {r['success']:.3f} of {r['episodes']}  {r['outcomes']}")
    bar.close()
    all_rows = [r for by_family in results.values() for r in by_family.values()]
    total = sum(r["episodes"] for r in all_rows)
    wins = sum(r["success"] * r["episodes"] for r in all_rows)
    return {"policy": cfg.policy, "policy_id": policy_id, "task": cfg.task, "config": asdict(cfg),
            "overall": {"success": wins / max(total, 1), "episodes": total},
            "families": results, "frames": strips, "wall_s": time.perf_counter() - t_start,
            "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def task_report_markdown(result: dict[str, Any]) -> str:
    lines = [f"# QUARD evaluation: {result['policy_id']} on {result['task']}", "",
             f"overall success {result['overall']['success']:.3f} over {result['overall']['episodes']} episodes "
             f"({result['wall_s']:.0f} s)", "",
             "| colours | family | episodes | success | time to success s | path m | obstacle contacts | outcomes |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for colours, by_family in result["families"].items():
        for family, r in by_family.items():
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
            lines.append(f"| {colours} | {family} | {r['episodes']} | {r['success']:.3f} | "
                         f"{fmt(r['time_to_success_s'])} | {fmt(r['path_length_m'])} | "
                         f"{fmt(r['obstacle_contacts_mean'])} | {outcomes} |")
    lines += [""] + [f"![{k}]({v})" for k, v in result["frames"].items()]
    return "\n".join(lines) + "\n"


def write_task_outputs(result: dict[str, Any], out: str | Path) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "eval.json", "report": out / "report.md"}
    paths["json"].write_text(json.dumps(result, indent=1, default=str))
    paths["report"].write_text(task_report_markdown(result))
    return paths
