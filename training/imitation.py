"""Imitation training of the sequence-model zoo on a trajectory store (``quadforge train``).

Windows come from ``data.samplers.WindowSampler`` (layout vector per step, left-padded with a mask);
observations are normalised by the training split's mean/std; the loss is the masked MSE on the
actions (or a Gaussian NLL with a learned per-dimension log-std) over every real position of the
window - FCNet's objective (seed 000 Eq. 4). One process or DDP under torchrun: each rank draws its
batches from a disjoint shard of the window index with its own seeded stream; the stream of step s
is derived from (seed, rank, s), so a resumed run draws exactly the batches the uninterrupted run
would have. Checkpoints carry everything ``experts.learned.load_policy`` needs. The step loop (logging,
checkpoints, resume, DDP) is ``training.loop.TrainLoop``; this module supplies batch -> loss and validation.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from quadforge.layout import NUM_JOINTS, TERM_DIMS, get_layout
from quadforge.data.episodes import EpisodeArrays
from quadforge.data.ram_budget import sampler_source
from quadforge.data.samplers import WindowSampler
from quadforge.data.store import TrajectoryStore
from quadforge.data.store_set import StoreSet
from quadforge.output_paths import check_train_out
from quadforge.overrides import parse_overrides
from quadforge.seeding import numpy_rng, seed_everything
from quadforge.training import distributed as dist
from quadforge.models.checkpoint import Checkpoint, check_model, load_checkpoint, load_state, save_checkpoint
from quadforge.training.curves import read_val_curve
from quadforge.training.loop import RunLog, TrainLoop, check_resume_provenance, save_run_checkpoint, set_rng_state
from quadforge.models import SequenceModel, build_model
from quadforge.training.optim import build_optimizer, build_scheduler
from quadforge.training.presets import TrainConfig, apply_train_overrides, preset


# --- data ----------------------------------------------------------------------------------------------

def open_source(data: Any) -> tuple[Any, dict[str, Any]]:
    """A TrajectoryStore (open, or opened from a path), a StoreSet or in-memory EpisodeArrays, with its
    provenance."""
    if isinstance(data, EpisodeArrays):
        return data, {"store": None, "source": "in-memory EpisodeArrays", "episodes": data.num_episodes,
                      "steps": data.num_steps}
    if isinstance(data, StoreSet):   # several stores as one (DAgger's aggregate)
        first = data.stores[0]
        return data, {"store": [str(r.resolve()) for r in data.roots],
                      "generation": [s.generation for s in data.stores], "episodes": data.num_episodes,
                      "steps": data.num_steps, "robot": first.schema.robot, "control_dt": first.schema.control_dt}
    if data is None:
        raise ValueError("--store is required: the trajectory store to train on")
    if isinstance(data, TrajectoryStore):   # opened already
        store, path = data, data.root
    else:
        path = Path(data)
        if not path.exists():
            raise FileNotFoundError(f"--store {path}: no trajectory store there")
        store = TrajectoryStore.open(path)
    return store, {"store": str(path.resolve()), "generation": store.generation,
                   "episodes": store.num_episodes, "steps": store.num_steps,
                   "robot": store.schema.robot, "control_dt": store.schema.control_dt}


def make_samplers(cfg: TrainConfig, source: Any, info: dist.DistInfo, use_rtg: bool):
    layout = get_layout(cfg.layout)
    filters = {"success_only": True} if cfg.success_only else None
    common = dict(layout=layout, context=cfg.context, val_fraction=cfg.val_fraction, filters=filters,
                  seed=cfg.seed, reward_feature="rewards" if use_rtg else None)
    source = sampler_source(source, [*layout.term_names, "actions", *(["rewards"] if use_rtg else [])], layout,
                            cfg.ram_budget, log=print if info.is_main else None)
    train = WindowSampler(source, split="train", rank=info.rank, world_size=info.world_size, **common)
    val = None
    if cfg.val_fraction > 0:
        try:
            val = WindowSampler(source, split="val", **common)
        except ValueError as err:   # e.g. every val episode filtered out: train on, say so
            print(f"imitation: no validation split ({err})")
    return train, val


def relabelled_stores(source: Any) -> list[str]:
    """The stores of ``source`` whose ``actions`` are labels, not what drove the env: those holding
    ``applied_actions`` (a relabelled collection, DAgger's; ``collection/relabel.py``)."""
    if isinstance(source, EpisodeArrays):
        return ["in-memory EpisodeArrays"] if "applied_actions" in source.features else []
    stores = source.stores if isinstance(source, StoreSet) else [source]
    return [str(s.root) for s in stores if "applied_actions" in s.feature_names]


def refuse_labels_as_action_inputs(model: SequenceModel, relabelled: list[str]) -> None:
    """A model that reads its previous actions (StARformer, Decision ConvFormer) would read a relabelled
    store's labels as them: the expert's action where the driver applied another, an input the deployed
    model never sees (it reads its own previous output). Feeding it ``applied_actions`` instead is not built
    yet, so such a run is refused rather than trained on the wrong inputs. ``relabelled``: the relabelled
    sources, by name (``relabelled_stores``; DAgger names the stores it will collect)."""
    if model.use_actions and relabelled:
        raise ValueError(f"model {model.name!r} reads its previous actions, and the actions of "
                         f"{', '.join(relabelled)} are relabelled (the labels differ from applied_actions, what "
                         f"drove the env): it would learn from the labels as its previous actions. Train a model "
                         f"without action inputs on relabelled data (fcnet, mlp, transformer), or set "
                         f"model.use_actions=False (docs/training.md)")


# --- objective -----------------------------------------------------------------------------------------

class ImitationObjective(nn.Module):
    """Model + (for NLL) a learned log-std; ``forward(batch) -> loss`` so DDP sees one module."""

    def __init__(self, model: SequenceModel, loss: str):
        super().__init__()
        self.model, self.loss = model, loss
        self.log_std = nn.Parameter(torch.zeros(model.action_dim)) if loss == "nll" else None

    def forward(self, obs, actions, rtg, mask) -> torch.Tensor:
        pred = self.model(obs, actions if self.model.use_actions else None, rtg if self.model.use_rtg else None, mask)
        m = mask.unsqueeze(-1).to(pred.dtype)                                        # (B, n, 1)
        err = (pred - actions) ** 2
        if self.loss == "nll":   # Gaussian NLL per dimension, constant dropped
            err = 0.5 * err * torch.exp(-2 * self.log_std) + self.log_std
        return (err * m).sum() / (m.sum() * pred.shape[-1]).clamp_min(1.0)


@dataclass
class Batches:
    """Turns sampler batches into normalised model inputs on the device."""

    obs_mean: torch.Tensor
    obs_std: torch.Tensor
    rtg_scale: float
    device: torch.device

    def __call__(self, batch: dict[str, torch.Tensor]):
        # to the device first: the sampler's batches are on the CPU, the statistics on the run's device
        obs = (batch["obs"].to(self.device) - self.obs_mean) / self.obs_std
        rtg = batch.get("rtg")
        rtg = rtg.to(self.device) / self.rtg_scale if rtg is not None else None
        return obs, batch["actions"].to(self.device), rtg, batch["mask"].to(self.device)


# --- training ------------------------------------------------------------------------------------------

@dataclass
class TrainResult:
    model: SequenceModel
    step: int
    checkpoint: Path | None
    history: list[dict[str, float]] = field(default_factory=list)


def train(cfg: TrainConfig, data: Any, out_dir: str | Path | None, device: str = "cpu",
          resume: bool = False, overwrite: bool = False) -> TrainResult:
    """Train on ``data`` (a store path, an open TrajectoryStore, a StoreSet or EpisodeArrays) into
    ``out_dir`` (None: no files). An ``out_dir`` holding an earlier run is refused unless ``resume``
    continues it or ``overwrite`` replaces it (as ``quadforge train``'s flags), and so is one another
    training is writing at the time."""
    cfg.validate()
    check_train_out(out_dir, resume, overwrite)
    info = dist.init_distributed(device)
    try:
        return _train(cfg, data, Path(out_dir) if out_dir else None, info, resume)
    finally:
        dist.cleanup(info)


def _train(cfg: TrainConfig, data: Any, out: Path | None, info: dist.DistInfo, resume: bool) -> TrainResult:
    seed_everything(cfg.seed)   # identical initial weights on every rank
    if info.enabled:   # ranks share the machine's cores
        torch.set_num_threads(max(1, torch.get_num_threads() // info.world_size))
    run = ImitationRun(cfg, data, out, info, resume)
    run.announce()
    set_rng_state(run.saved_rng, info)   # torch's stream (dropout) as it was when the checkpoint was written
    run.ddp.train()
    loop = run.loop()
    try:
        history = loop.run(run.start)
    finally:   # a stopped run (a non-finite loss) frees OUT's run lock too
        run.log.close()
    dist.barrier(info)
    # a resume with no steps left writes nothing: its checkpoint is the one it resumed from
    kept = out / "last.pt" if out is not None and resume and run.start else None
    return TrainResult(model=run.model, step=max(run.start, run.max_steps), checkpoint=loop.last_path or kept,
                       history=history)


def train_or_continue(cfg: TrainConfig, data: Any, out_dir: str | Path, device: str = "cpu") -> TrainResult:
    """A job's run that an interruption may have stopped part-way (``reproduce``, ``dagger``): continued from
    its ``last.pt`` when it has one (a resumed run equals an uninterrupted one, bit for bit:
    tests/training/test_resume_files.py), else started afresh (replacing a folder that holds no checkpoint).
    The job must give the same ``cfg`` as the interrupted run (they refuse other options)."""
    resume = (Path(out_dir) / "last.pt").is_file()
    return train(cfg, data, out_dir, device=device, resume=resume, overwrite=not resume)


def final_val_loss(result: TrainResult, out_dir: str | Path) -> float | None:
    """The run's last validation loss: from this call's history, or (a continued run with no validation
    left to do) from the run's ``val.jsonl``."""
    val = [h["val_loss"] for h in result.history if "val_loss" in h]
    if val:
        return val[-1]
    rows = read_val_curve(Path(out_dir))
    return rows[-1].get("loss") if rows else None


# the TrainConfig fields that decide which batches a run draws: a resume must keep them (more --max-steps is fine)
RESUME_DEFINES = ("seed", "batch_size", "val_fraction", "success_only", "layout", "context")


class ImitationRun:
    """One imitation run: samplers, model + objective, optimizer, input scaling, and the parts
    ``TrainLoop`` calls (``loss_terms``, ``validate``, ``checkpoint``, ``report``)."""

    def __init__(self, cfg: TrainConfig, data: Any, out: Path | None, info: dist.DistInfo, resume: bool):
        self.cfg, self.out, self.info = cfg, out, info
        source, self.provenance = open_source(data)
        self.layout = get_layout(cfg.layout)
        use_rtg = bool(cfg.model_config.get("use_rtg", False))
        self.train_s, self.val_s = make_samplers(cfg, source, info, use_rtg)
        self.per_rank = self.train_s.num_windows // info.world_size
        if self.per_rank < 1:
            raise ValueError(f"{self.train_s.num_windows} training windows cannot be sharded over "
                             f"{info.world_size} ranks")
        self.max_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * self.train_s.num_windows
                                                           / (cfg.batch_size * info.world_size)))
        self.model = build_model(cfg.model, obs_dim=self.layout.dim, action_dim=NUM_JOINTS, context=cfg.context,
                                 **cfg.model_config).to(info.device)
        refuse_labels_as_action_inputs(self.model, relabelled_stores(source) if self.model.use_actions else [])
        self.objective = ImitationObjective(self.model, cfg.loss).to(info.device)
        self.obs_mean, self.obs_std = self.train_s.obs_stats()
        self.act_mean, self.act_std = self.train_s.action_stats()
        self.optimizer = build_optimizer(self.objective, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, self.max_steps)
        self.start, self.saved_rng = 0, None
        self.best_val = math.inf   # the lowest validation loss so far: best.pt holds that step's weights
        if cfg.init_from and not resume:
            self._init_from(cfg.init_from)
        if resume:
            self._resume()
        self.provenance.update(layout=self.layout.name, success_only=cfg.success_only,
                               train_episodes=self.train_s.num_episodes,
                               val_episodes=self.val_s.num_episodes if self.val_s else 0,
                               train_windows=self.train_s.num_windows)
        self.target_return = self._target_return(use_rtg)
        self.ddp = dist.wrap_model(self.objective, info)
        self.to_inputs = Batches(self.obs_mean.to(info.device), self.obs_std.to(info.device), cfg.rtg_scale,
                                 info.device)
        self.val_batches = _fixed_val_batches(cfg, self.val_s)
        self.log = RunLog(out, info.is_main, cfg.tensorboard, who="imitation", resumed_at=self.start)

    def _init_from(self, path: str) -> None:
        """Fine-tune: the weights and the input scaling they were trained with."""
        init = load_checkpoint(path)
        check_model(init, self.cfg.model, self.model.config, where=path)
        load_state(self.model, init)
        self.obs_mean, self.obs_std = init.obs_stats["mean"], init.obs_stats["std"]
        self.provenance["init_from"] = str(path)

    def _resume(self) -> None:
        if self.out is None:
            raise ValueError("--resume needs --out (the run directory holding last.pt)")
        ckpt = load_checkpoint(self.out / "last.pt")
        check_model(ckpt, self.cfg.model, self.model.config, where=self.out / "last.pt")
        check_resume_provenance(self.out, ckpt, self.provenance, ("store", "generation", "episodes"),
                                self.cfg.to_dict(), RESUME_DEFINES)
        load_state(self.model, ckpt)
        if self.objective.log_std is not None and "log_std" in ckpt.extra:
            self.objective.log_std.data.copy_(ckpt.extra["log_std"])
        self.optimizer.load_state_dict(ckpt.optimizer)
        self.scheduler.load_state_dict(ckpt.scheduler)
        self.obs_mean, self.obs_std = ckpt.obs_stats["mean"], ckpt.obs_stats["std"]
        self.start, self.saved_rng = ckpt.step, ckpt.extra.get("rng")
        self.best_val = _best_val_of(ckpt, self.out)

    def _target_return(self, use_rtg: bool) -> float | None:
        """Deployment conditions on the best return seen (DT's convention); None without return-to-go."""
        if not use_rtg or self.train_s.rtg is None:
            return None
        # the return to go at each episode's first step (its return): the last position of the windows ending
        # there, read as every batch reads it on either path (a table row index is a layout detail)
        steps = self.train_s.steps
        first = steps.windows(self.train_s.rtg, np.asarray(steps.starts, dtype=np.int64))[:, -1]
        return float(first.max()) / self.cfg.rtg_scale

    def checkpoint(self, step: int, name: str, keep: bool = False, rngs: dict | None = None) -> Path | None:
        if self.out is None or not self.info.is_main:
            return None
        cfg, layout = self.cfg, self.layout
        extra = {"rtg_scale": cfg.rtg_scale, "target_return": self.target_return, "loss": cfg.loss,
                 "term_dims": {n: TERM_DIMS[n] for n in layout.term_names}}
        if self.objective.log_std is not None:
            extra["log_std"] = self.objective.log_std.detach().cpu()
        if rngs is not None:
            extra["rng"] = rngs
        if math.isfinite(self.best_val):
            extra["best_val"] = self.best_val
        ck = Checkpoint(model_name=cfg.model, model_config=self.model.config,
                        state_dict={k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                        layout=layout.to_dict(), obs_stats={"mean": self.obs_mean, "std": self.obs_std},
                        action_stats={"mean": self.act_mean, "std": self.act_std}, provenance=self.provenance,
                        optimizer=self.optimizer.state_dict(), scheduler=self.scheduler.state_dict(), step=step,
                        seed=cfg.seed, train_config=cfg.to_dict(), extra=extra)
        if name == "last.pt":
            return save_run_checkpoint(self.out, ck, step, keep)
        return save_checkpoint(self.out / name, ck)

    def loss_terms(self, step: int) -> dict[str, torch.Tensor]:
        # the batch of step s derives from (seed, rank, s): a resumed run draws the same batches
        info = self.info
        rng = numpy_rng(self.cfg.seed, f"imitation/batch/rank{info.rank}/step{step}")
        ends = info.rank + info.world_size * rng.integers(0, self.per_rank, size=self.cfg.batch_size)
        return {"loss": self.ddp(*self.to_inputs(self.train_s.batch_at(ends)))}

    def validate(self, step: int) -> dict[str, float]:
        if not self.val_batches:
            return {}
        val_loss = _validate(self.objective, self.val_batches, self.to_inputs)
        self.log.val_row(step, {"loss": val_loss})
        if val_loss < self.best_val:
            self.best_val = val_loss
            self.checkpoint(step, "best.pt")
        return {"val_loss": val_loss}

    def report(self, row: dict[str, float]) -> None:
        print(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
        self.log.scalars("train", row, row["step"])

    def announce(self) -> None:
        """Print the run's shape and write ``train_config.json`` (main rank)."""
        if not self.info.is_main:
            return
        cfg, info = self.cfg, self.info
        print(f"train {cfg.model}: {self.model.num_parameters():,} params, layout {self.layout.name} "
              f"({self.layout.dim}-D), {self.train_s.num_windows} windows from {self.train_s.num_episodes} episodes, "
              f"steps {self.start}->{self.max_steps}, world {info.world_size}, device {info.device}")
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))

    def loop(self) -> TrainLoop:
        cfg = self.cfg
        return TrainLoop(info=self.info, optimizer=self.optimizer, scheduler=self.scheduler,
                         clip_module=self.objective, grad_clip=cfg.optim.grad_clip, loss_terms=self.loss_terms,
                         checkpoint=lambda step, rngs, scheduled: self.checkpoint(
                             step, "last.pt", keep=cfg.keep_checkpoints and scheduled, rngs=rngs),
                         report=self.report, max_steps=self.max_steps, log_every=cfg.log_every,
                         val_every=cfg.val_every, items_per_step=cfg.batch_size * self.info.world_size,
                         rate_name="windows_per_s", checkpoint_every_s=cfg.checkpoint_every_s,
                         desc=f"train {cfg.model}", validate=self.validate, amp=cfg.amp)


def _best_val_of(ckpt: Checkpoint, out: Path) -> float:
    """The best validation loss a resumed run had reached: recorded in its ``last.pt``; for a checkpoint
    written before that record, the one in ``best.pt`` (inf when there is none)."""
    if "best_val" in ckpt.extra:
        return float(ckpt.extra["best_val"])
    if (out / "best.pt").exists():
        return float(load_checkpoint(out / "best.pt").extra.get("best_val", math.inf))
    return math.inf


def _fixed_val_batches(cfg: TrainConfig, val_s) -> list[dict[str, torch.Tensor]]:
    if val_s is None:
        return []
    rng = numpy_rng(cfg.seed, "imitation/val")
    size = min(cfg.batch_size, val_s.num_windows)
    return [val_s.batch_at(rng.integers(0, val_s.num_windows, size=size)) for _ in range(cfg.val_batches)]


@torch.no_grad()
def _validate(objective: ImitationObjective, batches, to_inputs) -> float:
    if not batches:
        return float("nan")
    objective.eval()
    losses = [float(objective(*to_inputs(b))) for b in batches]
    objective.train()
    return float(np.mean(losses))


# --- CLI glue --------------------------------------------------------------------------------------------

def config_from_args(args: argparse.Namespace) -> TrainConfig:
    cfg = preset(args.model, args.preset)
    cfg.seed = int(args.seed)
    if args.layout:
        get_layout(args.layout)   # validate early with the allowed names
        cfg.layout = args.layout
    for name in ("max_steps", "batch_size", "log_every", "val_every"):
        value = getattr(args, name, None)
        if value is not None:
            setattr(cfg, name, int(value))
    if getattr(args, "amp", None):
        cfg.amp = str(args.amp)
    if args.success_only:
        cfg.success_only = True
    overrides = parse_overrides(args.overrides)
    apply_train_overrides(cfg, overrides)
    cfg.validate()
    return cfg


def run_from_args(args: argparse.Namespace) -> int:
    if not args.out:
        raise ValueError("--out is required: the directory for checkpoints and logs")
    cfg = config_from_args(args)
    result = train(cfg, args.store, args.out, device=args.device, resume=args.resume,
                   overwrite=bool(getattr(args, "overwrite", False)))
    if result.checkpoint is not None:
        print(f"wrote {result.checkpoint}")
    return 0
