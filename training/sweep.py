"""`quadforge train-sweep`: equal-budget tuning of every imitation model on one validation split.

    quadforge train-sweep --store STORE --out DIR [--episodes 24] [--models fcnet,transformer,...]
                          [--steps 1000] [--batch-size 64] [--lrs 3e-4,1e-3,3e-3]
                          [--optimizers adamw,lion] [--seed 0] [--table docs/sweep.md]

Every model gets the same budget, so no baseline loses a comparison to its preset:

1. stage 1, the shared grid: learning rate x optimizer (AdamW, Lion; ``training/optim.py``) on the
   model's ``cpu`` preset (architecture, weight decay, warmup, clipping unchanged), the same steps,
   batch size, data, split and seed for everyone. Lion's learning rates are AdamW's divided by
   ``LION_LR_RATIO`` = 3 (the Lion paper: its lr should be 3-10x smaller than AdamW's, since its
   sign update has a larger norm), so both optimizers get the same number of runs in their own range;
2. stage 2, the one setting the model's own paper (or, for ours, our notes) says matters, at the best
   learning rate and optimizer of stage 1: exactly ``len(SETTINGS[model])`` = 2 extra runs each
   (``SETTINGS`` below, with the reason per model; a model registered without an entry runs stage 1 only).

The chosen setting is stage 1's run with the lowest validation loss (the trainer's held-out episodes,
``val_fraction``), replaced by a stage-2 run only when that is more than ``STAGE2_MARGIN`` = 5 % lower
(a single seed's noise on a 5-episode validation split is a few per cent: a 1 % "win" is not a reason
to change a paper's value). Results go to
``OUT/sweep.json`` (rewritten after every run, so an interrupted sweep resumes where it stopped; a rerun
with another store, grid, budget or seed is refused, naming them: use a new ``--out``) and a markdown
table to stdout (and ``--table``, checked before the sweep). Writing the choice into
``models/zoo_presets.py`` is a reviewed hand edit (docs/models.md "Equal-budget tuning" quotes the table it came from).

With ``--episodes N`` and no store at ``--store`` the sweep first collects N gait-expert episodes on
flat ground (walking commands, 4 s) there, so one command reruns everything.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from quadforge.cli_flags import add_out, add_seed, add_store, field_flag, require
from quadforge.collection.collect import CollectConfig, run_local
from quadforge.data.store import refuse_file_as_store
from quadforge.output_paths import check_output_dir, check_output_file, table_marker, written_by
from quadforge.training.imitation import train
from quadforge.models.registry import model_names
from quadforge.training.presets import apply_train_overrides, preset

DEFAULT_LRS = (3e-4, 1e-3, 3e-3)       # AdamW's; Lion's are these / LION_LR_RATIO
LION_LR_RATIO = 3.0
STAGE2_MARGIN = 0.05   # a stage-2 value must lower the validation loss by more than 5 % to be chosen
DEFAULT_OPTIMIZERS = ("adamw", "lion")
# SweepConfig fields whose flag is not --<field-name>
FLAGS = {"data": "--store"}
# what a rerun may change and still resume: --episodes only sizes a store not yet collected (the store
# itself is compared by --store), --table is where the table goes
RESUMABLE_CHANGES = ("out", "episodes", "table")
# each optimizer's own standard betas/eps (torch's AdamW defaults; Lion paper's (0.9, 0.99)), the same
# for every model: the grid compares optimizers, not one preset's betas against another's
OPTIMIZER_BETAS = {"adamw": ((0.9, 0.999), 1e-8), "lion": ((0.9, 0.99), 1e-8)}

# stage 2: (config key, the values tried besides the preset's, why this setting); a model without an entry (one
# registered with no paper setting to ablate) runs stage 1 only
SETTINGS: dict[str, tuple[str, tuple[Any, ...], str]] = {
    "fcnet": ("model.modes", (4, 16), "seed 000 ablates the number of Fourier modes m (preset 8 at n 32)"),
    "transformer": ("model.pos_init_std", (1.0, 0.1),
                    "the learned positional embedding's init scale (preset 0.02, GPT-2's; torch's "
                    "nn.Embedding default 1.0 swamps the state tokens - issue 17)"),
    "convformer": ("model.kernel", (3, 12), "seed 002 ablates the convolution window (preset 6)"),
    "starformer": ("model.pos_init_std", (0.02, 0.1),
                   "the step tokens' positional embedding init scale, as for the Transformer (preset 1.0, "
                   "chosen by the 2026-11-24 sweep over 0.02 (its stage 1) and 0.1)"),
    "mlp": ("context", (4, 16), "ours: the history length is the MLP's one structural choice (preset 8)"),
}


def sweep_models() -> tuple[str, ...]:
    """Every imitation model registered now (``models.registry``): no baseline is left at an untuned preset."""
    return model_names(trainer="imitation")


@dataclass
class SweepConfig:
    data: str
    out: str
    models: tuple[str, ...] = field(default_factory=sweep_models)
    steps: int = 1000
    batch_size: int = 64
    lrs: tuple[float, ...] = DEFAULT_LRS
    optimizers: tuple[str, ...] = DEFAULT_OPTIMIZERS
    seed: int = 0
    val_fraction: float = 0.2        # of 24 episodes: 5 held out (0.1 would hold out 2)
    episodes: int = 0                # >0 and no store at data: collect that many gait-expert episodes first
    table: str | None = None

    def validate(self) -> "SweepConfig":
        unknown = [m for m in self.models if m not in sweep_models()]
        if unknown or not self.models:
            raise ValueError(f"--models: unknown {unknown}; allowed: {','.join(sweep_models())}")
        bad = [o for o in self.optimizers if o not in OPTIMIZER_BETAS]
        if bad or not self.optimizers:
            raise ValueError(f"--optimizers: unknown {bad}; allowed: {','.join(OPTIMIZER_BETAS)}")
        if not self.lrs or any(not (lr > 0 and math.isfinite(lr)) for lr in self.lrs):
            raise ValueError(f"--lrs={self.lrs}; give positive learning rates, e.g. 3e-4,1e-3")
        for name in ("steps", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}; must be >= 1")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"--val-fraction={self.val_fraction}; must be in (0, 1)")
        if not Path(self.data).exists() and self.episodes < 1:
            raise FileNotFoundError(f"--store {self.data}: no trajectory store there; give --episodes N to collect one")
        refuse_file_as_store(self.data, "--store")   # the store may not exist yet: not existing_store_dir
        check_output_dir(self.out, "train-sweep run", owns=lambda p: (p / "sweep.json").is_file())
        if self.table:
            check_output_file(self.table, flag="--table", owns=written_by("train-sweep"))   # before the sweep
        return self

    def recorded(self) -> dict[str, Any]:
        """The config as sweep.json holds it (tuples as lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self).items()}

    def check_resume(self, recorded: dict[str, Any] | None) -> None:
        """A rerun into an OUT holding a sweep resumes it only with the options that define its runs: another
        store, grid, budget or seed would return (or mix in) the old runs' numbers as the new ones."""
        if recorded is None:
            return
        now = self.recorded()
        differ = [k for k in now if k not in RESUMABLE_CHANGES and recorded.get(k) != now[k]]
        if differ:
            what = ", ".join(f"{field_flag(k, FLAGS)} {recorded.get(k)!r} there, {now[k]!r} now"
                             for k in differ)
            raise ValueError(f"--out {self.out}: holds a sweep made with other options ({what}); rerun with its "
                             f"options to resume it, or give a new --out")


def optimizer_lr(optimizer: str, lr: float) -> float:
    """The learning rate an optimizer runs at for grid value ``lr`` (AdamW's scale)."""
    return float(lr) / LION_LR_RATIO if optimizer == "lion" else float(lr)


def run_config(model: str, cfg: SweepConfig, lr: float, optimizer: str, setting: tuple[str, Any] | None = None):
    """The TrainConfig of one sweep run: the model's cpu preset with this lr/optimizer (and setting)."""
    t = preset(model, "cpu")
    betas, eps = OPTIMIZER_BETAS[optimizer]
    t.optim.name, t.optim.lr, t.optim.betas, t.optim.eps = optimizer, float(lr), betas, eps
    t.seed, t.max_steps, t.batch_size, t.val_fraction = cfg.seed, cfg.steps, cfg.batch_size, cfg.val_fraction
    t.val_every = t.log_every = cfg.steps
    t.tensorboard = False
    if setting is not None:
        apply_train_overrides(t, dict([setting]))
    t.validate()
    return t


def _key(model: str, lr: float, optimizer: str, setting: tuple[str, Any] | None) -> str:
    return f"{model}|{optimizer}|{lr:g}|" + (f"{setting[0]}={setting[1]}" if setting else "preset")


def ensure_data(cfg: SweepConfig, log: Callable[[str], None]) -> None:
    if Path(cfg.data).exists():
        return
    log(f"[sweep] collecting {cfg.episodes} gait-expert episodes (flat, walking, 4 s) -> {cfg.data}")
    run_local(CollectConfig(out=cfg.data, episodes=cfg.episodes, policy="gait", terrain="flat", skills="walking",
                            num_envs=min(16, cfg.episodes), seed=cfg.seed, max_episode_s=4.0, progress=False))


def run_sweep(cfg: SweepConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    cfg.validate()
    out = Path(cfg.out)
    path = out / "sweep.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    cfg.check_resume(results.get("config"))
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Any] = results.setdefault("runs", {})
    results["config"] = cfg.recorded()
    if runs:   # a rerun says what it takes over, not only what it does next
        log(f"[sweep] resuming {path}: {len(runs)} run(s) already done are kept, not run again")

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        os.replace(tmp, path)

    save()   # OUT is marked as this sweep's before the collection: an interrupted one resumes, not refused
    ensure_data(cfg, log)
    torch.set_num_threads(1)

    def one(model: str, lr: float, optimizer: str, setting: tuple[str, Any] | None, stage: int) -> dict[str, Any]:
        key = _key(model, lr, optimizer, setting)
        if key in runs:
            return runs[key]
        t = run_config(model, cfg, lr, optimizer, setting)
        t0 = time.perf_counter()
        trained = train(t, cfg.data, None)
        val = [h["val_loss"] for h in trained.history if "val_loss" in h]
        row = {"model": model, "stage": stage, "optimizer": optimizer, "lr": lr,
               "setting": None if setting is None else f"{setting[0]}={setting[1]}",
               "val_loss": val[-1] if val else float("nan"), "train_loss": trained.history[-1]["loss"],
               "params": trained.model.num_parameters(), "seconds": time.perf_counter() - t0}
        if not math.isfinite(row["val_loss"]):
            row["val_loss"] = float("inf")   # a diverged run loses; json keeps it as Infinity
        runs[key] = row
        save()
        log(f"[sweep] {key}: val {row['val_loss']:.4g} ({row['seconds']:.0f}s)")
        return row

    for model in cfg.models:
        stage1 = [one(model, optimizer_lr(opt, lr), opt, None, 1) for opt in cfg.optimizers for lr in cfg.lrs]
        best1 = min(stage1, key=lambda r: r["val_loss"])
        name, values, _ = SETTINGS.get(model, ("", (), ""))
        stage2 = [one(model, best1["lr"], best1["optimizer"], (name, v), 2) for v in values]
        # a paper setting replaces the preset's value only when clearly better: one seed's noise on these
        # small validation splits is a few per cent
        best = min([best1] + [r for r in stage2 if r["val_loss"] < (1 - STAGE2_MARGIN) * best1["val_loss"]],
                   key=lambda r: r["val_loss"])
        results.setdefault("chosen", {})[model] = best
        save()
    text = sweep_table(results, cfg.models)
    print(text)
    if cfg.table:
        Path(cfg.table).write_text(text + "\n\n" + table_marker("train-sweep") + "\n")
    return results


def sweep_table(results: dict[str, Any], models: tuple[str, ...]) -> str:
    """Markdown: one row per model and setting, one column per (optimizer, lr) of stage 1."""
    cfg = results["config"]
    lrs, opts = cfg["lrs"], cfg["optimizers"]
    runs = list(results["runs"].values())
    head = (["model", "params"] + [f"{o} {optimizer_lr(o, lr):.2g}" for o in opts for lr in lrs]
            + ["stage 2 (at best lr/opt)", "chosen"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in models:
        mine = [r for r in runs if r["model"] == model]
        if not mine:
            continue
        chosen = results.get("chosen", {}).get(model)
        cells = []
        for o in opts:
            for lr in lrs:
                r = next((r for r in mine if r["stage"] == 1 and r["optimizer"] == o
                          and r["lr"] == optimizer_lr(o, lr)), None)
                v = "" if r is None else f"{r['val_loss']:.4f}"
                cells.append(f"**{v}**" if r is not None and is_chosen(chosen, r) else v)
        stage2 = "; ".join(f"{r['setting'].removeprefix('model.')}: " + (f"**{r['val_loss']:.4f}**" if is_chosen(chosen, r)
                           else f"{r['val_loss']:.4f}") for r in mine if r["stage"] == 2)
        pick = "" if chosen is None else (f"{chosen['optimizer']} {chosen['lr']:.2g}"
                                          + (f", {chosen['setting'].removeprefix('model.')}" if chosen["setting"] else ""))
        lines.append("| " + " | ".join([model, str(mine[0]["params"])] + cells + [stage2, pick]) + " |")
    return "\n".join(lines)


def is_chosen(chosen: dict[str, Any] | None, row: dict[str, Any]) -> bool:
    """Whether ``row`` is the chosen run (compared by value: rows come back from JSON)."""
    return chosen is not None and all(chosen.get(k) == row.get(k) for k in ("stage", "optimizer", "lr", "setting"))


# --- CLI ---------------------------------------------------------------------------------------------------
def _list(text: str, kind: Callable[[str], Any]) -> tuple[Any, ...]:
    try:
        return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a comma list of {kind.__name__}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = SweepConfig(data="", out="")
    add_store(p, "tuned on (collected first when absent and --episodes is given)")
    add_out(p, "sweep.json (the runs; a rerun with the same options resumes) and the chosen settings")
    p.add_argument("--episodes", type=int, default=0, help="collect this many gait-expert episodes if --store is absent")
    p.add_argument("--models", default=",".join(d.models), help="comma list of models (default: the whole zoo)")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps per run (every run the same)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="windows per step (every run the same)")
    p.add_argument("--lrs", default=",".join(f"{x:g}" for x in d.lrs),
                   help=f"AdamW learning rates of the grid; Lion runs at these / {LION_LR_RATIO:g}")
    p.add_argument("--optimizers", default=",".join(d.optimizers), help="comma list of adamw, lion")
    p.add_argument("--val-fraction", type=float, default=d.val_fraction, help="held-out share of the episodes")
    add_seed(p, d.seed)
    p.add_argument("--table", default=None, help="also write the markdown table to this file")


def run(args: argparse.Namespace) -> int:
    cfg = SweepConfig(data=require(args, "store", "--store"), out=require(args, "out", "--out"), models=_list(args.models, str), steps=args.steps,
                      batch_size=args.batch_size, lrs=_list(args.lrs, float), optimizers=_list(args.optimizers, str),
                      seed=args.seed, val_fraction=args.val_fraction, episodes=args.episodes, table=args.table)
    run_sweep(cfg)
    return 0
