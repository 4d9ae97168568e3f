"""`quadforge dagger`: imitation with the expert relabelling the learner's own states (DAgger).

    quadforge dagger --out DIR [--store STORE] [--iterations 2] [--episodes-per-iter 96]
                     [--train-steps 4000] [--finetune-steps 0] [--expert-drive-prob 0] [--compile-expert]
                     [key=value ...]

Iteration 0 is the demo's recipe (``tools/demo.py``): the gait expert's data on the demo's terrain
mix, the model's ``cpu`` preset trained ``train_steps`` steps. Iteration i >= 1 (Ross et al. 2011):

1. collect ``episodes_per_iter`` episodes with iteration i-1's policy driving and the gait expert
   labelling every visited state (``collect --relabel gait``, ``collection/relabel.py``) into
   ``OUT/relabelled`` (one store, one collector id per iteration);
2. aggregate: the expert's episodes plus every relabelled episode so far (``actions`` = the expert's
   label in both), the two stores read as one (``data.store_set.StoreSet``): in RAM when the aggregate
   fits the train config's ``ram_budget``, else out of core from each store's memory-mapped shards;
3. train on the aggregate - from scratch for ``train_steps`` (classic DAgger) or, with
   ``finetune_steps`` > 0, continuing from iteration i-1's weights for that many steps.

``--episodes-per-iter 0`` with ``--finetune-steps`` is the control: the same optimisation on the
expert's data alone, so a DAgger gain is not just the extra steps. ``--init-from CKPT`` starts at
iteration 1 from an existing iteration-0 checkpoint (e.g. the control from the DAgger run's).

Every iteration's policy and the expert itself are evaluated closed loop on the same sweep (the
demo's: flat / slope_up / rough_slope, levels 0-1, walking commands, 8 s); ``OUT/dagger.json`` holds
the ladder and is rewritten after each step, so an interrupted run keeps what it measured and a rerun
resumes after the last finished iteration - only with the options dagger.json records (more
``--iterations`` extend the ladder, ``--device`` may change); one with other options is refused before
any work, naming them, as is an ``--out`` that is a file or a non-empty folder without a dagger.json.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from quadforge.cli_flags import add_out, add_seed, add_store, field_flag, require
from quadforge.collection.collect import CollectConfig, run_local
from quadforge.evaluation.evaluate import EvalConfig, evaluate, write_outputs
from quadforge.data.store import TrajectoryStore
from quadforge.data.store_set import StoreSet, open_aggregate
from quadforge.layout import NUM_JOINTS, get_layout
from quadforge.models import build_model
from quadforge.models.checkpoint import check_model, load_checkpoint
from quadforge.models.registry import model_names
from quadforge.output_paths import check_output_dir
from quadforge.overrides import parse_overrides
from quadforge.training.distributed import resolve_device
from quadforge.training.imitation import final_val_loss, refuse_labels_as_action_inputs, train_or_continue
from quadforge.training.presets import TrainConfig, apply_train_overrides, preset, presets

DEMO_TERRAIN = "flat,slope_up,rough_slope,stairs_up"
# the flags of DaggerConfig fields whose flag is not --<field-name> (the rest are not flags or match it)
FLAGS = {"data": "--store", "eval_episodes": "--episodes-per-cell", "overrides": "key=value"}
# what a rerun may change and still resume: more --iterations extend the ladder (a row does not depend on
# how many follow it; docs/models.md reruns --iterations 3 then 5), --device only moves the arithmetic
RESUMABLE_CHANGES = ("out", "iterations", "device")


def flag(name: str) -> str:
    """The command-line flag of a DaggerConfig field, for error messages."""
    return field_flag(name, FLAGS)


@dataclass
class DaggerConfig:
    out: str
    data: str | None = None          # the expert's store; None: collect expert_episodes into OUT/expert
    expert_episodes: int = 320       # the demo's
    model: str = "fcnet"
    preset: str = "cpu"
    train_steps: int = 4000          # the demo's
    batch_size: int = 128            # the demo's
    iterations: int = 2
    episodes_per_iter: int = 96
    finetune_steps: int = 0          # > 0: iterations >= 1 continue from the previous weights this many steps
    expert_drive_prob: float = 0.0   # DAgger's beta for iterations >= 1 (iteration 0 is all expert)
    terrain: str = DEMO_TERRAIN
    max_episode_s: float = 8.0
    num_envs: int = 16
    seed: int = 0
    eval_terrain: str = "flat,slope_up,rough_slope"
    eval_levels: str = "0-1"
    eval_episodes: int = 8
    overrides: list[str] = field(default_factory=list)   # key=value for the train config (e.g. context=64)
    init_from: str | None = None     # an iteration-0 checkpoint to start from (not retrained, not re-evaluated)
    device: str = "cpu"              # the trainer's device (collection and evaluation run the CPU envs)
    # the gait expert's control law through torch.compile while it collects and labels (collect
    # --compile-expert, docs/experts.md): labels equal to the eager expert's to ~1e-3, not bit for bit
    compile_expert: bool = False

    def validate(self) -> "DaggerConfig":
        """Everything that can be checked is, before the expert's episodes are collected (minutes to hours)."""
        for name in ("expert_episodes", "train_steps", "batch_size", "num_envs", "eval_episodes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{flag(name)}={getattr(self, name)}; must be >= 1")
        for name in ("iterations", "episodes_per_iter", "finetune_steps"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{flag(name)}={getattr(self, name)}; must be >= 0")
        if self.episodes_per_iter == 0 and self.iterations and not self.finetune_steps:
            raise ValueError("--episodes-per-iter 0 (the no-relabelling control) needs --finetune-steps > 0: "
                             "retraining from scratch on the same data repeats iteration 0")
        if not 0.0 <= self.expert_drive_prob <= 1.0:
            raise ValueError(f"--expert-drive-prob={self.expert_drive_prob}; must be in [0, 1]")
        resolve_device(self.device)   # an unknown device, or cuda without one: fail before collecting
        models = model_names(trainer="imitation")
        if self.model not in models:
            raise ValueError(f"--model {self.model!r} unknown; allowed: {', '.join(models)}")
        if self.preset not in presets(self.model):
            raise ValueError(f"--preset {self.preset!r} unknown for --model {self.model}; "
                             f"allowed: {', '.join(presets(self.model))}")
        # the key=value overrides as `train` applies and checks them; building the model (seconds at most)
        # also catches a misspelt model.* key, which the trainer would only meet after the collection
        tcfg = iteration_train_config(self, 0, None)
        tcfg.validate()
        model = build_model(tcfg.model, obs_dim=get_layout(tcfg.layout).dim, action_dim=NUM_JOINTS,
                            context=tcfg.context, **tcfg.model_config)
        if self.iterations and self.episodes_per_iter:   # the trainer would refuse it at iteration 1, after hours
            refuse_labels_as_action_inputs(model, ["DAgger's relabelled stores (from iteration 1)"])
        if self.init_from is not None:
            try:
                init = load_checkpoint(self.init_from)   # a text file or a damaged archive: one line, now
                # iteration 0 of this model's ladder; iteration 1 continues from its weights (same shape then)
                finetunes = self.iterations and self.finetune_steps
                check_model(init, self.model, model.config if finetunes else None, where=self.init_from)
            except (ValueError, FileNotFoundError) as err:
                raise ValueError(f"--init-from: {err}") from None
        if self.data is not None:
            try:   # a file, a foreign folder or a damaged store: now, not after the expert's evaluation
                TrajectoryStore.open(self.data)
            except (ValueError, FileNotFoundError) as err:
                raise ValueError(f"--store: {err} (omit --store to collect one)") from None
        check_output_dir(self.out, "dagger run", owns=lambda p: (p / "dagger.json").is_file())
        return self

    def check_resume(self, recorded: dict[str, Any] | None) -> None:
        """A rerun into an OUT holding a ladder resumes it only with the options that made it: another
        model, store or seed would append rows measured differently (or return the old ones as the new)."""
        if recorded is None:
            return
        now = asdict(self)
        # a ladder recorded before an option existed was made with its default
        default = asdict(DaggerConfig(out=""))
        recorded = {**default, **recorded}
        differ = [k for k in now if k not in RESUMABLE_CHANGES and recorded.get(k) != now[k]]
        if differ:
            what = ", ".join(f"{flag(k)} {recorded.get(k)!r} there, {now[k]!r} now" for k in differ)
            raise ValueError(f"--out {self.out}: holds a dagger run made with other options ({what}); rerun with "
                             f"its options to resume it, or give a new --out")


def iteration_train_config(cfg: DaggerConfig, it: int, previous: str | None) -> TrainConfig:
    """Iteration ``it``'s imitation config: the model's preset with the run's overrides, from scratch for
    ``train_steps`` or (``finetune_steps`` > 0, it >= 1) from ``previous``'s weights."""
    tcfg = preset(cfg.model, cfg.preset)
    overrides = parse_overrides(cfg.overrides)
    apply_train_overrides(tcfg, overrides)
    tcfg.seed, tcfg.batch_size, tcfg.tensorboard = cfg.seed, cfg.batch_size, False
    tcfg.max_steps = cfg.train_steps
    if it > 0 and cfg.finetune_steps:
        tcfg.max_steps, tcfg.init_from = cfg.finetune_steps, previous
    tcfg.val_every = tcfg.log_every = max(1, tcfg.max_steps // 4)
    return tcfg


def run_dagger(cfg: DaggerConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    cfg.validate()
    torch.set_num_threads(1)
    out = Path(cfg.out)
    path = out / "dagger.json"
    res: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    cfg.check_resume(res.get("config"))
    out.mkdir(parents=True, exist_ok=True)
    res["config"] = asdict(cfg)
    ladder: list[dict[str, Any]] = res.setdefault("ladder", [])
    if ladder:   # a rerun says what it takes over, not only what it does next
        log(f"[dagger] resuming {path}: iteration(s) 0-{ladder[-1]['iteration']} done and kept, "
            f"{max(0, cfg.iterations + 1 - len(ladder))} to go")

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1, default=str))
        os.replace(tmp, path)

    save()   # OUT is marked as this run's before the collection: an interrupted one resumes, not refused

    def evaluate_policy(policy: str, name: str) -> dict[str, Any]:
        ecfg = EvalConfig(policy=policy, out=str(out / "eval" / name), terrain=cfg.eval_terrain,
                          levels=cfg.eval_levels, episodes=cfg.eval_episodes, commands=["walking"],
                          num_envs=cfg.num_envs, seed=cfg.seed, max_episode_s=cfg.max_episode_s, progress=False)
        result = evaluate(ecfg, log=lambda _: None)
        write_outputs(result, ecfg.out)
        o = result["overall"]
        return {k: o[k] for k in ("success", "return", "fall", "lin_vel_error", "episodes")}

    expert_store = cfg.data or str(out / "expert")
    if cfg.data is None:
        log(f"[dagger] collecting {cfg.expert_episodes} gait-expert episodes on {cfg.terrain} -> {expert_store}")
        run_local(CollectConfig(out=expert_store, episodes=cfg.expert_episodes, policy="gait", terrain=cfg.terrain,
                                skills="walking", num_envs=cfg.num_envs, seed=cfg.seed,
                                max_episode_s=cfg.max_episode_s, compact_every=0, progress=False,
                                compile_expert=cfg.compile_expert))
    if "expert_eval" not in res:
        log("[dagger] evaluating the gait expert")
        res["expert_eval"] = evaluate_policy("gait", "gait")
        save()
    log(f"[dagger] expert success {res['expert_eval']['success']:.3f}")

    expert_episodes = TrajectoryStore.open(expert_store).num_episodes
    relabelled = str(out / "relabelled")
    if cfg.init_from and not ladder:
        ladder.append({"iteration": 0, "checkpoint": cfg.init_from, "reused": True})
    previous = ladder[-1]["checkpoint"] if ladder else None
    for it in range(len(ladder), cfg.iterations + 1):
        t0 = time.perf_counter()
        stores = [expert_store]
        if it > 0 and cfg.episodes_per_iter:   # 0: the control, same optimisation without relabelled data
            target = it * cfg.episodes_per_iter
            log(f"[dagger] iteration {it}: {previous} drives, the gait expert labels -> {relabelled} ({target} episodes)")
            run_local(CollectConfig(
                out=relabelled, episodes=target, policy=previous, relabel="gait",
                expert_drive_prob=cfg.expert_drive_prob, terrain=cfg.terrain, skills="walking",
                num_envs=cfg.num_envs, seed=cfg.seed, max_episode_s=cfg.max_episode_s,
                collector_id=f"dagger{it}", compact_every=0, progress=False, compile_expert=cfg.compile_expert))
            # from the store, not this invocation's summary: a rerun after an interruption collected only
            # the rest (or nothing), and its summary covers only that
            driven_success = collector_success(relabelled, f"dagger{it}")
            stores.append(relabelled)
        # the stores as one: the trainer reads them in RAM when they fit its ram_budget, else out of core
        # (each store's memory-mapped shards, joined per batch), and says which ("data: ... path")
        data = StoreSet.open(stores)
        tcfg = iteration_train_config(cfg, it, previous)
        log(f"[dagger] iteration {it}: training {cfg.model} on {data.num_episodes} episodes / {data.num_steps} steps "
            f"({len(stores)} store(s)), {tcfg.max_steps} steps" + (f" from {previous}" if tcfg.init_from else ""))
        t1 = time.perf_counter()
        # an interrupted rerun continues the iteration it did not finish (dagger.json has no row for it) from
        # its last.pt: the same weights as an uninterrupted run
        trained = train_or_continue(tcfg, open_aggregate(stores), out / f"iter{it}", device=cfg.device)
        train_s = time.perf_counter() - t1
        val_loss = final_val_loss(trained, out / f"iter{it}")
        ev = evaluate_policy(str(trained.checkpoint), f"iter{it}")
        row = {"iteration": it, "checkpoint": str(trained.checkpoint), "data_episodes": data.num_episodes,
               "data_steps": data.num_steps, "relabelled_episodes": data.num_episodes - expert_episodes,
               "train_steps": tcfg.max_steps, "init_from": tcfg.init_from, "val_loss": val_loss,
               "train_s": train_s, "wall_s": time.perf_counter() - t0, **ev}
        if it > 0 and cfg.episodes_per_iter:
            row["driver_success_while_collecting"] = driven_success
        ladder.append(row)
        save()
        previous = row["checkpoint"]
        log(f"[dagger] iteration {it}: val {row['val_loss']:.4g}, success {ev['success']:.3f} "
            f"(expert {res['expert_eval']['success']:.3f}), {row['wall_s']:.0f}s")
    return res


def collector_success(store: str, collector_id: str) -> float | None:
    """The success ratio of one collector's episodes in a store (None when it has none)."""
    table = TrajectoryStore.open(store).episodes
    mine = np.char.startswith(np.asarray(table["episode_id"]).astype(str), f"{collector_id}-")
    return float(np.asarray(table["success"])[mine].mean()) if mine.any() else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DaggerConfig(out="")
    add_out(p, "stores, checkpoints, evaluations and dagger.json (the ladder; a rerun with the same options resumes)")
    add_store(p, "the expert's episodes (default: collect the demo's into OUT/expert)")
    p.add_argument("--expert-episodes", type=int, default=d.expert_episodes,
                   help="gait-expert episodes collected when --store is not given")
    p.add_argument("--model", default=d.model, help="imitation model (models); one that reads its previous actions "
                   "(starformer, convformer) is refused with relabelling: it would read the expert's labels as them")
    p.add_argument("--preset", default=d.preset, help="the model's training preset")
    p.add_argument("--iterations", type=int, default=d.iterations, help="DAgger iterations after the expert-only one")
    p.add_argument("--episodes-per-iter", type=int, default=d.episodes_per_iter,
                   help="relabelled episodes collected per iteration (0 with --finetune-steps: the control)")
    p.add_argument("--train-steps", type=int, default=d.train_steps, help="optimizer steps of iteration 0")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="windows per optimizer step")
    p.add_argument("--finetune-steps", type=int, default=d.finetune_steps,
                   help="> 0: iterations >= 1 continue from the previous weights for this many steps")
    p.add_argument("--expert-drive-prob", type=float, default=d.expert_drive_prob, help="DAgger's beta")
    add_seed(p, d.seed)
    p.add_argument("--episodes-per-cell", type=int, default=d.eval_episodes,
                   help="evaluation episodes per terrain type x level")
    p.add_argument("--init-from", default=None, help="iteration-0 checkpoint to start from instead of training one")
    p.add_argument("--device", default=d.device, help="the trainer's device: cpu | cuda (the envs run on the CPU)")
    p.add_argument("--compile-expert", action="store_true",
                   help="the gait expert collects and labels through torch.compile (collect --compile-expert): "
                        "labels equal to the eager expert's to ~1e-3, not bit for bit")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="train config overrides, e.g. context=64")


def run(args: argparse.Namespace) -> int:
    cfg = DaggerConfig(out=require(args, "out", "--out"), data=args.store, expert_episodes=args.expert_episodes, model=args.model,
                       preset=args.preset, iterations=args.iterations, episodes_per_iter=args.episodes_per_iter,
                       train_steps=args.train_steps, batch_size=args.batch_size, finetune_steps=args.finetune_steps,
                       expert_drive_prob=args.expert_drive_prob, seed=args.seed, eval_episodes=args.episodes_per_cell,
                       overrides=list(args.overrides), init_from=args.init_from,
                       device=args.device, compile_expert=args.compile_expert)
    res = run_dagger(cfg)
    print(json.dumps({"expert": res["expert_eval"]["success"],
                      "ladder": [(r["iteration"], r.get("success")) for r in res["ladder"]]}))
    return 0
