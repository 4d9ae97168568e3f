"""``docs/results.md`` from a reproduction's ``results.json`` (``tools/reproduce.py``).

Only numbers present in the results file (and the latency table ``quadforge bench models`` wrote into
``docs/models.md``) are printed; a stage that has not run says so.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from quadforge.evaluation.reports import fmt, markdown_table

# the markers of the "Table III on our tasks" section, written by tools/quard_report.py and kept by write_report
QUARD_BEGIN, QUARD_END = "<!-- table3-quard:begin -->", "<!-- table3-quard:end -->"
# the markers around section 1, so that it alone can be rebuilt from another run (write_report(only="imitation"))
IMITATION_BEGIN, IMITATION_END = "<!-- imitation:begin -->", "<!-- imitation:end -->"
IMITATION_HEADING = "## 1. Imitation: FCNet vs Transformer vs DC vs MLP (seed 000 Fig. 4's question)"
SECTIONS = ("imitation",)


def _ms(values: Sequence[float]) -> str:
    """mean ± std (sample std over seeds; ± 0 for a single seed is written as n=1)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{fmt(vals[0])} (n=1)"
    return f"{fmt(float(np.mean(vals)))} ± {fmt(float(np.std(vals, ddof=1)), 2)}"


def _group(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[tuple, list[Mapping[str, Any]]]:
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return groups


def _at_commit(data: Mapping[str, Any]) -> str:
    head = (data.get("git") or {}).get("head")
    return f" at commit `{head[:10]}`" if head else ""


def imitation_section(data: Mapping[str, Any], docs_dir: Path) -> list[str]:
    rows = data.get("imitation", [])
    if not rows:
        return ["_Not run yet._", ""]
    cfg = data["config"]
    d = data.get("imitation_data", {})
    lines = [f"Data: the gait expert (`experts/gait.py`), `walking` commands on `{cfg['data_terrain']}` "
             f"(curriculum on), {fmt(cfg['max_episode_s'])} s episodes; one collection of {d.get('episodes')} "
             f"episodes / {d.get('steps')} env steps ({fmt(d.get('seconds'))} s), the three datasets are its "
             "first episodes reaching each size. Training: `cpu` preset of each model "
             f"(`models/zoo_presets.py`{_at_commit(data)}), {cfg['train_steps']} optimizer steps, batch {cfg['batch_size']}, "
             f"seeds {list(cfg['seeds'])}. Evaluation: `{cfg['eval_terrain']}` × levels `{cfg['eval_levels']}`, "
             f"{cfg['eval_episodes']} episodes per cell (walking commands), success by `collection/labels.py`.", ""]
    expert = data.get("expert_eval")
    if expert:
        lines += [f"Reference, the gait expert itself on the same sweep: success {fmt(expert['success'])}, return "
                  f"{fmt(expert['return'])}, fall {fmt(expert['fall'])} ({expert['episodes']} episodes).", ""]
    table = []
    for (model, size), group in sorted(_group(rows, ("model", "size")).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        table.append([model, size, group[0]["data_steps"], group[0]["params"], len(group),
                      _ms([g["val_loss"] for g in group]), _ms([g["success"] for g in group]),
                      _ms([g["return"] for g in group]), _ms([g["fall"] for g in group]),
                      _ms([g["lin_vel_error"] for g in group]), _ms([g["high_freq_energy"] for g in group]),
                      _ms([g["act_ms"] for g in group]), _ms([g["train_s"] for g in group])])
    lines.append(markdown_table(("model", "size (steps)", "data steps", "params", "seeds", "val loss", "success",
                                 "return", "fall", "lin err m/s", "HF action energy",
                                 f"act ms ({cfg['num_envs']} envs)", "train s"), table))
    lines.append("")
    lines += _imitation_findings(rows)
    plot = _plot_imitation(rows, docs_dir)
    if plot:
        lines += [f"![success vs data size]({plot.name})", ""]
    return lines


def _pooled(group: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(successes, episodes) over every seed's evaluation."""
    n = sum(int(g["episodes"]) for g in group)
    k = int(round(sum(float(g["success"]) * int(g["episodes"]) for g in group)))
    return k, n


def two_proportion_z(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """The pooled two-proportion z-test of k1/n1 vs k2/n2: (z, two-sided p).

    z = (p1 - p2) / sqrt(p (1 - p) (1/n1 + 1/n2)) with the pooled p = (k1 + k2) / (n1 + n2); p from the
    normal tail, 2 (1 - Phi(|z|)) = erfc(|z| / sqrt 2). Equal proportions at 0 or 1 (no spread) give z = 0,
    p = 1; an empty side gives no evidence either.
    """
    if n1 <= 0 or n2 <= 0:
        return 0.0, 1.0
    p = (k1 + k2) / (n1 + n2)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    z = (k1 / n1 - k2 / n2) / se if se > 0 else 0.0
    return z, math.erfc(abs(z) / math.sqrt(2))


def _compare(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> str:
    """Success of a vs b, pooled over seeds, by a two-proportion z-test at the 5 % level."""
    (k1, n1), (k2, n2) = _pooled(a), _pooled(b)
    z, _ = two_proportion_z(k1, n1, k2, n2)
    verdict = "not distinguishable" if abs(z) < 1.96 else ("higher" if z > 0 else "lower")
    return f"{k1}/{n1} vs {k2}/{n2} episodes, z = {z:.2f}: {verdict}"


def _imitation_findings(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """FCNet vs Transformer per size, in words computed from the table (the question of seed 000 Fig. 4)."""
    groups = _group(rows, ("model", "size"))
    sizes = sorted({r["size"] for r in rows})
    out = []
    for size in sizes:
        f, t = groups.get(("fcnet", size)), groups.get(("transformer", size))
        if not f or not t:
            continue
        fv = [g["val_loss"] for g in f if g["val_loss"] is not None]
        tv = [g["val_loss"] for g in t if g["val_loss"] is not None]
        means = {m: float(np.mean([g["success"] for g in groups[(m, s)]])) for (m, s) in groups if s == size}
        top = max(means.values())
        best = ", ".join(sorted(m for m, v in means.items() if v == top))
        out.append(f"- {size} steps: FCNet vs Transformer success {_compare(f, t)}; validation loss "
                   f"{fmt(float(np.mean(fv)) if fv else None)} vs {fmt(float(np.mean(tv)) if tv else None)}; "
                   f"highest mean success at this size: {best} ({fmt(top)}).")
    return (["FCNet vs Transformer, computed from the runs (success pooled over seeds, two-proportion z-test at "
             "5 %):", ""] + out + [""]) if out else []


def _plot_imitation(rows: Sequence[Mapping[str, Any]], docs_dir: Path) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for model, group in sorted(_group(rows, ("model",)).items()):
        by_size = _group(group, ("size",))
        sizes = sorted(s[0] for s in by_size)
        for ax, key in zip(axes, ("success", "val_loss")):
            vals = [[float(g[key]) for g in by_size[(s,)] if g[key] is not None] for s in sizes]
            ax.errorbar(sizes, [np.mean(v) for v in vals], yerr=[np.std(v) for v in vals], marker="o",
                        capsize=3, label=model[0])
    all_sizes = sorted({int(r["size"]) for r in rows})
    for ax, label in zip(axes, ("closed-loop success rate", "validation loss (normalised MSE)")):
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(all_sizes, [f"{s / 1000:g}k" for s in all_sizes])
        ax.set_xlabel("dataset size (env steps)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    docs_dir.mkdir(parents=True, exist_ok=True)
    path = docs_dir / "results_imitation.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def germ_section(data: Mapping[str, Any]) -> list[str]:
    rows = data.get("germ", [])
    if not rows:
        return ["_Not run yet._", ""]
    cfg = data["config"]
    d = data.get("germ_data", {})
    lines = [f"Data: {cfg['germ_episodes_clean']} episodes of the gait expert plus {cfg['germ_episodes_noisy']} "
             f"with action noise σ={cfg['germ_action_noise']} and pushes up to {cfg['germ_push']} m/s "
             f"(`{cfg['data_terrain']}`): {d.get('episodes')} episodes, {d.get('steps')} steps, success fraction "
             f"{fmt(d.get('success_fraction'))}. GeRM and GeRM w/o MoE draw successes:failures 75.69:24.31 "
             "(seed 003); GeRM w/o RL imitates successes only. Same evaluation sweep as above.", ""]
    names = {"germ": "GeRM", "germ-il": "GeRM w/o RL", "germ-dense": "GeRM w/o MoE"}
    table = []
    for (model,), group in _group(rows, ("model",)).items():
        g0 = group[0]
        table.append([names.get(model, model), g0["params"], f"{g0['layers']}×{g0['d_model']}, ctx {g0['context']}",
                      g0["train_steps"], len(group), _ms([g.get("val_greedy_agreement") for g in group]),
                      _ms([g["success"] for g in group]),
                      _ms([g["return"] for g in group]), _ms([g["fall"] for g in group]),
                      _ms([g["act_ms"] for g in group]), _ms([g["train_s"] for g in group])])
    lines.append(markdown_table(("variant", "params", "network", "train steps", "seeds", "val greedy = data bin",
                                 "success", "return", "fall", f"act ms ({cfg['num_envs']} envs)", "train s"), table))
    groups = _group(rows, ("model",))
    if ("germ",) in groups:
        lines += ["", "GeRM vs its ablations (success pooled over seeds, two-proportion z-test at 5 %):", ""]
        for other in ("germ-il", "germ-dense"):
            if (other,) in groups:
                lines.append(f"- GeRM vs {names[other]}: {_compare(groups[('germ',)], groups[(other,)])}.")
    return lines + [""]


def latency_section(models_md: Path) -> list[str]:
    if not models_md.exists():
        return [f"_`{models_md}` does not exist yet (`quadforge bench models` writes it)._", ""]
    text = models_md.read_text().splitlines()
    out, inside = [], False
    for line in text:
        if line.startswith("_Generated by `quadforge bench models`"):
            out += [line, ""]
        if line.startswith("### step latency"):
            inside = True
        elif inside and line.startswith("### "):
            break
        if inside:
            out.append(line)
    if not out:
        return [f"_No latency table in `{models_md}`._", ""]
    return ["Quoted from [`docs/models.md`](models.md) (batch-1 `step`, one thread, matched parameters; "
            "method there):", ""] + out + ["", "![latency vs context](latency_vs_context.png)", ""]


def _provenance(data: Mapping[str, Any], what: str, it: str, rebuild: str) -> list[str]:
    """Which commands wrote ``what``, when, on what machine and code, and how to rebuild it."""
    cfg = data.get("config", {})
    m = data.get("machine", {})
    commands = data.get("commands") or ([data["command"]] if data.get("command") else [])
    generated = " then ".join(f"`{c}`" for c in commands) or "`quadforge reproduce`"
    git = data.get("git") or {}
    lines = [f"{what} by {generated} (`tools/reproduce.py`; rebuild {it} from the stored results with "
             f"`{rebuild} --out {cfg.get('out', 'runs/reproduce')}`). Run "
             f"{data.get('started_utc')} → {data.get('finished_utc')} UTC on {m.get('platform')}, "
             f"{m.get('cpus')} CPUs shared with other engineers (load average {fmt(m.get('load_avg_1m'))} at "
             f"the start), torch {m.get('torch')} with 1 thread, no GPU. Wall time (summed over the invocations): imitation "
             f"{fmt(data.get('imitation_wall_s'))} s, GeRM {fmt(data.get('germ_wall_s'))} s."
             + (f" Code at the last invocation: commit `{git['head'][:10]}`" + (f" with uncommitted changes in {', '.join(git['modified'])} "
                "(the tree is shared with other teams)" if git.get("modified") else "") + "." if git.get("head") else ""),
             ""]
    if cfg.get("quick"):
        lines += ["**Scaled down.** This is the `--quick` run: dataset sizes "
                  f"{list(cfg['sizes'])} env steps instead of 50k/250k/1M, {cfg['train_steps']} training steps, "
                  f"{list(cfg['seeds'])} seeds and a small evaluation sweep, because the whole run has to finish "
                  "in well under an hour on a 2-core machine shared by ~8 engineers. The command accepts the full "
                  "sizes (`--sizes 50000,250000,1000000 --train-steps N --seeds 0,1,2`). At these sizes the "
                  "numbers say how the pipeline behaves, not what the papers' models reach; read them with the "
                  "spread over seeds.", ""]
    return lines


def _imitation_block(data: Mapping[str, Any], page: Path, provenance: bool) -> list[str]:
    """Section 1 between its markers (with its own provenance when it is rebuilt alone)."""
    lines = [IMITATION_BEGIN, IMITATION_HEADING, ""]
    if provenance:
        lines += _provenance(data, "This section was generated", "this section alone",
                             f"quadforge reproduce --report-only --report-section imitation --docs {page}")
    return lines + imitation_section(data, page.parent) + [IMITATION_END, ""]


def around_markers(page: str, begin: str, end: str) -> tuple[str, str] | None:
    """The text before ``begin`` and after ``end`` (markers excluded), or None when the page lacks either:
    how every generated section of a results page is swapped for its rebuild."""
    if begin not in page or end not in page:
        return None
    before, rest = page.split(begin, 1)
    return before, rest.split(end, 1)[1]


def _replace_section(old: str, block: str, path: Path) -> str:
    """``old`` with section 1 (between its markers, else from its heading to the next '## ') replaced."""
    around = around_markers(old, IMITATION_BEGIN, IMITATION_END)
    if around is not None:
        return around[0] + block + "\n" + around[1].lstrip("\n")
    if IMITATION_HEADING not in old:
        raise ValueError(f"{path}: no section 1 (neither {IMITATION_BEGIN} nor '{IMITATION_HEADING}') to replace")
    before, rest = old.split(IMITATION_HEADING, 1)
    nxt = rest.find("\n## ")
    return before + block + "\n" + (rest[nxt + 1:] if nxt >= 0 else "")


def write_report(data: Mapping[str, Any], path: Path, only: str | None = None) -> Path:
    """The whole page from ``data``, or with ``only="imitation"`` its section 1 alone, the rest of the
    existing page (another run's sections, hand-written reading after the section's end marker) kept."""
    if only is not None:
        if only not in SECTIONS:
            raise ValueError(f"report section {only!r}; allowed: {', '.join(SECTIONS)}")
        if not path.exists():
            raise FileNotFoundError(f"{path}: no page to rewrite a section of (omit the section to write the page)")
        block = "\n".join(_imitation_block(data, path, provenance=True))
        path.write_text(_replace_section(path.read_text(), block, path))
        return path
    lines = ["# Results: first reproduction", ""]
    lines += _provenance(data, "Generated", "this page", "quadforge reproduce --report-only")
    lines += _imitation_block(data, path, provenance=False)
    lines += ["## 2. GeRM vs GeRM w/o RL vs GeRM w/o MoE (seed 003 Table III's question)", ""]
    lines += germ_section(data)
    lines += ["## 3. Inference latency vs context length (seed 000 Fig. 6)", ""]
    lines += latency_section(path.parent / "models.md")
    lines += ["## Notes", "",
              "- Mean ± sample standard deviation over training seeds; each seed's evaluation uses its own "
              "evaluation seed (1000 + seed).",
              "- Success is the labelling rule of `collection/labels.py` (no fall, mean tracking error "
              "≤ 0.35 m/s and ≤ 0.5 rad/s, at least half the commanded displacement).",
              "- The learned policies imitate the gait expert's actions (every episode, failures included), so "
              "the expert's own success on the same sweep (the reference line of section 1) is their ceiling.",
              "- Validation losses are on each dataset's own held-out episodes (10 %), so they compare models "
              "at one size, not sizes with each other (the smallest sets hold out only a few episodes).",
              "- Parameters are not matched across the imitation models: each runs its `cpu` preset "
              "(`models/zoo_presets.py`, see the params column), so the comparison is of those presets at this "
              "training length, not of the architectures at their best.",
              "- GeRM's 'val greedy = data bin' is the share of held-out (step, action dimension) pairs where its "
              "greedy bin equals the dataset's (256 bins per dimension; chance ≈ 0.4 %): how far its Q-function got in the "
              "steps it was given.",
              "- Per-run outputs (checkpoints, eval reports with per-cell tables and plots) are under the run "
              "directory; every number here is in its `results.json`.", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    page = "\n".join(lines)
    old = path.read_text() if path.exists() else ""
    if QUARD_BEGIN in old and QUARD_END in old:   # keep the QUARD section (tools/quard_report.py) as it is
        page = page.rstrip("\n") + "\n\n" + QUARD_BEGIN + old.split(QUARD_BEGIN, 1)[1].split(QUARD_END, 1)[0] + QUARD_END + "\n"
    path.write_text(page)
    return path
