"""Self-contained training checkpoints: a checkpoint alone is enough to rebuild and deploy a policy.

A checkpoint is one ``torch.save``-d dict (loaded with ``weights_only=True``, so it holds only
tensors, numbers, strings, lists and dicts) with:

- ``format``: CHECKPOINT_FORMAT, ``kind``: "quadforge-policy"
- ``model``: {"name": registry name, "config": kwargs to rebuild it}, ``state_dict``
- ``layout``: ``ObsLayout.to_dict()`` of the observation the model reads
- ``obs_stats`` / ``action_stats``: {"mean": tensor, "std": tensor} (or None)
- ``provenance``: data store path, generation, episode count, filters ... (free-form dict)
- ``optimizer`` / ``scheduler``: state dicts (None for an export), ``step``, ``seed``
- ``train_config``: the trainer's config as a dict, ``extra``: anything else a trainer needs

Writes are atomic (temp file + fsync + rename) so a crash never leaves a truncated checkpoint.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from quadforge.checkpoint_sniff import load_error, sniff
from quadforge.tensors import check_device

CHECKPOINT_FORMAT = 1
CHECKPOINT_KIND = "quadforge-policy"


@dataclass
class Checkpoint:
    model_name: str
    model_config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    layout: dict[str, Any]
    obs_stats: dict[str, torch.Tensor] | None = None
    action_stats: dict[str, torch.Tensor] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    step: int = 0
    seed: int = 0
    train_config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT, "kind": CHECKPOINT_KIND,
            "model": {"name": self.model_name, "config": dict(self.model_config)},
            "state_dict": self.state_dict, "layout": self.layout,
            "obs_stats": _stats(self.obs_stats, "obs_stats"),
            "action_stats": _stats(self.action_stats, "action_stats"),
            "provenance": dict(self.provenance), "optimizer": self.optimizer, "scheduler": self.scheduler,
            "step": int(self.step), "seed": int(self.seed),
            "train_config": dict(self.train_config), "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>") -> "Checkpoint":
        if not isinstance(d, Mapping) or d.get("kind") != CHECKPOINT_KIND:
            what = ("an rsl_rl PPO checkpoint (load it with quadforge train-expert --resume-from, eval --policy or "
                    "rollout)" if isinstance(d, Mapping) and ("actor_state_dict" in d or "model_state_dict" in d)
                    else f"missing kind={CHECKPOINT_KIND!r}")
            raise ValueError(f"{source} is not a quadforge policy checkpoint ({what})")
        if d.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{source}: checkpoint format {d.get('format')!r} unsupported; "
                             f"this version reads format {CHECKPOINT_FORMAT}")
        missing = [k for k in ("model", "state_dict", "layout") if k not in d]
        if missing:
            raise ValueError(f"{source}: checkpoint lacks fields {missing}")
        return cls(model_name=d["model"]["name"], model_config=dict(d["model"]["config"]),
                   state_dict=d["state_dict"], layout=d["layout"], obs_stats=d.get("obs_stats"),
                   action_stats=d.get("action_stats"), provenance=dict(d.get("provenance") or {}),
                   optimizer=d.get("optimizer"), scheduler=d.get("scheduler"), step=int(d.get("step", 0)),
                   seed=int(d.get("seed", 0)), train_config=dict(d.get("train_config") or {}),
                   extra=dict(d.get("extra") or {}))


def _stats(stats: Mapping[str, Any] | None, name: str) -> dict[str, torch.Tensor] | None:
    if stats is None:
        return None
    if "mean" not in stats or "std" not in stats:
        raise ValueError(f"checkpoint {name} must have 'mean' and 'std', got keys {sorted(stats)}")
    return {k: torch.as_tensor(v, dtype=torch.float32).detach().cpu() for k, v in stats.items()}


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Atomically write ``ckpt`` to ``path`` (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(ckpt.to_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Checkpoint:
    path = Path(path)
    if path.is_dir():
        path = latest_checkpoint(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    sniff(path)  # a text file, random bytes or a truncated archive: one line before torch sees it
    if isinstance(map_location, (str, torch.device)):   # (a callable or a dict map is torch's to read)
        check_device(map_location, f"{path}: map_location")
    try:
        raw = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # corrupt / not a torch file: one clear line, not a pickle traceback
        raise load_error(path, err) from err
    return Checkpoint.from_dict(raw, source=str(path))


def latest_checkpoint(directory: str | os.PathLike) -> Path:
    """``DIR/last.pt`` if present, else the ``step_*.pt`` with the highest step."""
    directory = Path(directory)
    if (directory / "last.pt").is_file():
        return directory / "last.pt"
    # step_<n>.pt only: another file named step_* (step_final.pt, a copy) is not a step checkpoint
    steps = sorted((p for p in directory.glob("step_*.pt") if p.stem[len("step_"):].isdigit()),
                   key=lambda p: int(p.stem[len("step_"):]))
    if not steps:
        raise FileNotFoundError(f"no checkpoint (last.pt or step_*.pt) in {directory}")
    return steps[-1]


def check_model(ckpt: Checkpoint, model_name: str, model_config: Mapping[str, Any] | None = None,
                where: str | os.PathLike | None = None) -> None:
    """Refuse to resume/load into a different model or a differently shaped one; ``where``: the checkpoint's
    path, named in the error."""
    which = f"checkpoint {where}" if where is not None else "checkpoint"
    if ckpt.model_name != model_name:
        raise ValueError(f"{which} holds model {ckpt.model_name!r}, not {model_name!r}")
    if model_config is not None:
        diff = {k: (ckpt.model_config.get(k), v) for k, v in model_config.items()
                if ckpt.model_config.get(k) != v}
        if diff:
            raise ValueError(f"{which}: model config differs (checkpoint, requested): {diff}")


def load_state(model: nn.Module, ckpt: Checkpoint) -> None:
    """Load weights strictly, reporting missing/unexpected/mis-shaped parameters in one line."""
    own = model.state_dict()
    bad_shape = {k: (tuple(v.shape), tuple(own[k].shape)) for k, v in ckpt.state_dict.items()
                 if k in own and tuple(v.shape) != tuple(own[k].shape)}
    missing = sorted(set(own) - set(ckpt.state_dict))
    unexpected = sorted(set(ckpt.state_dict) - set(own))
    if bad_shape or missing or unexpected:
        raise ValueError(f"checkpoint does not fit model {ckpt.model_name!r}: shape (ckpt, model) {bad_shape}, "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.load_state_dict(ckpt.state_dict)


# extra keys only a run that continues training needs (random streams, the EMA target network)
TRAINING_ONLY_EXTRA = ("rng", "target_state_dict")


def export_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, **provenance: Any) -> Path:
    """A deployable copy of a training checkpoint: the same model, config, layout, stats and settings,
    without the optimizer and scheduler states and ``TRAINING_ONLY_EXTRA`` (about a third of an Adam
    run's file). ``provenance`` entries (e.g. the command that trained it) are added to the copy's."""
    ckpt = load_checkpoint(src)
    ckpt.optimizer = ckpt.scheduler = None
    ckpt.extra = {k: v for k, v in ckpt.extra.items() if k not in TRAINING_ONLY_EXTRA}
    ckpt.provenance = {**ckpt.provenance, "exported_from": str(Path(src)), **provenance}
    return save_checkpoint(dst, ckpt)
