"""Typed imitation-training config and the named presets.

A model's presets come with its registration (``ModelSpec.presets``: TrainConfig fields per preset name; the
zoo's, with their sources, are in ``models/zoo_presets.py``). An imitation model registered without presets
gets ``GENERIC_PRESETS``: ``paper`` (context 64, batch 1024, 50 epochs, AdamW 1e-3) and ``cpu`` (context 8,
batch 64, 300 steps, the equal-budget sweep's AdamW 3e-3), both with the model's own default widths.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from quadforge.models.registry import MODEL_SPECS, model_names
from quadforge.models.zoo_presets import SWEPT_ADAMW
from quadforge.overrides import apply_overrides
from quadforge.training.loop import check_amp
from quadforge.training.optim import OptimConfig
from quadforge.typed_values import count

LOSSES = ("mse", "nll")


@dataclass
class TrainConfig:
    model: str = "fcnet"
    model_config: dict[str, Any] = field(default_factory=dict)   # kwargs besides obs/action dims, context
    context: int = 64
    batch_size: int = 1024
    max_steps: int | None = None       # None: derived from epochs
    epochs: float = 50.0               # passes over the training windows (all ranks together)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: str = "mse"                  # "nll": Gaussian NLL with a learned per-dimension log-std
    layout: str = "proprio"
    success_only: bool = False
    val_fraction: float = 0.1
    ram_budget: str = "auto"      # the RAM path's limit ("auto": half the machine's memory); above it, out of core
    val_every: int = 500
    val_batches: int = 8
    log_every: int = 50
    tensorboard: bool = True
    keep_checkpoints: bool = False     # also keep step_<n>.pt at every validation (last.pt is always written)
    checkpoint_every_s: float = 600.0  # also write last.pt after this much wall time (0: only at validations)
    rtg_scale: float = 1.0             # rtg fed to the model = return-to-go / rtg_scale
    seed: int = 0
    init_from: str | None = None       # a checkpoint whose weights (and obs stats) start this run (fine-tuning)
    amp: str = "off"                   # "bf16": forward passes under bf16 autocast (training.loop.autocast)

    def validate(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"train config loss={self.loss!r}; allowed: {LOSSES}")
        for name in ("context", "batch_size", "val_every", "val_batches", "log_every"):
            count(getattr(self, name), f"train config {name}")   # int() would truncate 2.5 (or fail in numpy)
        if self.max_steps is not None:
            count(self.max_steps, "train config max_steps")
        if not self.checkpoint_every_s >= 0:
            raise ValueError(f"train config checkpoint_every_s={self.checkpoint_every_s}; must be >= 0 (0: off)")
        if self.max_steps is None and not self.epochs > 0:
            raise ValueError(f"train config epochs={self.epochs}; must be > 0 when max_steps is not set")
        check_amp(self.amp)
        self.optim.validate()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        d = dict(d)
        optim = OptimConfig(**{**d.pop("optim", {})})
        optim.betas = tuple(optim.betas)
        return cls(optim=optim, **d)


# an imitation model registered without presets of its own gets these (see the module doc)
GENERIC_PRESETS: dict[str, dict[str, Any]] = {
    "paper": dict(context=64, batch_size=1024, epochs=50,
                  optim=dict(name="adamw", lr=1e-3, weight_decay=1e-4, warmup_frac=0.1, grad_clip=1.0)),
    "cpu": dict(context=8, batch_size=64, max_steps=300, val_every=100,
                optim=dict(**SWEPT_ADAMW, weight_decay=1e-4, warmup_frac=0.1, grad_clip=1.0)),
}
DEFAULT_PRESET = "paper"


def apply_train_overrides(cfg: TrainConfig, overrides: Mapping[str, Any]) -> TrainConfig:
    """``key=value`` overrides of a TrainConfig, the one place (``train``, ``dagger``, ``train-sweep`` and
    Python callers): ``model.<key>`` sets the model's kwargs (``cfg.model_config``), any other key a
    (dotted) field through ``quadforge.overrides.apply_overrides``; returns ``cfg``."""
    model_keys = {k: v for k, v in overrides.items() if k.startswith("model.")}
    apply_overrides(cfg, {k: v for k, v in overrides.items() if k not in model_keys})
    cfg.model_config.update({k.split(".", 1)[1]: v for k, v in model_keys.items()})
    return cfg


def presets(model: str) -> Mapping[str, Mapping[str, Any]]:
    """The presets of imitation model ``model``: its registration's, or ``GENERIC_PRESETS``; read when asked."""
    imitation = model_names(trainer="imitation")
    if model not in imitation:
        raise ValueError(f"no presets for model {model!r}: presets are the imitation models' "
                         f"({', '.join(imitation)}); the other trainers keep their own")
    spec = next(s for s in MODEL_SPECS.values() if s.name == model and s.trainer == "imitation")
    return spec.presets or GENERIC_PRESETS


def preset(model: str, name: str | None = None) -> TrainConfig:
    """The TrainConfig of ``model``'s preset ``name`` (default "paper")."""
    mine = presets(model)
    name = name or DEFAULT_PRESET
    if name not in mine:
        raise ValueError(f"unknown preset {name!r} for model {model!r}; allowed: {sorted(mine)}")
    p = copy.deepcopy(dict(mine[name]))
    optim = OptimConfig(**p.pop("optim"))
    return TrainConfig(model=model, optim=optim, **p)
