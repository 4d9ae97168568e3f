"""`quadforge bench vla_closed_loop --policy PATH [--policy PATH ...]`: closed-loop success of VLA policies
beside the privileged expert, per QUARD family, on seen colours, held-out colours and swapped instructions.

Every policy given, and the privileged expert (``quard_expert``, always the first column group), runs three
evaluations of ``--task`` (default ``quard:all``, every family) through the QUARD evaluation
(``evaluation.evaluate_task.evaluate_task``, the one closed-loop code path of ``quadforge eval --task``):

- ``seen``: the training colours (blue, green, red, yellow), the instructions as drawn;
- ``held_out``: gold, orange, pink, purple, the instructions as drawn;
- ``swapped``: the training-colour scenes of ``seen`` (same env seeds: the same objects, colours, slots,
  ball speeds) with the instruction naming the other object (``envs.quard.families.swap_instruction``).
  Its success is the instruction-following rate: a policy that ignores the words and picks one of the two
  objects at random follows ~50 %; one that keys on a visual cue (stop's rolling ball) ~0 %.

Tables: success per family (rows) with, per policy, seen / held-out / follows; on swapped scenes the rate
of going to the originally named object (the other half of "ignores language") and the named object's
share of the episodes that reached either object (~0.5 when the words are ignored, however well or
badly the policy walks); episodes per minute
of each evaluation (env + policy + gait controller + camera at 5 Hz, ``--num-envs`` batched envs, one
torch thread). ``--episodes`` is per family and evaluation (default 100; ``--quick``: 2 on 2 envs).
The success table's ``colour words`` row pools go_to, stop and go_through, the families whose instruction
names the colour: only there is a held-out colour a word the policy never read (distinguish's letters and
go_avoid's objects are re-tinted, their instructions unchanged), so its held-out column, not ``all``'s, is
the held-out-colour test. The JSON (``--json``) also holds every evaluation's full per-family rows
(outcomes, time to success, ...) and each its ``held_out_colour_words``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from quadforge.tools.bench.common import Table, report

EXPERT = "quard_expert"
# column name -> (colour set, instruction set) of TaskEvalConfig
CONDITIONS = {"seen": ("train", "original"), "held_out": ("held_out", "original"), "swapped": ("train", "swapped")}
# the pooled row over the families whose instruction names the colour: the held-out test proper (distinguish
# and go_avoid name none, so held-out colours only re-tint their scenes)
COLOUR_WORDS_ROW = "colour words"
OPTIONS = ("policy", "episodes", "num_envs", "task", "workers", "seed")   # the `quadforge bench` flags this benchmark takes


def policy_label(spec: str) -> str:
    """A short column label: ``expert`` for the privileged expert, else the checkpoint's name (its run
    directory's name for ``.../last.pt``)."""
    if spec == EXPERT:
        return "expert"
    path = Path(str(spec).split(":", 1)[-1] if str(spec).startswith("vla:") else spec)
    return path.parent.name if path.stem == "last" and path.parent.name else path.stem or str(spec)


def evaluate_condition(spec: str, condition: str, task: str, episodes: int, num_envs: int, seed: int = 0,
                       log=print) -> dict[str, Any]:
    """One evaluation (a ``CONDITIONS`` entry) of one policy: evaluate_task's result."""
    from quadforge.evaluation.evaluate_task import TaskEvalConfig, evaluate_task
    colours, instructions = CONDITIONS[condition]
    cfg = TaskEvalConfig(task=task, policy=spec, colours=(colours,), instructions=(instructions,),
                         episodes=episodes, num_envs=num_envs, seed=seed, num_threads=1, frames=False)
    return evaluate_task(cfg, log=log)


def evaluate_all(specs: Sequence[str], task: str, episodes: int, num_envs: int, workers: int = 1, seed: int = 0
                 ) -> dict[str, dict[str, Any]]:
    """Every (policy, condition) evaluation, in ``workers`` processes (one torch thread and one render
    thread each, so one per core); the learned policies' evaluations are queued first (they take longest).
    The results do not depend on ``workers``: every evaluation seeds itself from the same root seed."""
    jobs = [(s, c) for s in sorted(specs, key=lambda s: s == EXPERT) for c in CONDITIONS]
    if workers <= 1:
        done = {job: evaluate_condition(*job, task, episodes, num_envs, seed) for job in jobs}
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {job: pool.submit(evaluate_condition, *job, task, episodes, num_envs, seed) for job in jobs}
            done = {job: f.result() for job, f in futures.items()}
    return {s: {c: done[(s, c)] for c in CONDITIONS} for s in specs}


def _rows_by_colours(result: dict[str, Any], condition: str) -> dict[str, dict[str, dict[str, Any]]]:
    """One condition's per-family rows keyed by its colour set, the shape ``pooled_rows`` reads."""
    return {CONDITIONS[condition][0]: _rows(result, condition)}


def _rows(result: dict[str, Any], condition: str) -> dict[str, dict[str, Any]]:
    colours, instructions = CONDITIONS[condition]
    return result["swapped" if instructions == "swapped" else "families"][colours]


def tables(results: dict[str, dict[str, Any]], families: Sequence[str]) -> list[Table]:
    """Success / follows per family (and pooled: over all, and over the families whose instruction names a
    colour, ``COLOUR_WORDS_ROW``), to-original per family, and episodes per minute per evaluation."""
    from quadforge.evaluation.evaluate_task import colour_word_families, pooled_rows
    labels = {spec: policy_label(spec) for spec in results}
    cols = ["family"]
    for spec in results:
        cols += [f"{labels[spec]} seen", f"{labels[spec]} held-out", f"{labels[spec]} follows"]
    n = next(iter(results.values()))["seen"]["overall"]["episodes"] // max(len(families), 1)
    success = Table(f"QUARD closed-loop success per family ({n} episodes per cell; follows: success on swapped "
                    f"instructions, ~0.5 for a policy that picks an object at random)", cols)
    to_original = Table("swapped instructions: rate of going to the originally named object, and the named "
                        "object's share of the episodes that reached either (~0.5: the words ignored)",
                        ["family"] + [f"{labels[s]} {c}" for s in results for c in ("to original", "named share")])
    words = colour_word_families(families)
    for family in list(families) + ["all", COLOUR_WORDS_ROW]:
        row, orig = [family], [family]
        for spec, by_condition in results.items():
            for condition, key in (("seen", "success"), ("held_out", "success"), ("swapped", "follows")):
                res = by_condition[condition]
                if family == "all":
                    pooled = res["instruction_following"] if condition == "swapped" else res["overall"]
                    row.append(pooled[key])
                elif family == COLOUR_WORDS_ROW:
                    row.append(pooled_rows(_rows_by_colours(res, condition), key, words)[key])
                else:
                    row.append(_rows(res, condition)[family][key])
            if family != COLOUR_WORDS_ROW:   # the to-original table has per-family rows and "all" only
                swapped = by_condition["swapped"]
                cell = swapped["instruction_following"] if family == "all" else _rows(swapped, "swapped")[family]
                orig += [cell["to_original"], "-" if cell["named_share"] is None else cell["named_share"]]
        success.add(*row)
        if family != COLOUR_WORDS_ROW:
            to_original.add(*orig)
    speed = Table(f"evaluation throughput ({torch.get_num_threads()} torch thread)",
                  ["policy", "evaluation", "episodes", "wall s", "episodes/min"])
    for spec, by_condition in results.items():
        for condition, res in by_condition.items():
            rows = _rows(res, condition).values()
            episodes, wall = sum(r["episodes"] for r in rows), sum(r["wall_s"] for r in rows)
            speed.add(labels[spec], condition, episodes, wall, 60.0 * episodes / wall if wall > 0 else float("nan"))
    return [success, to_original, speed]


def main(quick: bool = False, json_path: str | None = None, policy: Sequence[str] = (), episodes: int | None = None,
         num_envs: int | None = None, task: str | None = None, workers: int | None = None, seed: int | None = None) -> int:
    from quadforge.envs.quard.instructions import task_families
    from quadforge.experts.registry import check_policy_spec
    torch.set_num_threads(1)
    task = task or "quard:all"
    families = task_families(task)
    # None is "not given"; a given 0 is an error, not the default (``x or default`` read it as unset)
    episodes = int((2 if quick else 100) if episodes is None else episodes)
    num_envs = int((2 if quick else 16) if num_envs is None else num_envs)
    workers = 1 if workers is None else int(workers)
    for flag, value in (("--episodes", episodes), ("--num-envs", num_envs), ("--workers", workers)):
        if value < 1:
            raise ValueError(f"bench vla_closed_loop: {flag} {value}: must be >= 1")
    specs = [EXPERT] + [str(p) for p in policy if str(p) != EXPERT]
    for spec in specs:
        check_policy_spec(spec)
        if spec != EXPERT and ":" not in spec and not Path(spec).exists():
            raise FileNotFoundError(f"bench vla_closed_loop: --policy {spec}: no such checkpoint file or directory")
    if len(specs) == 1:
        print("bench vla_closed_loop: no --policy given; measuring the privileged expert alone")
    seed = 0 if seed is None else int(seed)
    results = evaluate_all(specs, task, episodes, num_envs, workers, seed)
    policy_ids = {policy_label(s): r["seen"]["policy_id"] for s, r in results.items()}
    detail = {s: {c: {k: r[k] for k in ("policy_id", "overall", "instruction_following", "held_out_colour_words",
                                          "families", "swapped", "wall_s")} for c, r in by.items()}
              for s, by in results.items()}
    report("vla_closed_loop", tables(results, families), json_path,
           extra={"task": task, "episodes_per_cell": episodes, "num_envs": num_envs, "workers": workers, "quick": quick,
                  "seed": seed,
                  "policy_ids": policy_ids, "evaluations": detail})
    return 0
