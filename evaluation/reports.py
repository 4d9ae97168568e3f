"""Markdown tables and PNG plots of evaluation results (``evaluation.evaluate``'s result dicts).

Plots use matplotlib's Agg backend (no display). Numbers are printed as measured, to 3 significant
figures; NaN (a metric undefined for every episode of a cell) prints as "-".
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:.{digits}g}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


CELL_HEADERS = ("policy", "commands", "terrain", "level", "episodes", "success", "success 95% CI", "fall",
                "return", "lin err m/s", "yaw err rad/s", "distance m", "HF action energy")


def _cell_row(policy: str, c: Mapping[str, Any]) -> list[Any]:
    lo, hi = c["success_ci95"]
    ci = f"{fmt(lo, 2)}-{fmt(hi, 2)}"
    return [policy, c["command_set"], c["terrain_type"], c["terrain_level"], c["episodes"], c["success"], ci,
            c["fall"], c["return"], c["lin_vel_error"], c["ang_vel_error"], c["distance"], c["high_freq_energy"]]


def cells_table(results: Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None) -> str:
    """One row per policy x command set x terrain type x level."""
    labels = list(labels) if labels is not None else [r["policy_id"] for r in results]
    rows = [_cell_row(label, c) for label, r in zip(labels, results) for c in r["cells"]]
    return markdown_table(CELL_HEADERS, rows)


def overall_table(results: Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None) -> str:
    """One row per policy: everything pooled, plus act() latency."""
    labels = list(labels) if labels is not None else [r["policy_id"] for r in results]
    headers = ("policy", "episodes", "success", "fall", "return", "lin err m/s", "distance m",
               "HF action energy", "act ms (batch)", "act ms / env")
    rows = []
    for label, r in zip(labels, results):
        o, lat = r["overall"], r["latency"]
        rows.append([label, o["episodes"], o["success"], o["fall"], o["return"], o["lin_vel_error"], o["distance"],
                     o["high_freq_energy"], lat["act_ms_mean"], lat["act_ms_per_env"]])
    return markdown_table(headers, rows)


def eval_report_markdown(result: Mapping[str, Any], plots: Mapping[str, str] | None = None,
                         title: str | None = None) -> str:
    cfg = result["config"]
    lines = [f"# {title or 'Evaluation: ' + str(result['policy_id'])}", "",
             f"- policy: `{result['policy']}` (`{result['policy_id']}`), robot {cfg['robot']}",
             f"- terrain `{cfg['terrain']}`, levels `{cfg['levels']}` of {cfg['num_levels']}, "
             f"{cfg['episodes']} episodes per cell, command sets {cfg['commands']}, "
             f"{cfg['max_episode_s']} s episodes, {cfg['num_envs']} envs, seed {cfg['seed']}",
             f"- success: the labelling rule of `collection/labels.py` ({cfg['label_rule']})",
             "- fall: share of episodes ending in a fall or base collision; HF action energy: share of the "
             "action sequence's energy above 5 Hz at 50 Hz control (0 smooth, ~0.8 white noise)",
             f"- act latency: {fmt(result['latency']['act_ms_mean'])} ms per control step for "
             f"{result['latency']['batch']} envs ({fmt(result['latency']['act_ms_per_env'])} ms/env)",
             f"- wall time {fmt(result['wall_s'])} s on {result['machine']['platform']} "
             f"({result['machine']['cpus']} CPUs), finished {result['finished_utc']} UTC", "",
             "## Overall", "", overall_table([result]), "", "## Per cell", "", cells_table([result]), ""]
    if result.get("video"):
        lines += [f"Video: `{Path(result['video']).name}`", ""]
    for name in (plots or {}).values():
        lines += [f"![{name}]({name})", ""]
    return "\n".join(lines)


def plot_vs_level(results: Mapping[str, Mapping[str, Any]], out: str | Path,
                  prefix: str = "") -> dict[str, Path]:
    """success and return vs level, one line per policy x terrain type x command set; two PNGs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for key, ylabel in (("success", "success rate"), ("return", "mean return")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        colors: dict[str, Any] = {}   # one colour per terrain type, one line style per policy
        styles = ("-", "--", ":", "-.")
        for pi, (label, r) in enumerate(results.items()):
            series: dict[tuple[str, str], list[tuple[int, float]]] = {}
            for c in r["cells"]:
                series.setdefault((c["terrain_type"], c["command_set"]), []).append((c["terrain_level"], c[key]))
            for (ttype, cmd), pts in sorted(series.items()):
                pts.sort()
                name = f"{label} {ttype}" + (f" [{cmd}]" if len({k[1] for k in series}) > 1 else "")
                color = colors.setdefault(ttype, f"C{len(colors) % 10}")
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name, color=color,
                        linestyle=styles[pi % len(styles)])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("terrain level")
        ax.set_ylabel(ylabel)
        if key == "success":
            ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        path = out / f"{prefix}{key}_vs_level.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths[f"{key}_png"] = path
    return paths
