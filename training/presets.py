"""Typed imitation-training config and the named presets (the seeds' hyperparameters + a CPU one).

``paper`` presets follow the seeds: FCNet seed 000 Table 5 (legged dataset), the Transformer baseline
Table 6 (Lion, same lr; hidden 128 so its parameter count matches FCNet's ~790k as the paper requires),
Decision ConvFormer seed 002 Table 4 (MuJoCo settings: 3 layers, embed 128, K 8, clip 0.25, wd 1e-4,
lr 1e-3, batch 64), StARformer seed 004 (its DT-derived settings: lr 6e-4, betas (0.9, 0.95), wd 0.1,
clip 1.0, context 30). Where a seed gives no number the choice is ours and marked "ours".
``cpu``: small widths and a few hundred steps, for smoke runs on a laptop-class CPU. Its optimizer
settings are the equal-budget sweep's choice (``quadforge train-sweep``, issue 17; the table is in
docs/models.md "Equal-budget tuning"): every model got the same grid - AdamW lr {3e-4, 1e-3, 3e-3},
Lion at a third of those - then two values of its paper's key setting, 500 steps, batch 64, one 24-episode
flat store and split. AdamW at 3e-3 won for every model; of the paper settings only StARformer's
positional-embedding init moved (N(0, 1) beat N(0, 0.02) by 7 %).
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

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


# the sweep's AdamW (torch's standard betas/eps, the same for every model) at its chosen lr
_SWEPT_ADAMW = dict(name="adamw", lr=3e-3, betas=(0.9, 0.999), eps=1e-8)

_FCNET_OPTIM = dict(name="adamw", lr=5e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=1e-4, warmup_frac=0.2,
                    grad_clip=1.0)   # grad_clip: ours (the paper gives none)

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "fcnet": {
        "paper": dict(context=64, batch_size=1024, epochs=50,
                      model_config=dict(modes=10, hidden=256, num_layers=4, decoder_hidden=128),
                      optim=_FCNET_OPTIM),
        "cpu": dict(context=32, batch_size=64, max_steps=300, val_every=100,
                    model_config=dict(modes=8, hidden=64, num_layers=2, decoder_hidden=64),   # m 16: within 1 %
                    optim={**_FCNET_OPTIM, **_SWEPT_ADAMW}),
    },
    "transformer": {
        "paper": dict(context=64, batch_size=1024, epochs=50,
                      model_config=dict(hidden=128, num_layers=4, num_heads=4, decoder_hidden=128),  # heads: ours
                      optim=dict(name="lion", lr=5e-3, betas=(0.9, 0.99), weight_decay=1e-4, warmup_frac=0.2,
                                 grad_clip=1.0)),
        "cpu": dict(context=32, batch_size=64, max_steps=300, val_every=100,
                    # pos_init_std 0.02 (GPT-2's); torch's N(0, 1) default was 10 % worse in the sweep
                    model_config=dict(hidden=32, num_layers=2, num_heads=2, decoder_hidden=64, pos_init_std=0.02),
                    optim=dict(**_SWEPT_ADAMW, weight_decay=1e-4, warmup_frac=0.2, grad_clip=1.0)),
    },
    "convformer": {
        "paper": dict(context=8, batch_size=64, max_steps=100_000,
                      model_config=dict(hidden=128, num_layers=3, kernel=6, decoder_hidden=128, use_actions=True),
                      optim=dict(name="adamw", lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-4, warmup_frac=0.1,
                                 grad_clip=0.25)),
        "cpu": dict(context=8, batch_size=64, max_steps=300, val_every=100,
                    model_config=dict(hidden=32, num_layers=2, kernel=6, decoder_hidden=64, use_actions=True),
                    optim=dict(**_SWEPT_ADAMW, weight_decay=1e-4, warmup_frac=0.1, grad_clip=0.25)),
    },
    "starformer": {
        "paper": dict(context=30, batch_size=64, max_steps=100_000,
                      model_config=dict(hidden=128, local_dim=16, num_layers=3, num_heads=4, local_heads=2,
                                        decoder_hidden=128, use_actions=True),
                      optim=dict(name="adamw", lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, warmup_frac=0.1,
                                 grad_clip=1.0)),
        "cpu": dict(context=8, batch_size=64, max_steps=300, val_every=100,   # batch 64: the sweep's, as everyone's
                    model_config=dict(hidden=32, local_dim=8, num_layers=2, num_heads=2, local_heads=2,
                                      decoder_hidden=64, use_actions=True, pos_init_std=1.0),   # 0.02: 7 % worse
                    optim=dict(**_SWEPT_ADAMW, weight_decay=0.1, warmup_frac=0.1, grad_clip=1.0)),
    },
    "mlp": {   # no seed: ours
        "paper": dict(context=8, batch_size=1024, epochs=50,
                      model_config=dict(hidden=256, num_layers=2, decoder_hidden=128),
                      optim=dict(name="adamw", lr=1e-3, weight_decay=1e-4, warmup_frac=0.1, grad_clip=1.0)),
        "cpu": dict(context=8, batch_size=64, max_steps=300, val_every=100,
                    model_config=dict(hidden=64, num_layers=2, decoder_hidden=64),   # context 16: within 2 %
                    optim=dict(**_SWEPT_ADAMW, weight_decay=1e-4, warmup_frac=0.1, grad_clip=1.0)),
    },
}
DEFAULT_PRESET = "paper"


def preset(model: str, name: str | None = None) -> TrainConfig:
    """The TrainConfig of ``model``'s preset ``name`` (default "paper")."""
    if model not in PRESETS:
        raise ValueError(f"no presets for model {model!r}; models: {sorted(PRESETS)}")
    name = name or DEFAULT_PRESET
    if name not in PRESETS[model]:
        raise ValueError(f"unknown preset {name!r} for model {model!r}; allowed: {sorted(PRESETS[model])}")
    p = copy.deepcopy(PRESETS[model][name])
    optim = OptimConfig(**p.pop("optim"))
    return TrainConfig(model=model, optim=optim, **p)
