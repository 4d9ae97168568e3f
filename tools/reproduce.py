"""`quadforge reproduce`: the first reproduction report, ``docs/results.md``, from one command.

    quadforge reproduce [--quick] [--out runs/reproduce] [--docs docs/results.md]
                        [--sizes 50000,250000,1000000] [--seeds 0,1,2] [--train-steps 300] [--report-only]
                        [--report-section imitation]

Three questions, each answered by measurements taken in this run (nothing is copied from a paper):

1. Imitation (seed 000 Fig. 4): FCNet vs Transformer vs Decision ConvFormer vs MLP trained on the
   gait expert's locomotion data at three dataset sizes (env steps: nested prefixes of one collection,
   so a larger set contains the smaller), each evaluated closed loop over terrain types x levels with
   ``evaluation.evaluate``; several seeds, mean and spread.
2. GeRM (seed 003 Table III): GeRM vs GeRM w/o RL (``germ-il``) vs GeRM w/o MoE (``germ-dense``) trained
   on successes and failures (the gait expert clean, plus with action noise and pushes), evaluated on
   success rate.
3. Inference latency vs context (seed 000 Fig. 6): quoted from ``docs/models.md``
   (``quadforge bench models``, team models).

Every stage appends to ``OUT/results.json`` as it finishes and the report is rebuilt from that file, so an
interrupted run still documents what it measured (``--report-only`` rebuilds the report alone), and a rerun
with the same ``--out`` resumes: the store is topped up, finished (model, size, seed) runs are skipped and an
unfinished imitation run continues from its ``last.pt`` (the same weights as an uninterrupted run; a GeRM
run is retrained from its start). ``--report-section imitation`` rewrites only section 1 of an
existing page (with its own provenance line), so one page can hold sections measured by different runs.
``--quick`` scales everything down to finish in well under an hour on a shared 2-core machine; the
defaults are the sizes the brief asks for (they are CPU-days here).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from quadforge.tools.reproduce_quard import add_arguments as quard_arguments
from quadforge.tools.reproduce_quard import run_from_args as run_quard_from_args
from quadforge.tools.quard_status import run_from_args as quard_status_from_args
from quadforge.tools.run_info import git_state, machine
from quadforge.tools.results_report import SECTIONS
from quadforge.models.registry import model_names

# the imitation models the report trains by default: a subset of the registry's (models.registry)
IMITATION_MODELS = model_names(trainer="imitation")
DEFAULT_MODELS = ("fcnet", "transformer", "convformer", "mlp")
GERM_VARIANTS = model_names(trainer="qlearning")


@dataclass
class ReproduceConfig:
    out: str = "runs/reproduce"
    docs: str = "docs/results.md"
    sizes: tuple[int, ...] = (50_000, 250_000, 1_000_000)   # env steps of imitation data (seed 000 Fig. 4 scale)
    models: tuple[str, ...] = DEFAULT_MODELS
    seeds: tuple[int, ...] = (0, 1, 2)
    train_steps: int = 2000
    batch_size: int = 64
    germ_episodes_clean: int = 300
    germ_episodes_noisy: int = 300
    germ_action_noise: float = 0.3
    germ_push: float = 0.5
    germ_steps: int = 2000
    eval_terrain: str = "flat,slope_up,rough_slope,stairs_up"
    eval_levels: str = "0,3,6"
    eval_episodes: int = 8
    num_envs: int = 16
    max_episode_s: float = 4.0
    data_terrain: str = "flat,slope_up,rough_slope,stairs_up"
    quick: bool = False

    @classmethod
    def quick_preset(cls, **kw: Any) -> "ReproduceConfig":
        base = dict(sizes=(2_500, 7_000, 20_000), seeds=(0, 1), train_steps=300, germ_episodes_clean=60,
                    germ_episodes_noisy=60, germ_steps=200, eval_terrain="flat,rough_slope", eval_levels="0,3",
                    eval_episodes=3, num_envs=12, quick=True)
        base.update(kw)
        return cls(**base)

    def validate(self) -> "ReproduceConfig":
        if not self.sizes or any(s < 100 for s in self.sizes):
            raise ValueError(f"--sizes={self.sizes}; give env-step counts >= 100, e.g. 50000,250000,1000000")
        unknown = [m for m in self.models if m not in IMITATION_MODELS]
        if unknown:
            raise ValueError(f"--models: unknown {unknown}; allowed: {', '.join(IMITATION_MODELS)}")
        if not self.seeds:
            raise ValueError("--seeds is empty; give e.g. 0,1,2")
        for name in ("train_steps", "batch_size", "germ_steps", "eval_episodes", "num_envs"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}; must be >= 1")
        from quadforge.evaluation.evaluate import parse_levels, terrain_types
        terrain_types(self.eval_terrain)
        parse_levels(self.eval_levels)
        from quadforge.output_paths import check_output_dir, check_output_file, is_text_file
        check_output_dir(self.out, "reproduction run", owns=lambda p: any((p / n).exists() for n in ("results.json", "data", "eval",
                                                                                "imitation", "germ")))
        check_output_file(self.docs, flag="--docs", owns=is_text_file)
        return self


# --- results file ------------------------------------------------------------------------------------------
class Results:
    """OUT/results.json, rewritten after every finished run and stage."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        self._clock = time.perf_counter()

    def restart_clock(self) -> None:
        self._clock = time.perf_counter()

    def tick(self, stage: str) -> None:
        """Add the wall time since the last tick to ``{stage}_wall_s`` and stamp ``finished_utc``: called
        after every run, so a run directory interrupted mid-stage still says how long it worked."""
        now = time.perf_counter()
        self.data[f"{stage}_wall_s"] = self.data.get(f"{stage}_wall_s", 0.0) + now - self._clock
        self._clock = now
        self.put("finished_utc", time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)

    def append(self, key: str, value: Any) -> None:
        self.put(key, self.data.get(key, []) + [value])


# --- data ---------------------------------------------------------------------------------------------------
def collect_steps(store: Path, min_steps: int, cfg: ReproduceConfig, log: Callable[[str], None],
                  collector_id: str = "main", action_noise: float = 0.0, push: float = 0.0,
                  episodes: int | None = None) -> dict[str, Any]:
    """Top the store up until it holds ``min_steps`` env steps (or exactly ``episodes`` of this collector)."""
    from quadforge.collection.collect import CollectConfig, compact_store, run_local, store_count
    from quadforge.data.store import TrajectoryStore

    t0 = time.perf_counter()
    while True:
        have = store_count(str(store))
        if have:   # a collection interrupted between compactions left staged episodes: merge them first
            compact_store(str(store))
        steps = TrajectoryStore.open(str(store)).num_steps if have else 0
        if episodes is None and steps >= min_steps:
            break
        if episodes is not None:
            target = episodes
        elif have == 0:   # a first batch tells the mean episode length
            target = 2 * cfg.num_envs
        else:
            target = have + max(8, int((min_steps - steps) / max(steps / have, 1.0) * 1.05) + 1)
        run_local(CollectConfig(out=str(store), episodes=target, policy="gait", terrain=cfg.data_terrain,
                                skills="walking", num_envs=cfg.num_envs, seed=0, max_episode_s=cfg.max_episode_s,
                                action_noise=action_noise, push=push, collector_id=collector_id, progress=False))
        log(f"  store {store.name}: {store_count(str(store))} episodes")
        if episodes is not None:
            break
    st = TrajectoryStore.open(str(store))
    return {"episodes": st.num_episodes, "steps": st.num_steps, "seconds": time.perf_counter() - t0}


def prefix(data: Any, min_steps: int) -> Any:
    """The first episodes of ``data`` (EpisodeArrays) holding at least ``min_steps`` steps."""
    import numpy as np

    from quadforge.data.episodes import EpisodeArrays
    k = int(np.searchsorted(data.episode_ends, min_steps)) + 1
    k = min(k, data.num_episodes)
    end = int(data.episode_ends[k - 1])
    return EpisodeArrays({n: a[:end] for n, a in data.features.items()}, data.episode_ends[:k].copy(),
                         {n: c[:k] for n, c in data.episode_info.items()})


def load_all(store: Path) -> Any:
    from quadforge.data.episodes import EpisodeArrays
    from quadforge.data.store import TrajectoryStore
    st = TrajectoryStore.open(str(store))
    return EpisodeArrays.from_store(st, list(st.feature_names))


# --- evaluation of one policy -----------------------------------------------------------------------------
def eval_policy(policy: str, out: Path, cfg: ReproduceConfig, seed: int) -> dict[str, Any]:
    from quadforge.evaluation.evaluate import EvalConfig, evaluate, write_outputs
    ecfg = EvalConfig(policy=policy, out=str(out), terrain=cfg.eval_terrain, levels=cfg.eval_levels,
                      episodes=cfg.eval_episodes, num_envs=cfg.num_envs, seed=1000 + seed,
                      max_episode_s=cfg.max_episode_s, progress=False)
    result = evaluate(ecfg)
    write_outputs(result, out)
    o = result["overall"]
    return {"success": o["success"], "return": o["return"], "fall": o["fall"], "lin_vel_error": o["lin_vel_error"],
            "distance": o["distance"], "high_freq_energy": o["high_freq_energy"], "episodes": o["episodes"],
            "act_ms": result["latency"]["act_ms_mean"], "eval_s": result["wall_s"],
            "cells": [{k: c[k] for k in ("terrain_type", "terrain_level", "success", "return", "episodes")}
                      for c in result["cells"]]}


# --- stages ----------------------------------------------------------------------------------------------
def stage_imitation(cfg: ReproduceConfig, res: Results, log: Callable[[str], None]) -> None:
    from quadforge.training.imitation import final_val_loss, train_or_continue
    from quadforge.training.presets import preset

    out = Path(cfg.out)
    store = out / "data" / "expert"
    log(f"[imitation] collecting >= {max(cfg.sizes)} env steps with the gait expert on {cfg.data_terrain}")
    collected = collect_steps(store, max(cfg.sizes), cfg, log)
    # a rerun that finds the store complete keeps the collection's time (summed over invocations)
    collected["seconds"] += res.data.get("imitation_data", {}).get("seconds", 0.0)
    res.put("imitation_data", collected)
    data = load_all(store)
    if "expert_eval" not in res.data:
        log("[imitation] evaluating the gait expert (reference)")
        res.put("expert_eval", eval_policy("gait", out / "eval" / "gait", cfg, 0))
    done = {(r["model"], r["size"], r["seed"]) for r in res.data.get("imitation", [])}
    from quadforge.progress import progress_bar
    bar = progress_bar(len(cfg.sizes) * len(cfg.models) * len(cfg.seeds), len(done), desc="reproduce imitation",
                       unit="run")
    for size in cfg.sizes:
        subset = prefix(data, size)
        for model in cfg.models:
            for seed in cfg.seeds:
                if (model, size, seed) in done:
                    continue
                run_dir = out / "imitation" / f"{model}_{size}_s{seed}"
                tcfg = preset(model, "cpu")
                tcfg.seed, tcfg.max_steps, tcfg.batch_size = seed, cfg.train_steps, cfg.batch_size
                tcfg.val_every = tcfg.log_every = max(1, cfg.train_steps // 2)
                tcfg.tensorboard = False
                t0 = time.perf_counter()
                trained = train_or_continue(tcfg, subset, run_dir)   # a run the results do not hold: unfinished
                train_s = time.perf_counter() - t0
                ev = eval_policy(str(trained.checkpoint), run_dir / "eval", cfg, seed)
                row = {"model": model, "size": size, "seed": seed, "data_steps": subset.num_steps,
                       "data_episodes": subset.num_episodes, "train_steps": cfg.train_steps,
                       "batch_size": cfg.batch_size, "context": tcfg.context,
                       "params": trained.model.num_parameters(), "val_loss": final_val_loss(trained, run_dir),
                       "train_s": train_s, **ev}
                res.append("imitation", row)
                res.tick("imitation")
                log(f"[imitation] {model} size {size} seed {seed}: val {row['val_loss']:.3g} "
                    f"success {ev['success']:.2f} return {ev['return']:.3g} ({train_s:.0f}s train, "
                    f"{ev['eval_s']:.0f}s eval)")
                bar.update(1)
    bar.close()


def germ_config(model_name: str, cfg: ReproduceConfig, seed: int) -> Any:
    from quadforge.training.qlearning import default_config
    g = default_config(model_name, "small")
    g.seed, g.max_steps, g.batch_size = seed, cfg.germ_steps, 32
    g.val_every = g.log_every = max(1, cfg.germ_steps // 2)
    g.tensorboard = False
    if cfg.quick:   # a CPU-sized network: 2 layers x 64, 4 experts top-2 of 128, context 4
        g.model.d_model, g.model.num_layers, g.model.num_heads = 64, 2, 2
        g.model.ffn_hidden, g.model.num_experts, g.model.context = 128, 4, 4
    return g


def stage_germ(cfg: ReproduceConfig, res: Results, log: Callable[[str], None]) -> None:
    from quadforge.training.qlearning import train as germ_train

    out = Path(cfg.out)
    store = out / "data" / "mixed_outcomes"
    log(f"[germ] collecting {cfg.germ_episodes_clean} clean + {cfg.germ_episodes_noisy} perturbed episodes "
        f"(action noise {cfg.germ_action_noise}, pushes {cfg.germ_push} m/s)")
    collect_steps(store, 0, cfg, log, collector_id="clean", episodes=cfg.germ_episodes_clean)
    info = collect_steps(store, 0, cfg, log, collector_id="noisy", action_noise=cfg.germ_action_noise,
                         push=cfg.germ_push, episodes=cfg.germ_episodes_clean + cfg.germ_episodes_noisy)
    data = load_all(store)
    success = data.episode_info.get("success")
    info["success_fraction"] = float(success.astype(float).mean()) if success is not None else None
    res.put("germ_data", info)
    done = {(r["model"], r["seed"]) for r in res.data.get("germ", [])}
    from quadforge.progress import progress_bar
    bar = progress_bar(len(GERM_VARIANTS) * len(cfg.seeds), len(done), desc="reproduce GeRM", unit="run")
    for model in GERM_VARIANTS:
        for seed in cfg.seeds:
            if (model, seed) in done:
                continue
            run_dir = out / "germ" / f"{model}_s{seed}"
            g = germ_config(model, cfg, seed)
            t0 = time.perf_counter()
            summary = germ_train(g, data, run_dir, overwrite=True)   # a run the results do not hold: unfinished
            train_s = time.perf_counter() - t0
            ev = eval_policy(str(summary["checkpoint"]), run_dir / "eval", cfg, seed)
            m = summary.get("model")
            val = summary.get("val") or [{}]
            row = {"model": model, "seed": seed, "train_steps": g.max_steps, "batch_size": g.batch_size,
                   "context": g.model.context, "d_model": g.model.d_model, "layers": g.model.num_layers,
                   "params": sum(p.numel() for p in m.parameters()) if m is not None else None,
                   "objective": g.objective, "success_only": g.success_only, "success_ratio": g.success_ratio,
                   "val_greedy_agreement": val[-1].get("greedy_agreement"), "train_s": train_s, **ev}
            res.append("germ", row)
            res.tick("germ")
            log(f"[germ] {model} seed {seed}: success {ev['success']:.2f} return {ev['return']:.3g} "
                f"({train_s:.0f}s train, {ev['eval_s']:.0f}s eval)")
            bar.update(1)
    bar.close()


def run_reproduction(cfg: ReproduceConfig, stages: tuple[str, ...] = ("imitation", "germ"),
                     log: Callable[[str], None] = print, command: str | None = None,
                     report_section: str | None = None) -> Path:
    """Run ``stages`` into ``cfg.out`` and write ``cfg.docs`` (only its ``report_section`` when given)."""
    import torch

    from quadforge.tools.results_report import write_report

    cfg.validate()
    torch.set_num_threads(1)
    out = Path(cfg.out)
    res = Results(out / "results.json")
    res.put("config", asdict(cfg))
    if command:   # every invocation that added to this run directory
        res.put("commands", res.data.get("commands", []) + [command])
    res.put("git", git_state())
    res.put("machine", machine())
    res.put("started_utc", res.data.get("started_utc") or time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))
    res.restart_clock()   # set-up above is no stage's time
    for stage in stages:
        {"imitation": stage_imitation, "germ": stage_germ}[stage](cfg, res, log)
        res.tick(stage)
        write_report(res.data, Path(cfg.docs), only=report_section)
    return Path(cfg.docs)


# --- CLI -----------------------------------------------------------------------------------------------------
def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a comma list of integers") from None


def quard_only_defaults() -> dict[str, Any]:
    """The options tools/reproduce_quard.py adds (refused with the imitation/germ stages) and their defaults,
    read from its own ``add_arguments``, so a new quard option is refused there without being listed here."""
    own = argparse.ArgumentParser(add_help=False)
    quard_arguments(own)
    return vars(own.parse_args([]))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="scaled-down sizes that finish on a shared 2-core machine")
    p.add_argument("--out", default="runs/reproduce", help="run directory (data, checkpoints, results.json)")
    p.add_argument("--docs", default="docs/results.md", help="the report to (re)write")
    p.add_argument("--sizes", default=None, help="imitation dataset sizes in env steps, e.g. 50000,250000,1000000")
    p.add_argument("--seeds", default=None, help="training seeds, e.g. 0,1,2")
    p.add_argument("--models", default=None, help=f"imitation models (default {','.join(DEFAULT_MODELS)})")
    p.add_argument("--train-steps", type=int, default=None, help="optimizer steps per imitation run; with --stages "
                   "quard, per Table III and flywheel training instead of the scale's (over a finished run, a "
                   "longer budget continues each training from its last.pt and evaluates it again)")
    p.add_argument("--germ-steps", type=int, default=None, help="optimizer steps per GeRM run")
    p.add_argument("--germ-episodes", type=int, default=None, help="GeRM data: clean episodes (and as many perturbed)")
    p.add_argument("--eval-terrain", default=None, help="evaluation terrain types (comma list)")
    p.add_argument("--eval-levels", default=None, help="evaluation levels, e.g. 0,3")
    p.add_argument("--eval-episodes", type=int, default=None, help="evaluation episodes per terrain type x level")
    p.add_argument("--stages", default="imitation,germ",
                   help="imitation,germ or one of them; or quard (the QUARD-Auto loop and Table III, "
                        "tools/reproduce_quard.py, docs/quard_auto.md)")
    p.add_argument("--report-only", action="store_true", help="rebuild --docs from OUT/results.json only "
                   "(with --stages quard: its section from OUT/steps and OUT/results)")
    p.add_argument("--report-section", choices=SECTIONS, default=None,
                   help="rewrite only this section of the existing --docs page from this run, keeping the rest "
                        "(another run's sections, the reading written after the section)")
    quard_arguments(p)


def run(args: argparse.Namespace) -> int:
    from quadforge.tools.results_report import write_report

    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    if "quard" in stages:
        if stages != ("quard",):
            raise ValueError(f"--stages={args.stages!r}: quard runs alone (its own --out and report section)")
        imitation_only = [flag for flag, value in (("--quick", args.quick), ("--sizes", args.sizes),
                          ("--models", args.models), ("--germ-steps", args.germ_steps),
                          ("--germ-episodes", args.germ_episodes), ("--eval-terrain", args.eval_terrain),
                          ("--eval-levels", args.eval_levels), ("--eval-episodes", args.eval_episodes),
                          ("--report-section", args.report_section)) if value]
        if imitation_only:   # silently ignored, they would leave a run that is not the one asked for
            raise ValueError(f"{', '.join(imitation_only)} belong to the imitation/germ stages; --stages quard "
                             f"takes its sizes from --scale (and --train-steps, --seeds, --rounds)")
        seeds = _ints(args.seeds) if args.seeds else None
        return (quard_status_from_args if args.status else run_quard_from_args)(args, seeds)
    quard_only = [f"--{name.replace('_', '-')}" for name, default in quard_only_defaults().items()
                  if getattr(args, name) != default]
    if quard_only:
        raise ValueError(f"{', '.join(quard_only)}: {'belongs' if len(quard_only) == 1 else 'belong'} to --stages "
                         f"quard; the imitation/germ stages use --quick")
    if args.report_only:
        path = Path(args.out) / "results.json"
        if not path.exists():
            raise FileNotFoundError(f"--report-only: no {path}; run the reproduction first")
        write_report(json.loads(path.read_text()), Path(args.docs), only=args.report_section)
        print(f"wrote {args.docs}" + (f" (section {args.report_section} only)" if args.report_section else ""))
        return 0
    kw: dict[str, Any] = {"out": args.out, "docs": args.docs}
    if args.sizes:
        kw["sizes"] = _ints(args.sizes)
    if args.seeds:
        kw["seeds"] = _ints(args.seeds)
    if args.models:
        kw["models"] = tuple(m.strip() for m in args.models.split(",") if m.strip())
    if args.train_steps:
        kw["train_steps"] = args.train_steps
    if args.germ_steps:
        kw["germ_steps"] = args.germ_steps
    if args.germ_episodes:
        kw["germ_episodes_clean"] = kw["germ_episodes_noisy"] = args.germ_episodes
    for name in ("eval_terrain", "eval_levels", "eval_episodes"):
        if getattr(args, name):
            kw[name] = getattr(args, name)
    cfg = ReproduceConfig.quick_preset(**kw) if args.quick else ReproduceConfig(**kw)
    bad = [s for s in stages if s not in ("imitation", "germ")]
    if bad or not stages:
        raise ValueError(f"--stages={args.stages!r}; allowed: imitation, germ (comma-separated), or quard")
    import sys
    command = "quadforge " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else None
    if args.report_section and not Path(args.docs).exists():
        raise FileNotFoundError(f"--report-section {args.report_section}: no page {args.docs} to rewrite a section of")
    print(f"wrote {run_reproduction(cfg, stages, command=command, report_section=args.report_section)}")
    return 0
