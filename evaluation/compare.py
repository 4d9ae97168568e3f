"""`quadforge compare`: finished evaluations of several policies side by side, cell by cell.

    quadforge compare EVAL [EVAL ...] [--labels A,B,...] [--alpha 0.05] [--table FILE] [--json PATH]

Each EVAL is an ``eval.json`` written by ``quadforge eval`` (locomotion or ``--task quard:...``), a folder
holding one, or an ``eval-expert`` folder (its policies' ``<k>_<name>/eval.json`` in order). Nothing is
re-run: evaluations made on different days or machines compare as they stand.

A cell is what one evaluation measured in one setting: command set x terrain type x level for locomotion;
instruction set x colour set x family for QUARD. Per cell every policy's successes k/n, and for every
policy after the first (the baseline) its difference from the baseline with the two-sided p of Fisher's
exact test (``evaluation.metrics.fisher_exact_p``: exact at a cell's few episodes). With many cells some
p fall below 0.05 by chance, so a difference is starred only when it survives Holm's correction over that
policy's cells; the pooled row (every common cell summed) is the one test to read first. Evaluations of
another kind (locomotion against QUARD) are refused; settings that differ (terrain, levels, episodes,
seed, robot, backend, ...) are listed above the table, since such a comparison is not like for like.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from quadforge.cli_flags import add_json, write_json
from quadforge.evaluation.metrics import fisher_exact_p, holm_significant
from quadforge.evaluation.reports import fmt, markdown_table
from quadforge.output_paths import check_output_file, table_marker, written_by

KINDS = {"locomotion": ("commands", "terrain", "level"), "quard": ("instructions", "colours", "family")}
# config keys left out of "not like for like": they do not change what is measured (the policy is the point
# of the comparison). num_envs changes which scenes are kept - env i's k-th episode is drawn from the seed,
# i and k, and an evaluation keeps each env's first episodes (collection.rollout.Rollout.first_episodes) -
# but not their distribution: the kept set is fixed before any outcome is known. (Evaluations that kept the
# first episodes to finish, before 2026-11-29, were biased toward quick outcomes by an amount that grew
# with num_envs.) Thread counts change nothing measured.
IGNORED_SETTINGS = ("policy", "out", "video", "frames", "num_threads", "num_envs")


@dataclass
class Evaluation:
    label: str
    path: Path
    kind: str
    config: dict[str, Any]
    cells: dict[tuple, tuple[int, int]] = field(default_factory=dict)   # key -> (successes, episodes)


def _count(rate: float, episodes: int) -> int:
    return int(round(float(rate) * int(episodes)))


def _cells(result: Mapping[str, Any], path: Path) -> tuple[str, dict[tuple, tuple[int, int]]]:
    if "families" in result:
        cells = {}
        for instructions, rows in (("original", result["families"]), ("swapped", result.get("swapped") or {})):
            for colours, by_family in rows.items():
                for family, r in by_family.items():
                    cells[(instructions, colours, family)] = (_count(r["success"], r["episodes"]), int(r["episodes"]))
        return "quard", cells
    if "cells" in result:
        return "locomotion", {(c["command_set"], c["terrain_type"], int(c["terrain_level"])):
                              (_count(c["success"], c["episodes"]), int(c["episodes"])) for c in result["cells"]}
    raise ValueError(f"{path}: not an evaluation result (no 'cells' or 'families'; written by `quadforge eval`?)")


def evaluation_files(arg: str) -> list[Path]:
    """The eval.json files an EVAL argument names: a file, a folder with one, or an eval-expert folder."""
    p = Path(arg)
    if p.is_file():
        return [p]
    if p.is_dir():
        if (p / "eval.json").is_file():
            return [p / "eval.json"]
        subs = sorted(p.glob("*/eval.json"), key=lambda f: (int(f.parent.name.split("_")[0])
                                                          if f.parent.name.split("_")[0].isdigit() else 1 << 30,
                                                          f.parent.name))
        if subs:
            return subs
        raise ValueError(f"{p}: holds no eval.json (nor <k>_<name>/eval.json of `quadforge eval-expert`)")
    raise ValueError(f"{p}: no such file or folder")


def load_evaluation(path: Path, label: str | None = None) -> Evaluation:
    try:
        result = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read it as JSON ({err})") from err
    if not isinstance(result, dict):
        raise ValueError(f"{path}: not an evaluation result (a JSON object written by `quadforge eval`)")
    return evaluation_of(result, path, label)


def evaluation_of(result: Mapping[str, Any], path: Path, label: str | None = None) -> Evaluation:
    """An ``Evaluation`` of a result dict (``evaluate``'s or ``evaluate_task``'s), ``path`` naming it in errors."""
    try:
        kind, cells = _cells(result, path)
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: an evaluation result without {err} in a cell; was it edited?") from err
    if not cells:
        raise ValueError(f"{path}: an evaluation with no cells (nothing was evaluated)")
    name = label or str(result.get("policy_id") or result.get("policy") or path.parent.name)
    return Evaluation(name, path, kind, dict(result.get("config") or {}), cells)


def _different_settings(evals: Sequence[Evaluation]) -> dict[str, list[Any]]:
    keys = sorted({k for e in evals for k in e.config} - set(IGNORED_SETTINGS))
    return {k: [e.config.get(k) for e in evals] for k in keys
            if len({json.dumps(e.config.get(k), sort_keys=True, default=str) for e in evals}) > 1}


def compare(evals: Sequence[Evaluation], alpha: float = 0.05) -> dict[str, Any]:
    """Per cell, each evaluation's (k, n); per later evaluation its difference from the first, Fisher's p,
    and whether it is significant after Holm's correction over its cells. Cells every evaluation holds
    are pooled into one row."""
    if len(evals) < 2:
        raise ValueError("compare: give at least two evaluations")
    kinds = {e.kind for e in evals}
    if len(kinds) > 1:
        raise ValueError("compare: " + ", ".join(f"{e.path} is {e.kind}" for e in evals) +
                         "; a locomotion evaluation and a QUARD one measure different things")
    labels = [e.label for e in evals]
    if len(set(labels)) < len(labels):
        raise ValueError(f"compare: labels {labels} repeat; give distinct ones with --labels A,B,...")
    base = evals[0]
    keys = list(dict.fromkeys(k for e in evals for k in e.cells))   # the baseline's order, then the others'
    common = [k for k in keys if all(k in e.cells for e in evals)]
    rows = [{"cell": list(key), "results": [list(e.cells[key]) if key in e.cells else None for e in evals]}
            for key in keys]
    pooled = [[sum(e.cells[k][0] for k in common), sum(e.cells[k][1] for k in common)] for e in evals]
    versus = []
    for j, e in enumerate(evals[1:], start=1):
        per_row = _against_baseline(rows, j, alpha)
        for r, v in zip(rows, per_row):
            r.setdefault("versus", []).append(v)
        (k1, n1), (k0, n0) = pooled[j], pooled[0]
        versus.append({"label": e.label, "cells_tested": sum(v is not None for v in per_row),
                       "pooled_difference": (k1 / n1 - k0 / n0) if n0 and n1 else None,
                       "pooled_p": fisher_exact_p(k1, n1, k0, n0) if n0 and n1 else None})
    return {"kind": base.kind, "cell_columns": list(KINDS[base.kind]), "labels": labels,
            "files": [str(e.path) for e in evals], "alpha": alpha, "rows": rows,
            "pooled": {"cells": len(common), "results": pooled}, "versus": versus,
            "different_settings": _different_settings(evals)}


def _against_baseline(rows: list[dict[str, Any]], j: int, alpha: float) -> list[dict[str, Any] | None]:
    """Per row, evaluation ``j`` against the baseline (evaluation 0): the difference of success rates, Fisher's
    p, and whether it survives Holm's correction over the rows tested; None where either lacks the cell."""
    pairs = {i: (r["results"][j], r["results"][0]) for i, r in enumerate(rows)
             if r["results"][0] and r["results"][j] and r["results"][0][1] and r["results"][j][1]}
    ps = {i: fisher_exact_p(*ours, *base) for i, (ours, base) in pairs.items()}
    significant = dict(zip(ps, holm_significant(list(ps.values()), alpha)))
    out: list[dict[str, Any] | None] = [None] * len(rows)
    for i, (ours, base) in pairs.items():
        out[i] = {"difference": ours[0] / ours[1] - base[0] / base[1], "p": ps[i], "significant": significant[i]}
    return out


def _rate(kn: Sequence[int] | None) -> str:
    return "-" if not kn else f"{kn[0]}/{kn[1]} ({fmt(kn[0] / kn[1], 2) if kn[1] else '-'})"


def _versus_cells(v: Mapping[str, Any] | None) -> list[str]:
    if v is None:
        return ["-", "-"]
    return [f"{v['difference']:+.3f}" + (" *" if v["significant"] else ""), fmt(v["p"], 2)]


def compare_markdown(result: Mapping[str, Any]) -> str:
    labels = result["labels"]
    return f"# Compared: {', '.join(labels)} (baseline {labels[0]})\n\n" + compare_body(result)


def compare_body(result: Mapping[str, Any]) -> str:
    """The report without its title: settings that differ, the table, how to read it."""
    labels, base = result["labels"], result["labels"][0]
    headers = list(result["cell_columns"]) + [f"{lab} k/n" for lab in labels]
    for lab in labels[1:]:
        headers += [f"{lab} - {base}", "p"]
    lines = []
    for name, values in result["different_settings"].items():
        lines.append(f"- not like for like: `{name}` is " + ", ".join(f"{v!r} ({lab})" for lab, v in zip(labels, values)))
    pooled = result["pooled"]
    pooled_row = [f"pooled ({pooled['cells']} common cells)"] + [""] * (len(result["cell_columns"]) - 1)
    pooled_row += [_rate(kn) for kn in pooled["results"]]
    for v in result["versus"]:
        d, p = v["pooled_difference"], v["pooled_p"]
        pooled_row += ["-" if d is None else f"{d:+.3f}", fmt(p, 2)]
    rows = [pooled_row]
    for r in result["rows"]:
        row = list(r["cell"]) + [_rate(kn) for kn in r["results"]]
        for v in r["versus"]:
            row += _versus_cells(v)
        rows.append(row)
    if result["different_settings"]:
        lines.append("")
    lines += [markdown_table(headers, rows), "",
              f"p: two-sided Fisher's exact test against {base}, per cell; * a difference that stays significant at "
              f"{result['alpha']} after Holm's correction over that policy's cells. A cell a policy lacks shows -."]
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("evals", nargs="+", metavar="EVAL",
                   help="eval.json files of `quadforge eval`, folders holding one, or `eval-expert` folders; the "
                        "first is the baseline")
    p.add_argument("--labels", default=None, help="comma-separated names of the policies, in order (default: "
                   "their policy ids)")
    p.add_argument("--alpha", type=float, default=0.05, help="family-wise significance level (default 0.05)")
    p.add_argument("--table", default=None, metavar="FILE", help="also write the markdown report to this file")
    add_json(p, "the comparison")


def run(args: argparse.Namespace) -> int:
    if not 0.0 < args.alpha < 1.0:
        raise ValueError(f"--alpha {args.alpha}: must lie in (0, 1)")
    files = [f for arg in args.evals for f in evaluation_files(arg)]
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else [None] * len(files)
    if len(labels) != len(files):
        raise ValueError(f"--labels {args.labels}: {len(labels)} names for {len(files)} evaluations "
                         f"({', '.join(map(str, files))})")
    if args.table:
        check_output_file(args.table, flag="--table", owns=written_by("compare"))   # before any reading
    result = compare([load_evaluation(f, lab) for f, lab in zip(files, labels)], alpha=args.alpha)
    text = compare_markdown(result)
    print(text, end="")
    if args.table:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text(text + "\n" + table_marker("compare") + "\n")
    write_json(args.json, result)
    return 0
