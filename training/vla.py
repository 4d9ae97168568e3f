"""Training and deployment of the vision-language-action models (seed 003 §IV-C, Table III baselines).

    quadforge train --model rt1|germ|germ-dense|germ-il --store IMAGE_STORE --out DIR [--preset cpu|paper]

- ``rt1``: the RT-1-style model (dense decoder, non-autoregressive read-outs), cross-entropy on the bins of
  the demonstrations (successful episodes only, as behaviour cloning).
- ``germ``: MoE decoder, conservative discretised Q-learning over the 12 command dimensions with the loss
  terms of ``training.qlearning`` (Eq. 2 targets with the next-step target for the last dimension, the
  Monte-Carlo lower bound, the conservative term, EMA target network); successes:failures mixed
  75.69 %:24.31 % per batch. The 7th frame of each window enters only the target's next-step window.
- ``germ-dense``: the same with dense FFNs at the MoE's active parameter count (GeRM w/o MoE).
- ``germ-il``: the MoE network trained by cross-entropy on the demonstrations (GeRM w/o RL).

Frames are augmented by DrQ random shifts (``shift_pad`` pixels) and, if asked, a per-window colour jitter
(``hue_jitter``, ``saturation_jitter``, ``brightness_jitter``, ``tint_jitter``) during training only. Commands are
binned per dimension: ``bins="controller"`` (default) uses the gait controller's executable ranges
(``models.binning.controller_command_ranges``), ``bins="data"`` fits uniform edges to the source's
commands. Checkpoints are self-contained (model config incl. vocabulary, bin edges, the instruction table
with its prepared encoder inputs, task/camera settings, target network) and deploy alone through
``experts.registry.load_policy`` (``experts.vla.load_vla``, found by ``extra["policy_kind"] == "vla"``).

The step loop is ``training.loop.TrainLoop`` (as for the imitation and proprioceptive GeRM trainers):
logged rows (TensorBoard ``OUT/tb``), validation and ``last.pt`` every ``val_every`` steps, a wall-time
``last.pt`` every ``checkpoint_every_s``, resume (``--resume``) and DDP under torchrun. On a store the
trainer holds ``val_fraction`` of the episodes out (the seeded episode split of every trainer) and
reports their loss terms (val ``ce`` / ``bin_accuracy`` for imitation) and greedy bin agreement; its
batches come from the image sampler's chunk-aware ``stream()`` when the store is larger than the chunk
cache and i.i.d. windows when it fits (``sampling="auto"``; or ``"stream"`` / ``"uniform"``), their random
stream restarted at every checkpoint from (seed, rank, step) so that a resumed run draws what the whole
run drew.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from quadforge.envs.quard.families import family_names as quard_family_names
from quadforge.experts.hierarchical import command_binner
from quadforge.experts.vla import POLICY_KIND
from quadforge.models.binning import ActionBinner, fit_binner
from quadforge.models.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, load_state
from quadforge.models.germ_vla import GeRMVLA
from quadforge.models.losses import (MC_BOUND_DIMS, SEED003_SUCCESS_RATIO, bellman_targets, bin_imitation_terms,
                                     ema_update, q_learning_terms, with_mc_lower_bound)
from quadforge.models.vision import random_colour_jitter, random_shift
from quadforge.models.vla import VLAConfig, images_to_float
from quadforge.models.registry import build_vla_model, model_names, model_spec
from quadforge.training.optim import OptimConfig, build_optimizer, build_scheduler
from quadforge.training.vla_data import SAMPLING_MODES, ImageWindowSource, check_batch, open_image_source
from quadforge.training.grounding import (DECISION_FRAMES, TARGET_TERMS, blank_colours, GroundingProbe, TargetAuxLoss,
                                         append_row, check_vla_init, load_init_weights, null_instruction, upcycles,
                                         vocabulary_for)
from quadforge.training.distributed import (DistInfo, broadcast_object, cleanup, init_distributed, unwrap,
                                            wrap_model)
from quadforge.training.loop import (RunLog, TrainLoop, apply_trainer_args, check_amp, check_resume_provenance,
                                     resume_from, save_run_checkpoint)
from quadforge.output_paths import check_train_out
from quadforge.seeding import rank_seed, seed_everything
from quadforge.tensors import from_host
from quadforge.typed_values import count

BIN_SOURCES = ("controller", "data")


def vla_models() -> tuple[str, ...]:
    """The models this trainer trains (``models.registry``: trainer ``vla``)."""
    return model_names(trainer="vla")


def _cpu_model(**kw: Any) -> dict[str, Any]:
    """2-core preset: 64² frames through a 3-stage MBConv trunk (8×8 map), 8 tokens/frame, 6 frames,
    4 decoder layers of width 128 (GeRM: 8 experts of width 256, top-2)."""
    return dict(history=6, d_model=128, tokens_per_frame=8, token_hidden=64, num_layers=4, num_heads=4,
                ffn_hidden=256, word_dim=128,
                image=dict(stem_channels=16, stages=((24, 2, 1), (32, 2, 1), (48, 1, 1)), expand_ratio=4), **kw)


# EfficientNet-B3's stage widths/strides/repeats (stem 40): at 300² its 10×10 map is RT-1's ~81 tokens
_B3_STAGES = ((24, 1, 2), (32, 2, 3), (48, 2, 3), (96, 2, 5), (136, 1, 5), (232, 2, 6), (384, 1, 2))
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "cpu": {
        "rt1": _cpu_model(),
        "germ": _cpu_model(moe=True),
        "germ-dense": _cpu_model(moe=True),   # made dense at the MoE's active size by build_model
        "germ-il": _cpu_model(moe=True),
    },
    # GPU sizes. RT-1: 8 layers, 8 heads, width 512, FFN 512 (RT-1's published decoder). GeRM: its code's
    # 8 layers, d_model 256, 8 heads, 8 experts of hidden 1024, top-2. Both over a B3-sized trunk.
    "paper": {
        "rt1": dict(history=6, d_model=512, num_layers=8, num_heads=8, ffn_hidden=512, word_dim=512,
                    image=dict(stem_channels=40, stages=_B3_STAGES, expand_ratio=6)),
        **{m: dict(history=6, d_model=256, num_layers=8, num_heads=8, ffn_hidden=1024, moe=True, word_dim=256,
                   image=dict(stem_channels=40, stages=_B3_STAGES, expand_ratio=6))
           for m in ("germ", "germ-dense", "germ-il")},
    },
}


@dataclass
class VLATrainConfig:
    model_name: str = "rt1"
    preset: str = "cpu"
    model: dict[str, Any] = field(default_factory=dict)   # VLAConfig.make kwargs (image size/vocab from data)
    instruction: str = "words"           # "words" | "wordllama"
    objective: str = "ce"                # "ce" (rt1, germ-il) | "q" (germ, germ-dense)
    batch_size: int = 32
    max_steps: int = 2000
    shift_pad: int = 4                   # DrQ random shift in pixels (0: off)
    # colour augmentation per window (models.vision.random_colour_jitter): max hue turn in degrees and the
    # saturation / brightness factors' spread; the trunk otherwise meets only the four training colours,
    # and QUARD's held-out colours are other hues and shades of them. 0: off
    hue_jitter: float = 0.0
    saturation_jitter: float = 0.0
    brightness_jitter: float = 0.0
    tint_jitter: float = 0.0             # the largest share of white mixed in (a pale red reads as pink)
    bins: str = "controller"             # "controller" | "data"
    num_bins: int = 256
    # imitation only: cross-entropy against a Gaussian over neighbouring bins (std in bins; 0: the one data
    # bin). Plain CE over 256 fine bins treats "8 bins off" like "100 bins off", so the small steering
    # commands (|wz| ~ 0.1 rad/s, ~10 bins from zero) get no graded signal (HL-Gauss, Farebrother et al. 2024)
    label_sigma: float = 0.0
    init_from: str | None = None         # a VLA checkpoint (same model and config) whose weights start the run
    # a VLA checkpoint of any model whose front-end (trunk, TokenLearner, instruction encoder: the part that
    # grounds the words in the frames) replaces the starting front-end, e.g. a GeRM decoder on a grounded
    # RT-1-style front-end; its front-end must have the same shapes (image size, history, widths, vocabulary)
    frontend_from: str | None = None
    # the language-blind baseline: every instruction word maps to the unknown token (the model sees how many
    # words there are, i.e. the family's template, never which object is named); grounding = score above it
    blind_instruction: bool = False
    # weight of the auxiliary grounding loss (training.grounding.TargetAuxLoss: a head regresses the named
    # target's bearing and distance in the robot frame from the newest frame's tokens); 0: off
    target_loss: float = 0.0
    # a share of every training batch drawn from windows ending in an episode's first ``early_frames`` image
    # frames: a QUARD episode's choice between its two objects is made there (later frames mostly show the
    # chosen one ahead, so uniform windows carry the words' signal in ~1 of 10 rows); 0: uniform
    # the share of training rows whose instruction loses its colour words (``training.grounding.blank_colours``):
    # held-out colours are one <unk> to the words encoder, so without this the model never sees an instruction
    # whose colour it does not know; 0: off
    colour_dropout: float = 0.0
    # the share of training rows whose whole instruction is the null one (``training.grounding.null_instruction``):
    # the language-free branch an acting-time contrast subtracts (classifier-free guidance); 0: off
    instruction_dropout: float = 0.0
    early_share: float = 0.0
    early_frames: int = DECISION_FRAMES
    gamma: float = 0.98
    alpha: float = 1.0                   # conservative weight (Q-T paper 1; GeRM code 0.1)
    tau: float = 0.999
    mc_lower_bound: bool = True
    mc_bound_dims: str = "last"
    success_ratio: float | None = SEED003_SUCCESS_RATIO
    success_only: bool = False
    families: tuple[str, ...] = ()       # QUARD families to train on (task_params["family"]); (): all in the store
    sampling: str = "auto"               # store windows: "auto" | "stream" (chunk-aware) | "uniform" (i.i.d.)
    prefetch: int = 2                    # store batches built ahead on a thread (0: off)
    # decompressed frame chunks kept in RAM by the sampler: uniform windows over a store larger than the
    # cache decode a chunk per window (measured ~350 ms per batch of 32 on a 28k-frame store with 32);
    # 128 chunks of 256 64² RGB frames are ~400 MB and hold a 30k-frame store whole
    cache_chunks: int = 128
    val_fraction: float = 0.1            # store episodes held out for validation (data.episodes.split_episodes)
    ram_budget: str = "auto"             # the per-step features' RAM limit ("auto": half the memory); above it, out of core
    log_every: int = 50
    val_every: int = 500                 # validate and checkpoint every N steps (and at the end)
    val_batches: int = 4
    # held-out windows of the instruction-swap metric (training.grounding: does the command turn toward the
    # object the words name?), logged as val/swap_* beside the losses; 0: off
    swap_windows: int = 128
    # the store the swap metric reads (every episode held out: e.g. a few scenes collected with another seed);
    # None: the training store's held-out episodes (those whose scene has no counterfactual partner in training)
    swap_store: str | None = None
    keep_every: int = 0                  # also keep step_N.pt every N steps (0: only last.pt)
    checkpoint_every_s: float = 600.0    # also write last.pt after this much wall time (0: off)
    tensorboard: bool = True
    seed: int = 0
    amp: str = "off"                     # "bf16": forward passes under bf16 autocast (training.loop.autocast)
    # β2 = 0.95, not Adam's 0.999: the first steps' gradients (12 heads × 256 bins from uniform) are
    # large and a 1000-step second-moment memory then shrinks the steps for the small, late signal that
    # ties the action to the instruction (measured on the colour task: stuck at chance for 1200 steps
    # with 0.999, learned within ~400 with 0.95)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01,
                                                                   warmup_frac=0.05))

    def validate(self) -> None:
        if self.model_name not in vla_models():
            raise ValueError(f"VLA model {self.model_name!r} unknown; allowed: {vla_models()}")
        if self.objective not in ("ce", "q"):
            raise ValueError(f"VLA objective {self.objective!r} unknown; allowed: ('ce', 'q')")
        if self.bins not in BIN_SOURCES:
            raise ValueError(f"VLA bins {self.bins!r} unknown; allowed: {BIN_SOURCES}")
        if self.mc_bound_dims not in MC_BOUND_DIMS:
            raise ValueError(f"mc_bound_dims {self.mc_bound_dims!r} unknown; allowed: {MC_BOUND_DIMS}")
        if self.sampling not in SAMPLING_MODES:
            raise ValueError(f"VLA sampling {self.sampling!r} unknown; allowed: {SAMPLING_MODES}")
        for name in ("batch_size", "max_steps", "log_every", "val_every", "val_batches", "num_bins", "cache_chunks"):
            count(getattr(self, name), f"VLA train config {name}")
        for name in ("prefetch", "keep_every", "checkpoint_every_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"VLA train config {name}={getattr(self, name)}; must be >= 0")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction={self.val_fraction}; must be in [0, 1)")
        if self.label_sigma < 0:
            raise ValueError(f"label_sigma={self.label_sigma}; must be >= 0 (bins; 0: plain cross-entropy)")
        if self.label_sigma > 0 and self.objective != "ce":
            raise ValueError(f"label_sigma={self.label_sigma} smooths the imitation targets; the {self.objective!r} "
                             f"objective has none (use it with rt1 or germ-il)")
        if self.blind_instruction and self.instruction != "words":
            raise ValueError(f"blind_instruction blanks the words encoder's vocabulary; instruction={self.instruction!r} "
                             f"has none (train the blind baseline with instruction=words)")
        unknown = [f for f in self.families if f not in quard_family_names()]
        if unknown:
            raise ValueError(f"families={list(self.families)}: {unknown} unknown; allowed: {list(quard_family_names())} "
                             f"(a list: families=['go_to','distinguish'])")
        if not 0.0 <= self.colour_dropout <= 1.0:
            raise ValueError(f"colour_dropout={self.colour_dropout}; must be in [0, 1] (a share of training rows)")
        if not 0.0 <= self.instruction_dropout <= 1.0:
            raise ValueError(f"instruction_dropout={self.instruction_dropout}; must be in [0, 1] (a share of training rows)")
        if not 0.0 <= self.early_share <= 1.0 or self.early_frames < 1:
            raise ValueError(f"early_share={self.early_share}, early_frames={self.early_frames}; need a share in "
                             f"[0, 1] and early_frames >= 1")
        if self.target_loss < 0:
            raise ValueError(f"target_loss={self.target_loss}; must be >= 0 (the auxiliary loss's weight; 0: off)")
        if self.swap_windows < 0:
            raise ValueError(f"swap_windows={self.swap_windows}; must be >= 0 (0: no instruction-swap metric)")
        check_amp(self.amp)
        if self.shift_pad < 0:
            raise ValueError(f"shift_pad={self.shift_pad}; must be >= 0")
        if not 0.0 <= self.hue_jitter <= 180.0:
            raise ValueError(f"hue_jitter={self.hue_jitter}; must be in [0, 180] (degrees; 0: off)")
        for name in ("saturation_jitter", "brightness_jitter", "tint_jitter"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)}; must be in [0, 1) (saturation, brightness: a factor's "
                                 f"spread around 1; tint: the largest share of white; 0: off)")
        if self.success_ratio is not None and not 0.0 <= self.success_ratio <= 1.0:
            raise ValueError(f"success_ratio={self.success_ratio}; must be in [0, 1] or None")
        self.optim.validate()


def default_config(model_name: str, preset: str | None = None) -> VLATrainConfig:
    if model_name not in vla_models():
        raise ValueError(f"VLA model {model_name!r} unknown; allowed: {vla_models()}")
    preset = preset or "cpu"
    if preset not in PRESETS:
        raise ValueError(f"VLA preset {preset!r} unknown; allowed: {sorted(PRESETS)}")
    cfg = VLATrainConfig(model_name=model_name, preset=preset, model=copy.deepcopy(PRESETS[preset][model_name]))
    if model_spec(model_name, "vision").objective == "imitation":   # of the demonstrations
        cfg.objective, cfg.success_only, cfg.success_ratio = "ce", True, None
    else:
        cfg.objective = "q"
    return cfg


def model_config(cfg: VLATrainConfig, image_size: tuple[int, int], instructions: list[str],
                 init: Checkpoint | None = None) -> VLAConfig:
    """The VLAConfig for a source: image size from its camera, vocabulary from its instruction table (a
    fine-tune's from the checkpoint it starts from; a language-blind run's: no word at all)."""
    kw = dict(cfg.model)
    kw.update(instruction=cfg.instruction, num_bins=cfg.num_bins, action_dim=12)
    if cfg.instruction == "words":
        kw["vocab"] = vocabulary_for(instructions, cfg.blind_instruction, init)
        # a word the training table never had (a held-out colour) reads as a mix of the known words of its
        # slot, weighted by the frozen wordllama embedding, not as <unk>: held-out colours 0.53 -> 0.69 on
        # v4's weights with the nearest word alone, 0.698 -> 0.731 on v7's with the mix (docs/vla.md);
        # the blind baseline keeps every word <unk>
        kw.setdefault("unknown_words", "unk" if cfg.blind_instruction else "blend")
    if init is not None and upcycles(init.model_name, cfg.model_name):
        kw["ffn_hidden"] = init.model_config["ffn_hidden"]   # each expert is a copy of the dense FFN
    vla = VLAConfig.make(image_size=tuple(image_size), **kw)
    return vla.dense_matched() if model_spec(cfg.model_name, "vision").dense else vla


build_model = build_vla_model


# --- the objectives --------------------------------------------------------------------------------

@torch.no_grad()
def q_targets(target: GeRMVLA, frames: torch.Tensor, mask: torch.Tensor, instruction: torch.Tensor,
              bins: torch.Tensor, batch: Mapping[str, torch.Tensor], cfg: VLATrainConfig) -> torch.Tensor:
    """Eq. 2 targets (B, d) from the target network; all T+1 frames are encoded once (frame tokens do
    not depend on the window), then assembled into the current and the next-step window."""
    fe, t = target.frontend, target.cfg.history
    e = fe.embed_instruction(instruction)
    frame_tokens = fe.encode_frames(frames, mask, e)                              # (B, T+1, S, D)
    now = fe.assemble(frame_tokens[:, :t], mask[:, :t], e)
    nxt = fe.assemble(frame_tokens[:, 1:], mask[:, 1:], e)
    q_same = torch.sigmoid(target.logits_from_tokens(*now, bins[:, :-1]).logits)   # (B, d, K)
    q_next = torch.sigmoid(target.logits_from_tokens(*nxt).logits[:, 0])           # (B, K)
    bootstrap = ~(batch["done"].bool() | batch["last"].bool())
    y = bellman_targets(q_same, q_next, batch["reward"], batch["discount"], bootstrap)
    return with_mc_lower_bound(y, batch["mc_return"], cfg.mc_bound_dims) if cfg.mc_lower_bound else y


def losses(model: nn.Module, target: nn.Module | None, batch: Mapping[str, torch.Tensor], frames: torch.Tensor,
           instruction: torch.Tensor, binner: ActionBinner, cfg: VLATrainConfig) -> dict[str, torch.Tensor]:
    """All loss terms of one batch (``loss`` is minimised). ``frames`` (B, T+1, 3, H, W) float (augmented),
    ``instruction`` the prepared encoder inputs of each row. ``model`` may be DDP-wrapped: it is called
    (its forward), so DDP sees the step; the current window is frames 0..T-1 of the T+1."""
    mask = batch["frame_mask"].bool()
    bins = binner.encode(batch["action"])                                         # (B, d)
    t = unwrap(model).cfg.history
    # teacher-forced on the data's bins (B, d, K); RT-1's read-outs do not read them
    out = model(frames[:, :t], mask[:, :t], instruction, bins[:, :-1])
    if cfg.objective == "ce":
        return bin_imitation_terms(out.logits, bins, out.aux_loss, cfg.label_sigma)
    y = q_targets(target, frames, mask, instruction, bins, batch, cfg)
    return q_learning_terms(out.logits, bins, y, out.aux_loss, cfg.alpha)


@torch.no_grad()
def act_bins(model: nn.Module, frames: torch.Tensor, mask: torch.Tensor, instruction: torch.Tensor) -> torch.Tensor:
    """Greedy bins (B, d) for windows of T float frames."""
    return model.act_from_tokens(*model.frontend(frames, mask, instruction))


def _filter(batch: dict[str, torch.Tensor], cfg: VLATrainConfig) -> dict[str, torch.Tensor]:
    """Imitation trains on demonstrations: drop failed rows when success_only (the source should also
    be asked for successes only; this guards a source that mixes them anyway)."""
    if not cfg.success_only:
        return batch
    keep = batch["success"] > 0.5
    if bool(keep.all()):
        return batch
    if not bool(keep.any()):
        raise ValueError("success_only: the source returned a batch without one successful row")
    return {k: v[keep] for k, v in batch.items()}


# --- training --------------------------------------------------------------------------------------

class BatchFeed:
    """The training batches of a source, one per step. A store source (``batches()``) gives its sampler's
    chunk-aware stream (or uniform draws) from a random stream derived from (seed, rank, step), restarted
    at every checkpoint, so a run resumed there draws what the uninterrupted run drew; any other source
    (e.g. ``ColourChoiceTask``) is asked ``sample(batch_size)``."""

    def __init__(self, source: ImageWindowSource, batch_size: int, mode: str, prefetch: int, start: int):
        self.source, self.batch_size, self.mode, self.prefetch = source, int(batch_size), mode, int(prefetch)
        self.segment_start, self._it = int(start), None

    def next(self) -> dict[str, torch.Tensor]:
        if not hasattr(self.source, "batches"):
            return self.source.sample(self.batch_size)
        if self._it is None:   # opened lazily: a restart at the run's last save starts no thread
            self._it = self.source.batches(self.batch_size, self.segment_start, self.mode, self.prefetch)
        return next(self._it)

    def restart(self, step: int) -> None:
        self.close()
        self.segment_start = int(step)

    def close(self) -> None:
        if self._it is not None:
            self._it.close()
            self._it = None


@torch.no_grad()
def average_buffers(model: nn.Module, info: DistInfo) -> None:
    """Under DDP, the mean over ranks of the floating-point buffers (the trunk's BatchNorm running
    statistics): each rank's forward updates them from its own batch, so without this the ranks (and their
    EMA targets) drift apart in them while the weights stay identical. A no-op in one process."""
    if not info.enabled:
        return
    import torch.distributed as dist
    for buf in model.buffers():
        if buf.is_floating_point():
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            buf.div_(info.world_size)


def _store_sources(path: str | Path, cfg: VLATrainConfig, info: DistInfo):
    """Training (this rank's shard) and validation sources of an image store: the validation split holds
    ``val_fraction`` of the episodes out by the seeded episode permutation the other trainers use
    (``data.episodes.split_episodes``); None when it is empty or 0, and off the main rank."""
    history = int(cfg.model.get("history", 6))
    common = dict(history=history, seed=cfg.seed, val_fraction=cfg.val_fraction, success_only=cfg.success_only,
                  cache_chunks=cfg.cache_chunks, ram_budget=cfg.ram_budget,
                  step_features=TARGET_TERMS if cfg.target_loss > 0 else (), families=tuple(cfg.families))
    source = open_image_source(path, split="train" if cfg.val_fraction > 0 else "all", success_ratio=cfg.success_ratio,
                               rank=info.rank, world_size=info.world_size, early_frames=cfg.early_frames,
                               early_share=cfg.early_share, **common)
    val = None
    if cfg.val_fraction > 0 and info.is_main:   # the main rank validates
        try:   # the held-out episodes as they come (successes only when training on them)
            val = open_image_source(path, split="val", **common)
        except ValueError as err:   # e.g. one episode, or no successes among the held-out ones
            if "no episodes left" not in str(err):
                raise
            print(f"[{cfg.model_name}] validation disabled: {err}", flush=True)
    return source, val


def train(cfg: VLATrainConfig, source: ImageWindowSource | str | Path, out_dir: str | Path | None, device: str = "cpu",
          val_source: ImageWindowSource | None = None, resume: bool = False,
          provenance: Mapping[str, Any] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Train on an ImageWindowSource, or on an image store (a path: split into training and validation
    episodes, sharded over ranks); writes OUT/last.pt (``out_dir=None``: no files); returns a summary dict
    (``history``, ``val``, ``checkpoint``: the path of last.pt or None, ``model``, ``target``, ``binner``,
    ``parameters``, ``instruction_inputs``). One process, or DDP under torchrun (``training.distributed``).
    An ``out_dir`` holding an earlier run is refused unless ``resume`` continues it or ``overwrite`` replaces it."""
    cfg.validate()
    check_train_out(out_dir, resume, overwrite)
    if resume and out_dir is None:
        raise ValueError("resume=True needs out_dir (the run directory holding last.pt)")
    if isinstance(source, (str, Path)) and "data" not in (provenance or {}):   # as `quadforge train` records it
        provenance = {**(provenance or {}), "data": str(Path(source).resolve())}
    info = init_distributed(device)
    try:
        return _train(cfg, source, Path(out_dir) if out_dir is not None else None, info, val_source, resume, provenance)
    finally:
        cleanup(info)


def _train(cfg: VLATrainConfig, source: ImageWindowSource | str | Path, out: Path | None, info: DistInfo,
           val_source: ImageWindowSource | None, resume: bool, provenance: Mapping[str, Any] | None) -> dict[str, Any]:
    seed_everything(rank_seed(cfg.seed, info.rank))   # rank 0's initial weights reach every rank through DDP
    if info.enabled:   # ranks share the machine's cores
        torch.set_num_threads(max(1, torch.get_num_threads() // info.world_size))
    prov = dict(provenance or {})
    probe = None
    if isinstance(source, (str, Path)):
        if info.is_main and cfg.val_fraction > 0 and cfg.swap_windows:   # the instruction-swap metric (grounding)
            probe = GroundingProbe.from_store(cfg.swap_store or source, int(cfg.model.get("history", 6)), cfg.seed,
                                              0.0 if cfg.swap_store else cfg.val_fraction, cfg.swap_windows,
                                              families=tuple(cfg.families))
        source, val_source = _store_sources(source, cfg, info)
        prov.update(train_episodes=source.num_episodes, train_windows=source.num_windows * info.world_size,
                    val_episodes=val_source.num_episodes if val_source is not None else 0)
    run = VLARun(cfg, source, val_source, out, info, resume, prov, probe)
    try:
        history = run.loop().run(run.start)
        if run.start >= cfg.max_steps:
            run.loop().save(run.start)
    finally:
        run.close()
    return {"history": history, "val": run.val_history, "checkpoint": str(out / "last.pt") if out is not None else None,
            "model": run.model,
            "target": run.target, "binner": run.binner, "parameters": run.counts, "instruction_inputs": run.table}


# the VLATrainConfig fields that decide which windows a run draws: a resume must keep them
RESUME_DEFINES = ("seed", "batch_size", "val_fraction", "success_ratio", "success_only", "early_share",
                  "early_frames", "families", "sampling")


def _starting_weights(cfg: VLATrainConfig, model: nn.Module, vla: VLAConfig, out: Path, resume: bool,
                      prov: dict[str, Any], init: Checkpoint | None) -> tuple[Checkpoint | None, ActionBinner | None]:
    """Load the weights a run starts from: its own ``last.pt`` on resume (returned, for the optimizer and
    streams) or ``init_from``'s for a fine-tune; the binner they were trained with (None: a fresh run)."""
    if resume:
        ckpt = load_checkpoint(latest_checkpoint(out), map_location="cpu")
        # the unknown-word backoff changes no weight (and older checkpoints lack the field)
        same = dataclasses.replace(VLAConfig.from_dict(ckpt.model_config), unknown_words=vla.unknown_words) == vla
        if ckpt.model_name != cfg.model_name or not same:
            raise ValueError(f"{out}: checkpoint holds {ckpt.model_name!r} with a different config; "
                             "resume with the same model, preset and data")
        check_resume_provenance(out, ckpt, prov, ("data", "train_episodes", "train_windows", "val_episodes"),
                                dataclasses.asdict(cfg), RESUME_DEFINES)
        load_state(model, ckpt)
        return ckpt, ActionBinner.from_dict(ckpt.extra["binner"])
    if init is not None:   # fine-tuning: the weights and the binning of an earlier run, a fresh optimizer
        load_init_weights(model, init, vla, cfg.model_name, cfg.init_from)
        prov["init_from"] = str(cfg.init_from)
        return None, ActionBinner.from_dict(init.extra["binner"])
    return None, None


def load_frontend(model: nn.Module, path: str) -> None:
    """Copy the front-end weights (``model.frontend``) of the VLA checkpoint at ``path`` into ``model``."""
    ckpt = load_checkpoint(str(path), map_location="cpu")
    if (ckpt.extra or {}).get("policy_kind") != "vla":
        raise ValueError(f"frontend_from={path}: not a VLA checkpoint")
    state = {k[len("frontend."):]: v for k, v in ckpt.state_dict.items() if k.startswith("frontend.")}
    mine = model.frontend.state_dict()
    wrong = sorted(k for k in mine if k not in state or state[k].shape != mine[k].shape)
    if wrong or len(state) != len(mine):
        raise ValueError(f"frontend_from={path}: its {ckpt.model_name!r} front-end differs from this run's in "
                         f"{wrong[:4] or sorted(set(state) - set(mine))[:4]} (same preset, history and vocabulary needed)")
    model.frontend.load_state_dict(state)


def _fresh_binner(cfg: VLATrainConfig, source: ImageWindowSource, info: DistInfo) -> ActionBinner:
    """The gait controller's command ranges (``bins="controller"``), or uniform edges fitted to the
    source's commands on the main rank and broadcast (``bins="data"``)."""
    if cfg.bins == "controller":
        return command_binner(cfg.num_bins)
    commands = getattr(source, "commands", None)
    if commands is None:
        raise ValueError("bins='data' needs a source with commands() (the stored 12-D commands)")
    return broadcast_object(fit_binner(commands(), cfg.num_bins, "uniform") if info.is_main else None, info)


def _validation_draw(cfg: VLATrainConfig, val_source: ImageWindowSource | None):
    """A callable giving the validation batches (the same ones each time when the source can fix them)."""
    if val_source is None:
        return None
    fixed = getattr(val_source, "fixed_batches", None)
    if fixed is not None:
        return fixed(cfg.val_batches, cfg.batch_size, cfg.seed)
    return lambda: (val_source.sample(cfg.batch_size) for _ in range(cfg.val_batches))


class VLARun:
    """One VLA training run: the model, its target network, binner, optimizer and batch feed, and the
    parts ``TrainLoop`` calls (``loss_terms``, ``after_step``, ``validate``, ``checkpoint``)."""

    def __init__(self, cfg: VLATrainConfig, source: ImageWindowSource, val_source: ImageWindowSource | None,
                 out: Path | None, info: DistInfo, resume: bool, prov: dict[str, Any], probe: GroundingProbe | None = None):
        self.cfg, self.source, self.out, self.info, self.prov = cfg, source, out, info, prov
        self.probe = probe   # the instruction-swap metric's windows (training.grounding), measured at validation
        dev = info.device
        self.instructions = list(source.instructions)
        # a fine-tune's config comes partly from its init (vocabulary, an upcycled expert's width), resumed
        # or not; only a fresh run loads the init's weights (_starting_weights prefers its own last.pt)
        init = load_checkpoint(str(cfg.init_from), map_location="cpu") if cfg.init_from else None
        if init is not None:
            check_vla_init(init, cfg.init_from)
        self.vla = model_config(cfg, tuple(source.image_size), self.instructions, init)
        if self.vla.history != int(source.history):
            raise ValueError(f"the source gives {source.history}-frame windows, the model's history is "
                             f"{self.vla.history}")
        self.model = build_model(cfg.model_name, self.vla).to(dev)
        ckpt, binner = _starting_weights(cfg, self.model, self.vla, out, resume, prov, init)
        if cfg.frontend_from and not resume:
            load_frontend(self.model, cfg.frontend_from)
            prov["frontend_from"] = str(cfg.frontend_from)
        binner = binner or _fresh_binner(cfg, source, info)
        self.binner = binner.to(dev)
        self.table = self.model.frontend.prepare_instructions(self.instructions).to(dev)   # (K, ...) prepared
        self.blanked = (self.model.frontend.prepare_instructions(blank_colours(self.instructions)).to(dev)
                        if cfg.colour_dropout > 0 else None)   # the same table without colour words
        self.nulled = (self.model.frontend.prepare_instructions([null_instruction(t) for t in self.instructions]).to(dev)
                       if cfg.instruction_dropout > 0 else None)   # every instruction as the null one
        self.ddp_model = wrap_model(self.model, info)   # DDP broadcasts rank 0's weights: copy the target after
        self.target = copy.deepcopy(self.model).eval().requires_grad_(False) if cfg.objective == "q" else None
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.aux = TargetAuxLoss(self.model, cfg.target_loss) if cfg.target_loss > 0 else None
        if self.aux is not None:   # the auxiliary head trains with the model (not part of the deployed model)
            self.optimizer.add_param_group({"params": list(self.aux.parameters()), "weight_decay": 0.0})
            if ckpt is not None and "target_head" in ckpt.extra:
                self.aux.head.load_state_dict(ckpt.extra["target_head"])
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, cfg.max_steps)
        self.start = 0
        if ckpt is not None:
            self.start = resume_from(ckpt, self.optimizer, self.scheduler, info, self.target)
            if "rng" not in ckpt.extra and "torch_rng" in ckpt.extra:   # written before the shared rng state
                torch.set_rng_state(ckpt.extra["torch_rng"])
        self.counts = self.model.parameter_counts()
        self.feed = BatchFeed(source, cfg.batch_size, cfg.sampling, cfg.prefetch, self.start)
        self.val_draw = _validation_draw(cfg, val_source)
        self.val_history: list[dict[str, float]] = []
        self.log = RunLog(out, info.is_main, cfg.tensorboard, who=cfg.model_name, resumed_at=self.start)
        self._loop: TrainLoop | None = None

    def prepare(self, batch: Mapping[str, torch.Tensor], augment: bool):
        """A source batch on the device: (batch, float frames (B, T+1, 3, H, W), prepared instructions)."""
        check_batch(batch, self.vla.history, self.vla.image.image_size)
        # filtered where the source made it (the host): on a GPU its checks would each wait for the queue
        batch = {k: from_host(v, self.info.device) for k, v in _filter(dict(batch), self.cfg).items()}
        frames = images_to_float(batch["frames"])
        if augment and self.cfg.shift_pad:
            frames = random_shift(frames, self.cfg.shift_pad)
        if augment:
            frames = random_colour_jitter(frames, self.cfg.hue_jitter, self.cfg.saturation_jitter,
                                          self.cfg.brightness_jitter, self.cfg.tint_jitter)
        idx = batch["instruction"]
        instruction = self.table[idx]
        if augment and self.blanked is not None:
            drop = torch.rand(idx.shape[0], device=idx.device) < self.cfg.colour_dropout
            instruction = torch.where(drop.view(-1, *([1] * (instruction.dim() - 1))), self.blanked[idx], instruction)
        if augment and self.nulled is not None:
            drop = torch.rand(idx.shape[0], device=idx.device) < self.cfg.instruction_dropout
            instruction = torch.where(drop.view(-1, *([1] * (instruction.dim() - 1))), self.nulled[idx], instruction)
        return batch, frames, instruction

    def loss_terms(self, step: int) -> dict[str, torch.Tensor]:
        batch, frames, instruction = self.prepare(self.feed.next(), augment=True)
        terms = losses(self.ddp_model, self.target, batch, frames, instruction, self.binner, self.cfg)
        return self.aux.add(terms, batch) if self.aux is not None else terms

    def after_step(self) -> None:
        average_buffers(self.model, self.info)
        if self.target is not None:
            ema_update(self.target, self.model, self.cfg.tau)

    def validate(self, step: int) -> None:
        """On the main rank, into its own rows (``val/`` in TensorBoard); the other ranks wait at the save."""
        if self.val_draw is not None and self.info.is_main:
            v = validate(self.model, self.target, self.val_draw(), self.binner, self.cfg, self.prepare)
            if self.probe is not None:
                v.update(self.probe.measure(self.model, self.binner))
                if self.out is not None:
                    append_row(self.out, {**v, "step": step})
            v["step"] = step
            self.val_history.append(v)
            self.log.line("val", f"val step {step}", v, step)

    def checkpoint(self, step: int, rngs: dict | None, scheduled: bool) -> Path | None:
        self.feed.restart(step)   # every rank that saves: the batches from here derive from (seed, rank, step)
        if not self.info.is_main or self.out is None:
            return None
        cfg = self.cfg
        extra = {"policy_kind": POLICY_KIND, "binner": {"edges": self.binner.edges.cpu()},
                 "settings": dict(self.source.settings), "instructions": self.instructions,
                 "instruction_inputs": self.table.cpu(), "action_space": "command", "rng": rngs}
        if self.aux is not None:
            extra["target_head"] = self.aux.state_dict()
        if self.target is not None:
            extra["target_state_dict"] = {k: v.detach().cpu() for k, v in self.target.state_dict().items()}
        c = Checkpoint(model_name=cfg.model_name, model_config=self.vla.to_dict(),
                       state_dict={k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                       layout={"name": "vla", "terms": ["images/front_rgb", "instruction"]},
                       provenance={**self.prov, "parameters": self.counts},
                       optimizer=self.optimizer.state_dict(), scheduler=self.scheduler.state_dict(), step=step,
                       seed=cfg.seed, train_config=dataclasses.asdict(cfg), extra=extra)
        keep = scheduled and bool(cfg.keep_every) and step % cfg.keep_every == 0
        return save_run_checkpoint(self.out, c, step, keep=keep)

    def loop(self) -> TrainLoop:
        """The run's ``TrainLoop`` (built once, the model put in training mode)."""
        if self._loop is None:
            cfg, info = self.cfg, self.info
            if info.is_main and self.out is not None:
                self.out.mkdir(parents=True, exist_ok=True)
            self.model.train()
            self._loop = TrainLoop(
                info=info, optimizer=self.optimizer, scheduler=self.scheduler, clip_module=self.model,
                grad_clip=cfg.optim.grad_clip, loss_terms=self.loss_terms, checkpoint=self.checkpoint,
                report=lambda row: self.log.line("train", f"step {row['step']}/{cfg.max_steps}", row, row["step"]),
                max_steps=cfg.max_steps, log_every=cfg.log_every, val_every=cfg.val_every,
                items_per_step=cfg.batch_size * info.world_size, rate_name="samples_per_s",
                checkpoint_every_s=cfg.checkpoint_every_s, desc=f"train {cfg.model_name}",
                after_step=self.after_step, validate=self.validate, amp=cfg.amp)
        return self._loop

    def close(self) -> None:
        if self.aux is not None:
            self.aux.close()
        self.feed.close()
        self.log.close()


@torch.no_grad()
def validate(model: nn.Module, target: nn.Module | None, batches: Iterable[Mapping[str, torch.Tensor]],
             binner: ActionBinner, cfg: VLATrainConfig, prepare) -> dict[str, float]:
    """Mean loss terms (``ce`` and teacher-forced ``bin_accuracy`` for imitation, the Q terms for GeRM)
    and greedy-vs-dataset bin agreement over the validation batches (no augmentation)."""
    was = model.training
    model.eval()
    sums: dict[str, float] = {}
    n = 0
    for raw in batches:
        batch, frames, instruction = prepare(raw, augment=False)
        terms = losses(model, target, batch, frames, instruction, binner, cfg)
        t = model.cfg.history
        greedy = act_bins(model, frames[:, :t], batch["frame_mask"][:, :t].bool(), instruction)
        terms["greedy_agreement"] = (greedy == binner.encode(batch["action"])).float().mean()
        # whether the policy steers: the greedy command's error on the planar velocities against the
        # data's own magnitude (an error about |data| means the dimension is not predicted at all)
        error = (binner.decode(greedy) - batch["action"]).abs().mean(0)
        for i, name in enumerate(("vx", "vy", "wz")):
            terms[f"err_{name}"] = error[i]
            terms[f"data_abs_{name}"] = batch["action"][:, i].abs().mean()
        for k, v in terms.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        n += 1
    model.train(was)
    return {k: v / max(n, 1) for k, v in sums.items()}


# --- CLI -------------------------------------------------------------------------------------------

def config_from_args(args: argparse.Namespace) -> VLATrainConfig:
    return apply_trainer_args(default_config(str(args.model), getattr(args, "preset", None)), args)


def run_from_args(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if not getattr(args, "store", None):
        raise ValueError("--store STORE is required for VLA training")
    if not getattr(args, "out", None):
        raise ValueError("--out DIR is required for VLA training")
    summary = train(cfg, args.store, args.out, device=getattr(args, "device", "cpu"),
                    resume=bool(getattr(args, "resume", False)), provenance={"data": str(Path(args.store).resolve())},
                    overwrite=bool(getattr(args, "overwrite", False)))
    p = summary["parameters"]
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[{cfg.model_name}] wrote {summary['checkpoint']} (active {p['active']:,} / total {p['total']:,} parameters)")
    return 0
