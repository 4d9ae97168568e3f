"""The "Table III on our tasks" section of ``docs/results.md``, from a QUARD-Auto run's stored files alone.

Reads ``OUT/run.json`` (config, invocations), ``OUT/steps/*.json`` (one per finished step: its command and
wall time, collections' success/failure counts) and ``OUT/results/*.json`` (one per evaluation: model,
with/without failures, round, seed, family, successes, episodes, parameters), and writes the section
between two markers of the docs page, leaving the rest of the page as it is. Nothing here runs a model.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from quadforge.evaluation.metrics import wilson_interval
from quadforge.evaluation.reports import fmt, markdown_table
from quadforge.envs.quard.families import family_names
from quadforge.training.curves import read_val_curve
from quadforge.tools.results_report import QUARD_BEGIN as BEGIN
from quadforge.tools.results_report import QUARD_END as END
from quadforge.tools.results_report import around_markers, two_proportion_z

# Table III's rows: (model, trained with the auto-collected failures)
TABLE3_ROWS: tuple[tuple[str, bool], ...] = (("rt1", False), ("germ-il", False), ("germ-dense", False),
                                             ("germ-dense", True), ("germ", False), ("germ", True))
MODEL_NAMES = {"rt1": "RT-1-style", "germ-il": "GeRM w/o RL", "germ-dense": "GeRM w/o MoE", "germ": "GeRM"}

# seed 003 Table III (success %, per family go_to, go_avoid, stop, distinguish, go_through), for reference
PAPER_FAMILIES = ("go_to", "go_avoid", "stop", "distinguish", "go_through")
PAPER_TABLE3: dict[tuple[str, bool], tuple[float, ...]] = {
    ("rt1", False): (48.67, 33.50, 42.5, 44.33, 0.0), ("germ-il", False): (49.37, 46.37, 44.88, 52.00, 28.44),
    ("germ-dense", False): (55.01, 55.44, 43.93, 60.73, 35.34), ("germ-dense", True): (62.43, 60.89, 45.67, 63.55, 47.79),
    ("germ", False): (86.37, 87.36, 50.31, 75.50, 73.66), ("germ", True): (90.50, 85.50, 71.00, 82.50, 75.00)}


def load_run(out: Path) -> dict[str, Any]:
    """Everything the report reads, from the run directory's JSON files (and each training run's
    validation curve, ``OUT/train/<run>/val.jsonl`` and ``OUT/fig6/train/<model>/val.jsonl``)."""
    def read_all(folder: Path) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    # Table III's runs by name, Fig. 6's as fig6_<model>
    curves = {prefix + d.name: read_val_curve(d) for prefix, folder in (("", out / "train"), ("fig6_", out / "fig6" / "train"))
              for d in (sorted(folder.glob("*")) if folder.is_dir() else []) if d.is_dir()}
    return {"run": run, "steps": read_all(out / "steps"), "results": read_all(out / "results"),
            "curves": {k: v for k, v in curves.items() if v}, "fig6": read_all(out / "results" / "fig6")}


# what runs pooled into one table must share: the training budget and data sizes (scale), the starts and the
# training options (config); they differ in their seeds only
POOL_SAME_SCALE = ("preset", "train_steps", "batch_size", "demo_episodes", "auto_episodes")
POOL_SAME_CONFIG = ("task", "pretrained", "init", "train_overrides", "backend")


def load_pooled(outs: Sequence[Path]) -> dict[str, Any]:
    """``load_run`` of several run directories as one table: the results and curves of all, the first run's
    data and flywheel. A cluster runs each seed as its own job (``--seeds K --out runs/..._sK``); this puts
    them back together. Runs that differ in more than their seeds are refused (``check_poolable``)."""
    runs = [load_run(Path(o)) for o in outs]
    check_poolable(outs, runs)
    first = runs[0]
    if len(runs) == 1:
        return first
    return {**first, "results": [r for d in runs for r in d["results"]],
            "steps": [{**s, "pooled_from": str(o)} for o, d in zip(outs, runs) for s in d["steps"]],
            "curves": {k: v for d in runs for k, v in d["curves"].items()},
            "pooled": [(str(o), d["run"]) for o, d in zip(outs, runs)]}


def check_poolable(outs: Sequence[Path], runs: Sequence[Mapping[str, Any]]) -> None:
    """ValueError naming the run and the setting when two runs are not the same experiment on different seeds."""
    ref_out, ref = outs[0], runs[0]
    ref_eval = eval_per_cell(ref["steps"], ref["run"].get("scale", {}))
    for out, data in zip(outs, runs):
        if not data["run"]:
            raise FileNotFoundError(f"--pool {out}: no {out}/run.json; give the --out of a `quadforge reproduce "
                                    f"--stages quard` run")
    for out, data in zip(outs[1:], runs[1:]):
        for part, keys in (("scale", POOL_SAME_SCALE), ("config", POOL_SAME_CONFIG)):
            for key in keys:
                mine, theirs = data["run"].get(part, {}).get(key), ref["run"].get(part, {}).get(key)
                if mine != theirs:
                    raise ValueError(f"--pool {out}: its {key} ({mine}) is not {ref_out}'s ({theirs}); a pooled table "
                                     f"holds one experiment run on different seeds")
        mine_eval = eval_per_cell(data["steps"], data["run"].get("scale", {}))
        if mine_eval != ref_eval:
            raise ValueError(f"--pool {out}: {mine_eval} evaluation episodes per cell, {ref_out} {ref_eval}; a pooled "
                             f"table compares rows on the same evaluation")
    seen: dict[tuple[Any, ...], Path] = {}
    for out, data in zip(outs, runs):
        for r in data["results"]:
            key = (r["model"], r["failures"], r["round"], r["seed"])
            if seen.setdefault(key, out) != out:
                raise ValueError(f"--pool: {seen[key]} and {out} both hold seed {r['seed']} of "
                                 f"{row_label(r['model'], r['failures'])} (round {r['round']}); pool runs of "
                                 f"different seeds")


# a validation curve has flattened when its last quarter of training lowered the best loss by less than 2 %
FLAT_TAIL, FLAT_TOLERANCE = 0.25, 0.02


def flattening(rows: Sequence[Mapping[str, Any]], key: str = "loss") -> tuple[bool, float] | None:
    """(flattened, relative change of the best ``key`` over the last quarter of the steps) of one run's
    validation rows; negative: the tail still lowered it. None with fewer than four validations."""
    pts = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) is not None]
    if len(pts) < 4:
        return None
    cut = (1 - FLAT_TAIL) * pts[-1][0]
    before = min(v for st, v in pts if st <= cut)
    after = min(v for st, v in pts if st > cut)
    change = (after - before) / abs(before) if before else 0.0
    return change > -FLAT_TOLERANCE, change


def row_label(model: str, failures: bool) -> str:
    return f"{MODEL_NAMES.get(model, model)} ({'Y' if failures else 'N'})"


def pooled(rows: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    return sum(int(r["successes"]) for r in rows), sum(int(r["episodes"]) for r in rows)


def per_seed_rates(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """Success rate of each seed (families of ``rows`` pooled within the seed)."""
    by_seed: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_seed.setdefault(int(r["seed"]), []).append(r)
    return [k / n for k, n in (pooled(v) for _, v in sorted(by_seed.items())) if n > 0]


def spread(rows: Sequence[Mapping[str, Any]]) -> str:
    """Success % as mean ± sample std over seeds; one seed: the rate and its successes/episodes (no spread
    to give); '-' without results."""
    rates = [100 * r for r in per_seed_rates(rows)]
    if not rates:
        return "-"
    if len(rates) == 1:
        k, n = pooled(rows)
        lo, hi = wilson_interval(k, n)
        return f"{rates[0]:.1f} ({k}/{n}; {100 * lo:.0f}–{100 * hi:.0f})"
    return f"{np.mean(rates):.1f} ± {np.std(rates, ddof=1):.1f}"


def ztest_cell(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], gap: bool = False) -> str:
    """``k1/n1 vs k2/n2: z, p`` of a two-proportion test; ``gap``: also the difference in points with its 95 %
    (Wald, unpooled) interval."""
    (k1, n1), (k2, n2) = pooled(a), pooled(b)
    if n1 == 0 or n2 == 0:
        return "-"
    z, p = two_proportion_z(k1, n1, k2, n2)
    diff = ""
    if gap:
        p1, p2 = k1 / n1, k2 / n2
        half = 1.96 * math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
        diff = f" {100 * (p1 - p2):+.1f} points ({100 * (p1 - p2 - half):+.1f} to {100 * (p1 - p2 + half):+.1f}),"
    return f"{k1}/{n1} vs {k2}/{n2}:{diff} z = {z:.2f}, p = {p:.3g}{' *' if p < 0.05 else ''}"


def _select(results: Sequence[Mapping[str, Any]], **kw: Any) -> list[Mapping[str, Any]]:
    return [r for r in results if all(r.get(k) == v for k, v in kw.items())]


def _params(rows: Sequence[Mapping[str, Any]]) -> tuple[Any, Any]:
    p = next((r["parameters"] for r in rows if r.get("parameters")), None) or {}
    return p.get("total"), p.get("active")


SEED003_GERM_PARAMETERS = {"total": 83.48e6, "active": 39.31e6}   # seed 003 §IV: 39.31 M active of 83.48 M


def _millions(n: float) -> str:
    return f"{n / 1e6:.2f} M"


def parameters_section(counts: Mapping[str, Any] | None) -> list[str]:
    """Active / total parameters of each model at the cpu (shipped) and paper presets (run.json's
    ``preset_parameters``), GeRM's next to seed 003's."""
    lines = ["### Parameters: active of total", ""]
    if not counts:
        return lines + ["_Not recorded by this run_ (a run started before the counts were stored).", ""]
    presets = [p for p in ("cpu", "paper") if p in counts]
    header = ["model"] + [f"{p} preset ({counts[p]['image_size'][0]}²)" for p in presets]
    table = []
    for model in MODEL_NAMES:
        row = [MODEL_NAMES[model]]
        for p in presets:
            c = counts[p]["models"].get(model)
            row.append("-" if c is None else f"{_millions(c['active'])} of {_millions(c['total'])} "
                       f"({100 * c['active'] / c['total']:.0f} %)")
        table.append(row)
    s3 = SEED003_GERM_PARAMETERS
    table.append(["GeRM, seed 003", *(["-"] * (len(presets) - 1)),
                  f"{_millions(s3['active'])} of {_millions(s3['total'])} ({100 * s3['active'] / s3['total']:.0f} %)"])
    n_ins = counts[presets[0]].get("instructions")
    lines += [markdown_table(header, table), "",
              "Counted from the presets (training/vla.py) with the word vocabulary of the whole quard:all instruction "
              f"table ({n_ins} instructions); active = the parameters one token passes through (MoE: router + top-2 "
              "of 8 experts). The cpu preset is the one every row above trained; seed 003's GeRM is larger in total "
              "(its instruction encoder and trunk differ), but its active share is the same ≈ 1/2.", ""]
    return lines


def demo_count(cfg: Mapping[str, Any], steps: list[dict[str, Any]], scale: Mapping[str, Any]) -> Any:
    """The demonstrations the rounds started from: the scale's count, or what the ``--demos`` store held
    (its copy step's record), which is what the rows trained on."""
    if cfg.get("demos"):
        copied = [s["meta"]["episodes"] for s in steps if s.get("id") == "r0-demos" and "episodes" in s.get("meta", {})]
        if copied:
            return copied[0]
    return scale.get("demo_episodes")


def table3_section(data: Mapping[str, Any]) -> list[str]:
    """The "Table III on our tasks" section (module doc): how it was made, the data, success per family,
    GeRM against each baseline, the data flywheel over rounds, and the wall time and commands."""
    run, steps, results = data["run"], data["steps"], data["results"]
    lines = ["## Table III on our tasks", ""]
    if not results:
        return lines + ["_Not run yet._ `quadforge reproduce --stages quard --scale cpu` runs the QUARD-Auto loop "
                        "(see [quard_auto.md](quard_auto.md)); it needs the QUARD task envs and privileged expert "
                        "(issue 14) and the VLA models (issue 15), and says which piece is missing when one is.", ""]
    families = family_names()
    r0 = _select(results, round=0)
    head = _pooled_provenance(data["pooled"], steps) if data.get("pooled") else _provenance(run, steps)
    return (lines + head + _data_section(steps) + _success_section(r0, families)
            + parameters_section(run.get("preset_parameters")) + _germ_vs_baselines(r0, families)
            + _flywheel_section(results, steps, families) + curves_section(data.get("curves", {}))
            + fig6_section(data.get("fig6", [])) + _wall_time_section(steps))


# a model has "converged" at the first checkpoint within this many points of its best success
CONVERGED_WITHIN = 10.0


def fig6_section(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """Seed 003's Fig. 6 on our data: each model's success on one family against training epochs
    (demonstrations only), and the first epoch within ``CONVERGED_WITHIN`` points of its best."""
    if not points:
        return []
    fam = points[0]["family"]
    steps = sorted({int(p["step"]) for p in points})
    table = []
    for model in MODEL_NAMES:
        mine = {int(p["step"]): p for p in points if p["model"] == model}
        if not mine:
            continue
        rates = {st: 100 * p["successes"] / p["episodes"] for st, p in mine.items() if p["episodes"]}
        best = max(rates.values(), default=0.0)
        first = min((st for st, r in rates.items() if r >= best - CONVERGED_WITHIN), default=None)
        epoch = mine[first].get("epoch") if first is not None else None
        cells = [f"{rates[st]:.0f} ({mine[st]['successes']}/{mine[st]['episodes']})" if st in rates else ""
                 for st in steps]
        table.append([MODEL_NAMES[model]] + cells + [f"{best:.0f}",
                      f"step {first} (epoch {epoch:.1f})" if epoch is not None else f"step {first}"])
    epochs = {int(p["step"]): p.get("epoch") for p in points}
    head = [f"{st} ({epochs[st]:.1f})" if epochs.get(st) is not None else str(st) for st in steps]
    n = points[0]["episodes"]
    return ["### Fig. 6 on our data: success against training epochs", "",
            f"Each model trained on the {fam} demonstrations alone (`--success-only`, `families={fam}`), every "
            f"kept checkpoint evaluated on {n} {fam} episodes (seen colours). Columns: training step (epoch = "
            f"windows drawn / training windows); cells: success % (successes/episodes). Converged: the first "
            f"checkpoint within {CONVERGED_WITHIN:.0f} points of the model's best. Seed 003: GeRM about at RT-1's "
            f"20th-epoch level by epoch 2, converged by epoch 7, GeRM w/o MoE by about 8, the imitation rows not by 10.",
            "", markdown_table(("model", *head, "best %", "converged"), table), ""]


# a 24,000-step run validates ~40 times: the curve tables show this many of the validation steps, evenly spaced
CURVE_COLUMNS = 12


def shown_steps(steps: Sequence[int], most: int = CURVE_COLUMNS) -> list[int]:
    """At most ``most`` of the sorted ``steps``, evenly spaced, the first and the last among them."""
    if len(steps) <= most:
        return list(steps)
    return [steps[i] for i in sorted({round(k * (len(steps) - 1) / (most - 1)) for k in range(most)})]


def curves_section(curves: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Every training run's validation loss and greedy agreement at (up to ``CURVE_COLUMNS`` of) its
    validation steps, and whether the loss has flattened (``flattening``, over every validation). Losses
    compare within a row only: the Q rows' loss is TD + CQL, the others' cross-entropy; greedy agreement
    (the greedy bins equal the data's) compares across rows."""
    if not curves:
        return []
    every = sorted({int(r["step"]) for rows in curves.values() for r in rows})
    steps = shown_steps(every)
    shown = "" if steps == every else (f" Columns: {len(steps)} of the {len(every)} validation steps, evenly "
                                       "spaced; the flattening test reads every one.")
    lines = ["### Validation curves", "",
             f"Flattened: the last {FLAT_TAIL:.0%} of the steps lowered the best validation loss by less than "
             f"{FLAT_TOLERANCE:.0%}. Losses compare within a row (Q rows: TD + CQL; the others: cross-entropy); "
             "greedy agreement (the greedy bins equal the data's, all 12 dimensions) compares across rows." + shown, ""]
    for key, title in (("loss", "validation loss"), ("greedy_agreement", "greedy agreement")):
        table = []
        for run, rows in curves.items():
            at = {int(r["step"]): r.get(key) for r in rows}
            verdict = flattening(rows) if key == "loss" else None
            flat = "-" if verdict is None else f"{'yes' if verdict[0] else 'no'} ({100 * verdict[1]:+.1f} %)"
            table.append([run] + [fmt(at.get(st)) if at.get(st) is not None else "" for st in steps]
                         + ([flat] if key == "loss" else []))
        head = ("run", *map(str, steps)) + (("flattened",) if key == "loss" else ())
        lines += [f"**{title}** by training step", "", markdown_table(head, table), ""]
    return lines


def portable(text: str) -> str:
    """``text`` with every absolute path made portable for a published page (house rule: no path that exists
    only on the machine that ran it): under the working directory it becomes relative, elsewhere only its
    last name is kept (the page says how to rebuild the thing it names)."""
    cwd = Path.cwd()

    def shorten(m: "re.Match[str]") -> str:
        path = Path(m.group(0))
        return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else path.name
    return _ABSOLUTE_PATH.sub(shorten, text)


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~/-])/[^\s`'\"),\]]+")


def _invocations(commands: Sequence[str]) -> str:
    """The commands that made the run, a command run several times in a row (resumed) said once."""
    runs: list[tuple[str, int]] = []
    for c in commands:
        if runs and runs[-1][0] == c:
            runs[-1] = (c, runs[-1][1] + 1)
        else:
            runs.append((c, 1))
    return " then ".join(f"`{portable(c)}`" + (f" ({k} invocations: resumed)" if k > 1 else "") for c, k in runs)


def _provenance(run: Mapping[str, Any], steps: list[dict[str, Any]]) -> list[str]:
    """How the section was made: the commands, the run's times, scale, data sizes and seeds, its options."""
    cfg = run.get("config", {})
    return [f"Generated by {_made_by(run)} (`tools/reproduce_quard.py`; rebuild from the stored results with "
            f"`quadforge reproduce --stages quard --report-only --out {cfg.get('out', 'runs/reproduce_quard')}`). "
            + _run_summary(run, steps), ""] + _run_options(run)


def _run_options(run: Mapping[str, Any]) -> list[str]:
    """Where the run's data, collector and starting weights came from, and its training options."""
    cfg, scale = run.get("config", {}), run.get("scale", {})
    lines: list[str] = []
    if cfg.get("demos"):
        lines += [f"Demonstrations: the existing store `{portable(cfg['demos'])}` (`--demos`), not collected by this run.", ""]
    if cfg.get("train_overrides"):
        lines += ["Every training step also took " + ", ".join(f"`{o}`" for o in cfg["train_overrides"])
                  + " (`--train-override`).", ""]
    if not cfg.get("demos"):
        lines += ["Demonstrations: collected by this run's `demos` step (the first command under \"Wall time\"), so a "
                  "fresh clone rebuilds them with the same command.", ""]
    if cfg.get("pretrained"):
        lines += [f"Round 0's collector: the pre-trained VLA `{portable(cfg['pretrained'])}` (`--pretrained`), not trained by "
                  "this run.", ""]
    if cfg.get("init"):
        lines += [_init_line(cfg["init"]), ""]
    if scale.get("name") == "tiny":
        lines += ["**Toy scale.** This run checks the plumbing; its success rates say nothing about the models.", ""]
    return lines


def _made_by(run: Mapping[str, Any]) -> str:
    return _invocations(run.get("commands") or []) or "`quadforge reproduce --stages quard`"


def _run_summary(run: Mapping[str, Any], steps: list[dict[str, Any]]) -> str:
    """The run's times, scale, data sizes and seeds, one sentence."""
    cfg, scale = run.get("config", {}), run.get("scale", {})
    return (f"Run {run.get('started_utc')} → {run.get('finished_utc') or 'not finished'} UTC, "
            f"scale `{scale.get('name')}` ({scale.get('note')}): {demo_count(cfg, steps, scale)} demonstrations, "
            f"{scale.get('auto_episodes')} auto-collected episodes per round, "
            f"{scale.get('train_steps') or 'preset'} training steps × batch {scale.get('batch_size') or 'preset'} "
            f"(preset `{scale.get('preset')}`) for every model, {eval_per_cell(steps, scale)} evaluation episodes per "
            f"family and colour set (train, held_out) per seed, seeds {list(cfg.get('seeds', []))}.")


def _steps_of(steps: list[dict[str, Any]], out: str) -> list[dict[str, Any]]:
    """The steps of one of the pooled runs (``load_pooled`` tags each with its run's directory)."""
    return [s for s in steps if s["pooled_from"] == out]


def _pooled_provenance(pooled: Sequence[tuple[str, Mapping[str, Any]]], steps: list[dict[str, Any]]) -> list[str]:
    """How a pooled section was made: the command that rebuilds it, then each run's commands and summary, and
    the options they share."""
    outs = [o for o, _ in pooled]
    seeds = sorted({int(s) for _, run in pooled for s in run.get("config", {}).get("seeds", [])})
    rebuild = portable(f"quadforge reproduce --stages quard --report-only --out {outs[0]} "
                       + " ".join(f"--pool {o}" for o in outs[1:]))
    lines = [f"Pooled from {len(pooled)} runs of one experiment on different seeds ({seeds}): every table below "
             f"counts the results of all of them (rebuild with `{rebuild}`); the data table lists each run's "
             "collections, and the flywheel's collector successes are the first run's. Each run:", ""]
    for out, run in pooled:
        lines += [f"- `{portable(out)}`: {_made_by(run)}. {_run_summary(run, _steps_of(steps, out))}"]
    # the options every run shares (check_poolable): said once, from the first run
    return lines + [""] + _run_options(pooled[0][1])


def _init_line(inits: list[str]) -> str:
    """Which checkpoint each model's trainings started from (``--init``), and which of them were upcycled."""
    from quadforge.models.checkpoint import load_checkpoint
    from quadforge.training.grounding import upcycles
    parts, upcycled = [], False
    for item in inits:
        model, _, path = item.partition("=")
        try:
            start = load_checkpoint(path).model_name
        except (OSError, ValueError):   # the checkpoint is gone: say what was given
            start = model
        up = upcycles(start, model)
        upcycled |= up
        parts.append(f"{MODEL_NAMES.get(model, model)} from `{portable(path)}`" + (" (upcycled)" if up else ""))
    line = "Starting weights (`--init`): every training of " + "; ".join(parts) + "."
    if upcycled:
        line += (" Upcycled: a GeRM w/o MoE checkpoint starts an MoE model with every expert a copy of its dense FFN "
                 "(docs/vla.md), so those experts have the dense FFN's width: their parameter counts are the success "
                 "table's, not the preset counts below.")
    return line


def eval_per_cell(steps: list[dict[str, Any]], scale: Mapping[str, Any]) -> Any:
    """Evaluation episodes per family, colour set and seed: what the eval steps ran (a power-sized scale
    derives it from the seed count), else the scale's number."""
    for st in steps:
        argv = st.get("argv") or []
        if st.get("stage") == "eval" and "--episodes-per-cell" in argv:
            return int(argv[argv.index("--episodes-per-cell") + 1])
    return scale.get("eval_episodes")


def _data_section(steps: list[dict[str, Any]]) -> list[str]:
    """One row per collection step: its policy, episodes and successes per family, speed."""
    table = []
    for st in sorted((s for s in steps if s.get("collection")), key=lambda s: s["started_utc"]):
        c = st["collection"]
        per = c.get("per_family", {})
        split = ", ".join(f"{f}: {v['successes']}/{v['successes'] + v['failures']}" for f, v in sorted(per.items()))
        source = st["meta"].get("policy") or ("copy of the demonstrations" if st["stage"] == "auto" else "quard_expert")
        resumed = f" ({c['resumed_with']} before this invocation)" if c.get("resumed_with") else ""
        step = f"{st['id']} ({portable(st['pooled_from'])})" if st.get("pooled_from") else st["id"]
        table.append([step, c.get("collector"), source, f"{c.get('episodes')}{resumed}",
                      split if c.get("success_labels") else "no labels", fmt(st["wall_s"]),
                      fmt(c.get("episodes_per_min"))])
    return ["### The data", "",
            markdown_table(("step", "collector id", "policy", "episodes", "successes/episodes per family",
                            "wall s (this invocation)", "episodes/min"), table),
            "", "Training store of round k = a copy of the demonstrations + round k's auto-collection. (N) rows train "
            "on its successful episodes only (`--success-only`); (Y) rows on everything, successes:failures "
            "75.69 %:24.31 % per batch, sparse reward 1 at a success's end.", ""]


def _success_section(r0: list[Mapping[str, Any]], families: Sequence[str]) -> list[str]:
    """Table III itself: success per family of every model row of round 0, mean ± std over seeds."""
    table = []
    for model, failures in TABLE3_ROWS:
        rows = _select(r0, model=model, failures=failures)
        if not rows:
            continue
        total, active = _params(rows)
        table.append([row_label(model, failures), fmt(total), fmt(active), "Y" if failures else "N",
                      len({r["seed"] for r in rows})] + [spread(_select(rows, family=f)) for f in families]
                     + [spread(rows)])
    return ["### Success per family (%, mean ± std over seeds; one seed: successes/episodes; 95 % Wilson interval)", "",
            markdown_table(("model", "total params", "active params", "failures", "seeds", *families, "all"), table),
            "", "Seed 003's Table III for reference (its data and sizes, success %): "
            + "; ".join(f"{row_label(m, f)} " + "/".join(f"{v:g}" for v in vals) for (m, f), vals in PAPER_TABLE3.items())
            + f" ({'/'.join(PAPER_FAMILIES)}).", ""]


def _germ_vs_baselines(r0: list[Mapping[str, Any]], families: Sequence[str]) -> list[str]:
    """GeRM (Y) against each other row: successes pooled over seeds, a two-proportion z-test per family."""
    germ = _select(r0, model="germ", failures=True)
    if not germ:
        return []
    table = []
    for model, failures in TABLE3_ROWS:
        base = _select(r0, model=model, failures=failures)
        if (model, failures) != ("germ", True) and base:
            table.append([row_label(model, failures)]
                         + [ztest_cell(_select(germ, family=f), _select(base, family=f)) for f in families]
                         + [ztest_cell(germ, base, gap=True)])
    return ["### GeRM (Y) vs each baseline", "",
            "Successes pooled over seeds, two-proportion z-test (pooled variance), two-sided p; * p < 0.05. All "
            "families: GeRM (Y) minus the baseline in points, with its 95 % interval.", "",
            markdown_table(("baseline", *families, "all"), table), ""]


def _flywheel_section(results: list[Mapping[str, Any]], steps: list[dict[str, Any]],
                      families: Sequence[str]) -> list[str]:
    """Each round's GeRM (Y) against the previous round's, with the round's collector successes."""
    rounds = sorted({int(r["round"]) for r in results})
    if len(rounds) < 2:
        return []
    table, prev = [], None
    for rnd in rounds:
        rows = _select(results, round=rnd, model="germ", failures=True)
        coll = next((s["collection"] for s in steps if s["id"] == f"r{rnd}-auto" and s.get("collection")), None)
        collected = f"{sum(v['successes'] for v in coll['per_family'].values())}/{coll['episodes']}" if coll else "-"
        verdict = "-"
        if prev is not None and rows:
            (k1, n1), (k2, n2) = pooled(rows), pooled(prev)
            z, p = two_proportion_z(k1, n1, k2, n2)
            verdict = f"z = {z:.2f}, p = {p:.3g}: " + ("rises" if p < 0.05 and z > 0 else
                                                         "falls" if p < 0.05 else "not distinguishable")
        table.append([rnd, collected] + [spread(_select(rows, family=f)) for f in families] + [spread(rows), verdict])
        prev = rows or prev
    return ["### The data flywheel", "",
            "Round k+1 collects with round k's GeRM (Y, first seed) and trains GeRM (Y) on the demonstrations "
            "+ that collection; the z-test compares each round's GeRM with the previous round's.", "",
            markdown_table(("round", "collector successes", *families, "GeRM (Y) all", "vs previous round"), table), ""]


def _elapsed_h(steps: list[dict[str, Any]]) -> float | None:
    """Hours from the first step's start to the last step's end (steps run side by side with --jobs)."""
    from datetime import datetime, timedelta
    spans = [(datetime.strptime(s["started_utc"], "%Y-%m-%d %H:%M:%S"), float(s["wall_s"])) for s in steps
             if s.get("started_utc")]
    if not spans:
        return None
    first = min(t for t, _ in spans)
    last = max(t + timedelta(seconds=w) for t, w in spans)
    return (last - first).total_seconds() / 3600


def _wall_time_section(steps: list[dict[str, Any]]) -> list[str]:
    """Wall time per stage, and every command in the order it ran (folded); pooled runs each by itself."""
    lines = ["### Wall time", ""]
    if not (steps and "pooled_from" in steps[0]):
        return lines + _wall_time_lines(steps)
    for out in dict.fromkeys(s["pooled_from"] for s in steps):
        lines += [f"#### `{portable(out)}`", ""] + _wall_time_lines(_steps_of(steps, out))
    return lines


def _wall_time_lines(steps: list[dict[str, Any]]) -> list[str]:
    wall: dict[str, float] = {}
    for s in steps:
        wall[s["stage"]] = wall.get(s["stage"], 0.0) + float(s["wall_s"])
    total = sum(wall.values())
    elapsed = _elapsed_h(steps)
    span = "" if elapsed is None else (f" From the first step's start to the last one's end: {elapsed:.2f} h (steps "
                                       "run side by side with `--jobs`; a run stopped and resumed counts its pause).")
    return (["Summed over steps, seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in wall.items())
             + f"; all {total:.0f} ({total / 3600:.2f} h)." + span, "", "<details><summary>The exact commands, in the order "
             f"they ran ({len(steps)} steps)</summary>", "", "```"]
            + [s["command"] for s in sorted(steps, key=lambda s: s["started_utc"])] + ["```", "", "</details>", ""])


def replace_section(page: str, section: Sequence[str]) -> str:
    """``page`` with the text between the markers replaced by ``section`` (appended when it has none)."""
    block = "\n".join([BEGIN, *section, END])
    around = around_markers(page, BEGIN, END)
    if around is not None:
        return around[0] + block + around[1]
    return page.rstrip("\n") + "\n\n" + block + "\n"


def update_docs(out: Path, docs: Path, pool: Sequence[Path] = ()) -> Path:
    """Rewrite ``docs``' Table III section from the run in ``out`` (and, pooled with it, the runs in ``pool``)."""
    data = load_pooled([out, *pool])   # the refusals come before the page is touched
    page = docs.read_text() if docs.exists() else "# Results\n"
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(replace_section(page, table3_section(data)))
    return docs
