"""`quadforge eval --task quard:<family>|quard:all`: closed-loop evaluation on the QUARD vision-language tasks.

For every family of the task, every colour set (``train``: the colours seen in training; ``held_out``:
gold, orange, pink, purple) and every instruction set (``original``: the instruction names the scene's
target; ``swapped``: the same scenes - same env seeds, so env i's k-th episode has the same objects,
colours, slots and ball speed - with the instruction naming the other object,
``envs.quard.families.swap_instruction``), ``episodes`` episodes of the policy over the gait controller:
success rate, failure reasons (``envs.quard.rules.OUTCOMES``), mean time to success, path length and
obstacle contacts, and a strip of the camera frames of one episode per family
(``frames_<family>_<colours>[_swapped].png``).

Which episodes count: each env's first ``ceil(episodes / num_envs)`` episodes, of which the cell keeps the
first ``episodes`` by (episode index, env id) (``collection.rollout.Rollout.first_episodes``) - a set fixed
before any outcome is known. The first episodes to *finish* are not a fair sample: an episode ends the
moment it succeeds or fails while a time-out runs the full limit, so they over-sample quick outcomes (true
success 0.50 read as ~0.57 at 8 envs and 20 episodes), and the original and swapped runs kept different
scenes. Each cell's ``scenes`` lists the kept [env id, episode index] pairs, equal in both instruction sets.

Instruction following (issue 15): on swapped scenes ``follows`` is the rate of reaching the object the
swapped instruction names (its success rate) and ``to_original`` the rate of reaching the object the
original instruction named instead (its ``wrong_target`` rate). A policy that picks one of the two
objects at random follows ~50 %; one that keys on something other than the words (e.g. the rolling ball
in stop) follows ~0 % with ``to_original`` ~100 %. ``named_share`` = success / (success + wrong target),
the share of the episodes that reached one of the two objects which reached the named one, separates
the words from the walking: ~0.5 when the words are ignored, however often the policy reaches anything.

``eval.json``: ``families[colours][family]`` (original instructions) and ``swapped[colours][family]``
rows; ``overall`` {success, episodes} over the original rows like the locomotion eval, so reports read
either, ``instruction_following`` {follows, to_original, named_share, episodes} over the swapped rows, and
``held_out_colour_words`` {success, episodes, families}: the held-out colours over the families whose
instruction names the colour (go_to, stop, go_through), the held-out test proper - distinguish and go_avoid
name no colour, so on held-out colours their scenes are only re-tinted (None without held-out colours).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.envs.backends.base import WarpConfig
from quadforge.envs.builder import make_env
from quadforge.envs.quard.env import COLOUR_SETS
from quadforge.envs.quard.families import get_family
from quadforge.envs.quard.instructions import task_families
from quadforge.experts.registry import check_policy_spec, policy_for_env, task_blindness
from quadforge.progress import progress_bar
from quadforge.seeding import derive_seed, seed_everything

STRIP_FRAMES = 8
INSTRUCTION_SETS = ("original", "swapped")


@dataclass
class TaskEvalConfig:
    task: str = "quard:all"
    policy: str = "quard_expert"
    out: str = ""
    robot: str = "go1"
    colours: tuple[str, ...] = ("train", "held_out")
    instructions: tuple[str, ...] = ("original",)   # INSTRUCTION_SETS: swapped measures instruction following
    episodes: int = 20          # per family and colour set
    num_envs: int = 8
    seed: int = 0
    num_threads: int = 1
    allow_robot_mismatch: bool = False
    frames: bool = True         # a PNG strip of camera frames per family
    backend: str = "mujoco_cpu"         # envs.backends name (QUARD needs its capabilities; make_env says which)
    warp: WarpConfig | None = None      # mujoco_warp options (None: defaults)

    def validate(self) -> "TaskEvalConfig":
        task_families(self.task)
        check_policy_spec(self.policy)
        bad = [c for c in self.colours if c not in COLOUR_SETS]
        if bad or not self.colours:
            raise ValueError(f"--colours {','.join(self.colours)!r}: allowed sets {', '.join(COLOUR_SETS)}")
        bad = [c for c in self.instructions if c not in INSTRUCTION_SETS]
        if bad or not self.instructions:
            raise ValueError(f"--instructions {','.join(self.instructions)!r}: allowed sets "
                             f"{', '.join(INSTRUCTION_SETS)}")
        if self.episodes < 1 or self.num_envs < 1:
            raise ValueError(f"--episodes-per-cell {self.episodes} and --num-envs {self.num_envs} must be >= 1")
        return self


def _family_rows(episodes: list[Any], dt: float, swapped: bool = False) -> dict[str, Any]:
    outcomes: dict[str, int] = {}
    for ep in episodes:
        outcomes[ep.info["quard_outcome"]] = outcomes.get(ep.info["quard_outcome"], 0) + 1
    wins = [ep for ep in episodes if ep.info["success"]]
    n = len(episodes)
    # reached the object the instruction did not name (on swapped scenes: the originally named one)
    wrong = outcomes.get("wrong_target", 0) / max(n, 1)
    follow = {"follows": len(wins) / max(n, 1), "to_original": wrong} if swapped else {}
    return {
        "episodes": n, "success": len(wins) / max(n, 1), "wrong_target": wrong, **follow,
        # the kept scenes, in order: [env id, the env's episode index] (task_params; the same in both instruction sets)
        "scenes": [[ep.info.get("task_params", {}).get("env_id"), ep.info.get("task_params", {}).get("episode")]
                   for ep in episodes],
        "named_share": _named_share(len(wins), outcomes.get("wrong_target", 0)), "outcomes": outcomes,
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
    swapped_rows: dict[str, dict[str, Any]] = {}
    bar = progress_bar(len(families) * len(cfg.colours) * len(cfg.instructions) * cfg.episodes,
                       desc="eval quard", unit="ep")
    for instructions in cfg.instructions:
        swapped = instructions == "swapped"
        table = swapped_rows if swapped else results
        for colours in cfg.colours:
            for family in families:
                t_cell = time.perf_counter()
                # the env seed leaves the instruction set out: swapped scenes are the original ones
                env_seed = derive_seed(cfg.seed, f"eval/quard/{family}/{colours}") % (2**31)
                env = make_env(cfg.robot, task=f"quard:{family}", num_envs=cfg.num_envs, seed=env_seed,
                               num_threads=cfg.num_threads, backend=cfg.backend, warp=cfg.warp,
                               task_options={"images": True, "colours": colours, "swap_instruction": swapped})
                try:
                    policy = policy_for_env(cfg.policy, env, cfg.robot,
                                            allow_robot_mismatch=cfg.allow_robot_mismatch)
                    blind = task_blindness(policy, env) if policy_id is None else None   # said once
                    if blind:
                        log(f"warning: --policy {cfg.policy} on --task {cfg.task}: {blind}")
                    policy_id = policy.policy_id
                    rollout = Rollout(env, policy, RolloutConfig(record=cfg.frames, seed=cfg.seed))
                    episodes = rollout.first_episodes(cfg.episodes)   # fixed in advance: see the module doc
                    row = _family_rows(episodes, float(env.dt), swapped)
                finally:
                    env.close()
                row["wall_s"] = time.perf_counter() - t_cell
                table.setdefault(colours, {})[family] = row
                bar.update(cfg.episodes)
                suffix = "_swapped" if swapped else ""
                if cfg.frames and episodes and "images/front_rgb" in episodes[0].features:
                    ep = episodes[0]
                    out.mkdir(parents=True, exist_ok=True)
                    name = f"frames_{family}_{colours}{suffix}.png"
                    _frame_strip(np.asarray(ep.features["images/front_rgb"]), out / name,
                                 f"{ep.info['instruction']} -> {ep.info['quard_outcome']}")
                    strips[f"{family}/{colours}{suffix}"] = name
                follow = (f"  follows {row['follows']:.3f} to_original {row['to_original']:.3f}" if swapped else "")
                log(f"eval quard:{family} [{colours}, {instructions} instructions] success {row['success']:.3f} "
                    f"of {row['episodes']}{follow}  {row['outcomes']}")
    bar.close()
    return {"policy": cfg.policy, "policy_id": policy_id, "task": cfg.task, "config": asdict(cfg),
            "overall": pooled_rows(results, "success"),
            "instruction_following": {**pooled_rows(swapped_rows, "follows"),
                                      "to_original": pooled_rows(swapped_rows, "to_original")["to_original"],
                                      "named_share": _pooled_share(swapped_rows)},
            "held_out_colour_words": held_out_colour_words(results),
            "families": results, "swapped": swapped_rows, "frames": strips,
            "wall_s": time.perf_counter() - t_start,
            "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def colour_word_families(families: Sequence[str]) -> list[str]:
    """Those of ``families`` whose instruction names a colour (``Family.names_colour``): go_to, stop, go_through."""
    return [f for f in families if get_family(f).names_colour]


def held_out_colour_words(results: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Success on the held-out colours over the families whose instruction names the colour - the test of
    colour words the policy never read. distinguish (letters) and go_avoid (objects) name none: held-out
    colours only re-tint their scenes, so the held-out rows of all five families are not that test.
    None when the held-out colours were not evaluated."""
    rows = results.get("held_out")
    if not rows:
        return None
    families = colour_word_families(list(rows))
    return {**pooled_rows({"held_out": rows}, "success", families), "families": families}


def _named_share(reached_named: float, reached_other: float) -> float | None:
    """Of the episodes that reached one of the two objects, the share that reached the named one."""
    reached = reached_named + reached_other
    return reached_named / reached if reached > 0 else None


def _pooled_share(rows: dict[str, dict[str, Any]]) -> float | None:
    flat = [r for by_family in rows.values() for r in by_family.values()]
    return _named_share(sum(r["success"] * r["episodes"] for r in flat),
                        sum(r["wrong_target"] * r["episodes"] for r in flat))


def pooled_rows(rows: dict[str, dict[str, Any]], key: str, families: Sequence[str] | None = None) -> dict[str, Any]:
    """{key: the episode-weighted mean of ``key`` over every row (of ``families``, when given), episodes: their
    sum}; key None without rows."""
    flat = [r for by_family in rows.values() for f, r in by_family.items() if families is None or f in families]
    total = sum(r["episodes"] for r in flat)
    value = sum(r[key] * r["episodes"] for r in flat) / total if total else None
    return {key: value, "episodes": total}


def task_report_markdown(result: dict[str, Any]) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    rate = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    o, follow = result["overall"], result.get("instruction_following") or {}
    lines = [f"# QUARD evaluation: {result['policy_id']} on {result['task']}", ""]
    if o["episodes"]:
        lines.append(f"overall success {rate(o['success'])} over {o['episodes']} episodes")
    words = result.get("held_out_colour_words")
    if words and words["episodes"]:
        lines.append(f"held-out colours where the instruction names the colour ({', '.join(words['families'])}): "
                     f"success {rate(words['success'])} over {words['episodes']} episodes")
    if follow.get("episodes"):
        lines.append(f"instruction following (swapped instructions) {rate(follow['follows'])}, to the originally "
                     f"named object {rate(follow['to_original'])} (named share {rate(follow['named_share'])}), "
                     f"over {follow['episodes']} episodes")
    lines += [f"({result['wall_s']:.0f} s)", "",
              "| instructions | colours | family | episodes | success | wrong target | named share | time to success s "
              "| path m | obstacle contacts | outcomes |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for instructions, rows in (("original", result["families"]), ("swapped", result.get("swapped", {}))):
        for colours, by_family in rows.items():
            for family, r in by_family.items():
                outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
                lines.append(f"| {instructions} | {colours} | {family} | {r['episodes']} | {r['success']:.3f} | "
                             f"{r['wrong_target']:.3f} | {rate(r.get('named_share'))} | {fmt(r['time_to_success_s'])} | "
                             f"{fmt(r['path_length_m'])} | "
                             f"{fmt(r['obstacle_contacts_mean'])} | {outcomes} |")
    if result.get("swapped"):
        lines += ["", "On swapped instructions, success is the instruction-following rate and wrong target the "
                  "rate of going to the originally named object."]
    lines += ["", "Named share: of the episodes that reached one of the two objects, the share that reached the "
              "named one (~0.5 when the instruction's words are ignored)."]
    lines += [""] + [f"![{k}]({v})" for k, v in result["frames"].items()]
    return "\n".join(lines) + "\n"


def write_task_outputs(result: dict[str, Any], out: str | Path) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "eval.json", "report": out / "report.md"}
    paths["json"].write_text(json.dumps(result, indent=1, default=str))
    paths["report"].write_text(task_report_markdown(result))
    return paths
