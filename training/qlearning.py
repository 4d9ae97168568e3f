"""GeRM's conservative discretized Q-learning (seed 003 §III Eq. 2-3, Q-Transformer) and its baselines.

    quadforge train --model germ|germ-il|germ-dense --store STORE --out DIR [--max-steps N] [--seed S]

Per transition (window ending at t, dataset action a_t binned per dimension, reward, next window):
- targets (Eq. 2, from the EMA target network, teacher-forced on the dataset's bins):
  for dimension i < d-1: ``max_b Q_target(s_t, a_t^{0..i}, b)`` — the NEXT dimension at the SAME step;
  for the last dimension: ``r + discount · bootstrap · max_b Q_target(s_{t+1}, b)`` — the FIRST dimension
  at the NEXT step (GeRM's published code indexes the same step here; that is a bug and tested against).
  ``bootstrap`` is 0 after a terminal step and where the next step is not stored (episode end);
  ``discount`` is γ^m for the m rewards an n-step transition sums.
- Monte-Carlo lower bound: ``target = max(Bellman, MC return)`` per sample, by default on the LAST
  dimension only, where the Bellman backup meets the reward. Applying it to every dimension
  (``mc_bound_dims="all"``) compounds its upward bias once per dimension on stochastic data: with
  success probability p and MC return m, ``Q_i = p·max(Q_{i+1}, m) + (1−p)·Q_{i+1}`` climbs towards m
  along the 12 dimensions (measured on the bandit test: Q of a 20 %-success action ≈ 0.86, not ≈ 0.3).
- TD loss ``½ (Q(s, a_data) − target)²`` and the conservative term of Eq. 3 on Q values in [0, 1]:
  ``α · ½ · Σ_{b ≠ a_data} Q(s, b)² / (bins − 1)`` — non-dataset bins pushed to 0, the dataset bin
  untouched by it. α defaults to 1 (Q-Transformer's best setting; GeRM's code uses 0.1 — ``alpha=0.1``).
- sparse reward: 1 at the last step of a successful episode, 0 otherwise; γ = 0.98; target network by
  EMA with τ = 0.999; successes:failures mixed 75.69 %:24.31 % per batch (seed 003).
- plus the MoE load-balancing loss of every layer.

Baselines from the same code: ``germ-il`` (GeRM w/o RL: cross-entropy on the dataset bins, successful
episodes only) and ``germ-dense`` (GeRM w/o MoE: dense FFNs at the MoE's active parameter count).
Training: AdamW 3e-4, linear warmup + cosine, grad clipping, TensorBoard, self-contained checkpoints
(model config, layout, normalisation stats, bin edges, target network, RNG states) that deploy alone
and resume exactly, DDP under torchrun (``training.distributed``), all in the step loop both trainers
share (``training.loop.TrainLoop``): this module supplies the batch -> loss terms, the EMA and validation.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from quadforge.layout import ObsLayout, get_layout
from quadforge.data.ram_budget import sampler_source
from quadforge.data.samplers import TransitionSampler
from quadforge.models.binning import BIN_METHODS, ActionBinner, fit_binner
from quadforge.models.checkpoint import Checkpoint, check_model, latest_checkpoint, load_checkpoint, load_state
from quadforge.training.distributed import DistInfo, broadcast_object, cleanup, init_distributed, wrap_model
from quadforge.training.imitation import open_source
from quadforge.experts.germ_policy import action_space_of
from quadforge.training.loop import (COMMON_STEP_FLAGS, RunLog, TrainLoop, apply_trainer_args, check_amp,
                                     check_resume_provenance, resume_from, save_run_checkpoint)
from quadforge.models.germ import GeRM, GeRMConfig
from quadforge.models.losses import (MC_BOUND_DIMS, SEED003_SUCCESS_RATIO, bellman_targets, bin_imitation_terms,
                                     ema_update, q_learning_terms, with_mc_lower_bound)
from quadforge.models.registry import model_names, model_spec
from quadforge.training.optim import OptimConfig, build_optimizer, build_scheduler
from quadforge.output_paths import check_train_out
from quadforge.seeding import rank_seed, seed_everything
from quadforge.typed_values import count

OBJECTIVES = ("q", "il")


def germ_models() -> tuple[str, ...]:
    """The models this trainer trains (``models.registry``: trainer ``qlearning``)."""
    return model_names(trainer="qlearning")


@dataclass
class GeRMTrainConfig:
    model_name: str = "germ"
    objective: str = "q"                 # "q" (conservative Q-learning) | "il" (cross-entropy on bins)
    model: GeRMConfig = field(default_factory=lambda: GeRMConfig(obs_dim=0))
    layout: str = "proprio"
    action_feature: str = "actions"      # "actions" (12-D joint) | "hl_commands" (seed 003 Eq. 9)
    batch_size: int = 64
    max_steps: int = 2000
    gamma: float = 0.98
    alpha: float = 1.0                   # conservative weight (Q-T paper 1; GeRM code 0.1)
    tau: float = 0.999                   # target network EMA
    n_step: int = 1
    mc_lower_bound: bool = True
    mc_bound_dims: str = "last"          # "last" | "all" (see the module docstring)
    success_ratio: float | None = SEED003_SUCCESS_RATIO   # None: draw transitions as they come
    success_only: bool = False
    bin_method: str = "uniform"
    bin_percentile: float = 0.0          # 0 = min-max edges
    val_fraction: float = 0.1
    ram_budget: str = "auto"      # the RAM path's limit ("auto": half the machine's memory); above it, out of core
    val_batches: int = 4
    log_every: int = 50
    val_every: int = 500                 # validate and checkpoint every N steps (and at the end)
    keep_every: int = 0                  # also keep step_N.pt every N steps (0: only last.pt)
    checkpoint_every_s: float = 600.0    # also write last.pt after this much wall time (0: off; one process only)
    tensorboard: bool = True
    seed: int = 0
    amp: str = "off"                     # "bf16": forward passes under bf16 autocast (training.loop.autocast)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-4, weight_decay=0.01, warmup_frac=0.05))

    def validate(self) -> None:
        if self.model_name not in germ_models():
            raise ValueError(f"GeRM model {self.model_name!r} unknown; allowed: {germ_models()}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective {self.objective!r} unknown; allowed: {OBJECTIVES}")
        action_space_of(self.action_feature)
        if self.mc_bound_dims not in MC_BOUND_DIMS:
            raise ValueError(f"mc_bound_dims {self.mc_bound_dims!r} unknown; allowed: {MC_BOUND_DIMS}")
        if self.bin_method not in BIN_METHODS:
            raise ValueError(f"bin_method {self.bin_method!r} unknown; allowed: {BIN_METHODS}")
        for name, lo, hi in (("gamma", 0.0, 1.0), ("tau", 0.0, 1.0)):
            v = getattr(self, name)
            if not lo < v <= hi:
                raise ValueError(f"{name}={v}; must be in ({lo}, {hi}]")
        if self.alpha < 0:
            raise ValueError(f"alpha={self.alpha}; must be >= 0")
        for name in ("batch_size", "max_steps", "n_step", "log_every", "val_every"):
            count(getattr(self, name), name)
        if self.success_ratio is not None and not 0.0 <= self.success_ratio <= 1.0:
            raise ValueError(f"success_ratio={self.success_ratio}; must be in [0, 1] or None")
        check_amp(self.amp)


def small_model() -> GeRMConfig:
    """CPU-sized default: 4 layers x 128, 8 experts (top-2) of width 256, context 8, 256 bins."""
    return GeRMConfig(obs_dim=0, context=8, d_model=128, num_layers=4, num_heads=4, ffn_hidden=256)


def paper_model() -> GeRMConfig:
    """Seed 003 Table II scale: 8 layers, 8 heads, 8 experts top-2, 256 bins (GPU-sized; the context is
    6 observation steps like its 6 history images; width 512 / expert FFN 2048 is our reading of RT-1's
    layer sizes)."""
    return GeRMConfig(obs_dim=0, context=6, d_model=512, num_layers=8, num_heads=8, ffn_hidden=2048)


# "cpu" is what `train --help` and the other trainers call their CPU-sized preset: the same one here
PRESETS = {"small": small_model, "cpu": small_model, "paper": paper_model}


def default_config(model_name: str, preset: str | None = None) -> GeRMTrainConfig:
    if model_name not in germ_models():
        raise ValueError(f"GeRM model {model_name!r} unknown; allowed: {germ_models()}")
    preset = preset or "small"
    if preset not in PRESETS:
        raise ValueError(f"GeRM preset {preset!r} unknown; allowed: {sorted(PRESETS)}")
    cfg = GeRMTrainConfig(model_name=model_name, model=PRESETS[preset]())
    if model_spec(model_name, "proprio").objective == "imitation":   # GeRM w/o RL: of the demonstrations
        cfg.objective, cfg.success_only, cfg.success_ratio = "il", True, None
    return cfg


# --- the objective (the terms are models.losses, shared with the VLA trainer) ------------------------

def q_targets(target: nn.Module, batch: Mapping[str, torch.Tensor], bins: torch.Tensor,
              mc_lower_bound: bool = True, mc_bound_dims: str = "last") -> torch.Tensor:
    """Targets (B, d) for a batch from the target network (no gradient)."""
    with torch.no_grad():
        q_same = torch.sigmoid(target(batch["obs"], batch["mask"], bins[:, :-1]).logits)       # (B, d, K)
        q_next = torch.sigmoid(target(batch["next_obs"], batch["next_mask"]).logits[:, 0])      # (B, K)
        bootstrap = ~(batch["done"].bool() | batch["last"].bool())
        y = bellman_targets(q_same, q_next, batch["reward"], batch["discount"], bootstrap)
        return with_mc_lower_bound(y, batch["mc_return"], mc_bound_dims) if mc_lower_bound else y


def losses(model: nn.Module, target: nn.Module | None, batch: Mapping[str, torch.Tensor], binner: ActionBinner,
           cfg: GeRMTrainConfig) -> dict[str, torch.Tensor]:
    """All loss terms of one batch; ``loss`` is what is minimised."""
    bins = binner.encode(batch["action"])                                    # (B, d)
    out = model(batch["obs"], batch["mask"], bins[:, :-1])                   # logits (B, d, K)
    if cfg.objective == "il":
        return bin_imitation_terms(out.logits, bins, out.aux_loss)
    y = q_targets(target, batch, bins, cfg.mc_lower_bound, cfg.mc_bound_dims)
    return q_learning_terms(out.logits, bins, y, out.aux_loss, cfg.alpha)


# --- data ----------------------------------------------------------------------------------------

def make_samplers(source: Any, layout: ObsLayout, cfg: GeRMTrainConfig, info: DistInfo):
    data = sampler_source(source, list(layout.term_names) + [cfg.action_feature, "terminated"], layout, cfg.ram_budget,
                          log=print if info.is_main else None)
    common = dict(layout=layout, context=cfg.model.context, gamma=cfg.gamma, reward="sparse",
                  success_only=cfg.success_only, n_step=cfg.n_step, seed=cfg.seed,
                  val_fraction=cfg.val_fraction, action_feature=cfg.action_feature)
    train = TransitionSampler(data, split="train" if cfg.val_fraction > 0 else "all",
                              success_ratio=cfg.success_ratio, rank=info.rank, world_size=info.world_size, **common)
    val = None
    if cfg.val_fraction > 0:
        try:
            val = TransitionSampler(data, split="val", **common)
        except ValueError as err:   # e.g. one episode, or no successes among the held-out ones
            if "no episodes left" not in str(err):
                raise
            if info.is_main:
                print(f"[{cfg.model_name}] validation disabled: {err}", flush=True)
    return data, train, val


def _to(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


# --- training ------------------------------------------------------------------------------------

def build_model(cfg: GeRMTrainConfig) -> GeRM:
    model_cfg = cfg.model.dense_matched() if model_spec(cfg.model_name, "proprio").dense else cfg.model
    return GeRM(model_cfg)


@torch.no_grad()
def validate(model: GeRM, target: GeRM | None, sampler: Any, binner: ActionBinner, cfg: GeRMTrainConfig,
             device: torch.device) -> dict[str, float]:
    """Mean loss terms and greedy-vs-dataset bin agreement over a few validation batches."""
    was = model.training
    model.eval()
    sums: dict[str, float] = {}
    for _ in range(cfg.val_batches):
        batch = _to(sampler.sample(cfg.batch_size), device)
        terms = losses(model, target, batch, binner, cfg)
        greedy, _ = model.greedy(batch["obs"], batch["mask"])
        terms["greedy_agreement"] = (greedy == binner.encode(batch["action"])).float().mean()
        for k, v in terms.items():
            sums[k] = sums.get(k, 0.0) + float(v) / cfg.val_batches
    model.train(was)
    return sums


def train(cfg: GeRMTrainConfig, source: Any, out_dir: str | Path | None, device: str = "cpu", resume: bool = False,
          provenance: Mapping[str, Any] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Train on ``source`` (a store path, an open TrajectoryStore, a StoreSet or EpisodeArrays: opened as
    ``training.imitation.train`` opens its data) into ``out_dir`` (None: no files); returns a summary dict
    (``history``, ``val``, ``checkpoint``: the path of last.pt or None, ``model``, ``target``, parameter
    counts). An ``out_dir`` holding an earlier run is refused unless ``resume`` continues it or
    ``overwrite`` replaces it."""
    cfg.validate()
    check_train_out(out_dir, resume, overwrite)
    if resume and out_dir is None:
        raise ValueError("resume=True needs out_dir (the run directory holding last.pt)")
    source, opened = open_source(source)
    if provenance is None and opened.get("store") is not None:   # the data a deployment is checked against
        provenance = {"data": opened["store"], "robot": opened["robot"], "control_dt": opened["control_dt"]}
    info = init_distributed(device)
    seed_everything(rank_seed(cfg.seed, info.rank))
    run = GeRMRun(cfg, source, Path(out_dir) if out_dir is not None else None, info, resume, provenance)
    loop = run.loop()
    try:
        history = loop.run(run.start)
        if run.start >= cfg.max_steps:
            loop.save(run.start)
    finally:   # a stopped run (a non-finite loss) frees OUT's run lock and the process group too
        run.log.close()
        cleanup(info)
    model = run.model
    return {"history": history, "val": run.val_history,
            "checkpoint": str(run.out / "last.pt") if run.out is not None else None, "model": model,
            "target": run.target, "active_parameters": model.active_parameters(),
            "total_parameters": model.total_parameters()}


def _fresh_binner_and_stats(cfg: GeRMTrainConfig, sampler: Any, info: DistInfo):
    """Bin edges fitted to the training actions and the observation statistics, on the main rank and
    broadcast: (ActionBinner, obs mean, obs std)."""
    fitted = None
    if info.is_main:
        edges = fit_binner(sampler.binning_actions(), cfg.model.num_bins, cfg.bin_method, cfg.bin_percentile).edges
        fitted = (edges, *sampler.obs_stats())
    edges, mean, std = broadcast_object(fitted, info)
    return ActionBinner(edges), mean, std


# the GeRMTrainConfig fields that decide which transitions a run draws: a resume must keep them
RESUME_DEFINES = ("seed", "batch_size", "val_fraction", "success_ratio", "success_only", "layout",
                  "action_feature", "n_step")


class GeRMRun:
    """One proprioceptive GeRM run: samplers, the Q-network and its EMA target, binner, optimizer, and
    the parts ``TrainLoop`` calls (``loss_terms``, ``after_step``, ``validate``, ``checkpoint``)."""

    def __init__(self, cfg: GeRMTrainConfig, source: Any, out: Path | None, info: DistInfo, resume: bool,
                 provenance: Mapping[str, Any] | None):
        self.cfg, self.out, self.info = cfg, out, info
        self.layout = get_layout(cfg.layout)
        cfg.model.obs_dim = self.layout.dim
        data, self.sampler, self.val_sampler = make_samplers(source, self.layout, cfg, info)
        cfg.model.action_dim = int(self.sampler.steps.actions.shape[1])
        cfg.model.validate()
        self.model = build_model(cfg).to(info.device)
        ckpt = None
        if resume:
            path = latest_checkpoint(out)
            ckpt = load_checkpoint(path, map_location="cpu")
            check_model(ckpt, cfg.model_name, self.model.cfg.to_dict(), where=path)
            binner = ActionBinner.from_dict(ckpt.extra["binner"])
            load_state(self.model, ckpt)
        else:
            binner, mean, std = _fresh_binner_and_stats(cfg, self.sampler, info)
            self.model.set_obs_stats(mean.to(info.device), std.to(info.device))
        self.binner = binner.to(info.device)
        self.ddp_model = wrap_model(self.model, info)   # DDP broadcasts rank 0's weights: copy the target after
        self.target = copy.deepcopy(self.model).eval().requires_grad_(False) if cfg.objective == "q" else None
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, cfg.max_steps)
        self.generators = {"sampler": self.sampler.rng}   # the transition sampler's stream, saved for resume
        self.start = 0 if ckpt is None else resume_from(ckpt, self.optimizer, self.scheduler, info, self.target,
                                                        self.generators)
        self.prov = {"episodes": int(data.num_episodes), "steps": int(data.num_steps),
                     "successes": int(np.asarray(data.episode_info["success"]).astype(bool).sum()),
                     "train_transitions": len(self.sampler) * info.world_size, **dict(provenance or {})}
        if ckpt is not None:
            check_resume_provenance(out, ckpt, self.prov, ("data", "episodes", "steps", "train_transitions"),
                                    dataclasses.asdict(cfg), RESUME_DEFINES, takes_init_from=False)
        self.log = RunLog(out, info.is_main, cfg.tensorboard, who=cfg.model_name, resumed_at=self.start)
        self.val_history: list[dict[str, float]] = []

    def checkpoint(self, step: int, rngs: dict | None, scheduled: bool) -> Path | None:
        if not self.info.is_main or self.out is None:
            return None
        cfg, model = self.cfg, self.model
        extra = {"binner": {"edges": self.binner.edges.cpu()}, "action_feature": cfg.action_feature,
                 "action_space": action_space_of(cfg.action_feature), "rng": rngs}
        if self.target is not None:
            extra["target_state_dict"] = {k: v.detach().cpu() for k, v in self.target.state_dict().items()}
        mean, std = model.encoder.obs_mean.cpu(), model.encoder.obs_std.cpu()
        a_mean, a_std = self.sampler.action_stats()
        c = Checkpoint(model_name=cfg.model_name, model_config=model.cfg.to_dict(),
                       state_dict={k: v.detach().cpu() for k, v in model.state_dict().items()},
                       layout=self.layout.to_dict(), obs_stats={"mean": mean, "std": std},
                       action_stats={"mean": a_mean, "std": a_std}, provenance=self.prov,
                       optimizer=self.optimizer.state_dict(), scheduler=self.scheduler.state_dict(), step=step,
                       seed=cfg.seed, train_config=dataclasses.asdict(cfg), extra=extra)
        return save_run_checkpoint(self.out, c, step, keep=bool(cfg.keep_every) and step % cfg.keep_every == 0)

    def loss_terms(self, step: int) -> dict[str, torch.Tensor]:
        batch = _to(self.sampler.sample(self.cfg.batch_size), self.info.device)
        return losses(self.ddp_model, self.target, batch, self.binner, self.cfg)

    def after_step(self) -> None:
        if self.target is not None:
            ema_update(self.target, self.model, self.cfg.tau)

    def validate(self, step: int) -> None:
        """On the main rank, into its own rows (``val/`` in TensorBoard); the other ranks wait at the save."""
        if self.val_sampler is not None and self.info.is_main:
            v = validate(self.model, self.target, self.val_sampler, self.binner, self.cfg, self.info.device)
            v["step"] = step
            self.val_history.append(v)
            self.log.line("val", f"val step {step}", v, step)

    def loop(self) -> TrainLoop:
        cfg, info = self.cfg, self.info
        self.model.train()
        return TrainLoop(info=info, optimizer=self.optimizer, scheduler=self.scheduler, clip_module=self.model,
                         grad_clip=cfg.optim.grad_clip, loss_terms=self.loss_terms, checkpoint=self.checkpoint,
                         report=lambda row: self.log.line("train", f"step {row['step']}/{cfg.max_steps}", row,
                                                          row["step"]),
                         max_steps=cfg.max_steps, log_every=cfg.log_every, val_every=cfg.val_every,
                         items_per_step=cfg.batch_size * info.world_size, rate_name="transitions_per_s",
                         checkpoint_every_s=cfg.checkpoint_every_s, desc=f"train {cfg.model_name}",
                         after_step=self.after_step, validate=self.validate, generators=self.generators,
                         amp=cfg.amp)


# --- CLI -----------------------------------------------------------------------------------------

def config_from_args(args: argparse.Namespace) -> GeRMTrainConfig:
    return apply_trainer_args(default_config(str(args.model), getattr(args, "preset", None)), args,
                              COMMON_STEP_FLAGS + ("layout",))


def run_from_args(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if not getattr(args, "store", None):
        raise ValueError("--store STORE is required for GeRM training")
    if not getattr(args, "out", None):
        raise ValueError("--out DIR is required for GeRM training")
    # train() opens the path and records it, with the robot the data came from (deploying on another is refused)
    summary = train(cfg, args.store, args.out, device=getattr(args, "device", "cpu"),
                    resume=bool(getattr(args, "resume", False)), overwrite=bool(getattr(args, "overwrite", False)))
    print(f"[{cfg.model_name}] wrote {summary['checkpoint']} (active {summary['active_parameters']:,} / "
          f"total {summary['total_parameters']:,} parameters)")
    return 0
