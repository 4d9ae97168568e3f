"""What every trainer's loop shares: the TensorBoard log and the checkpoint files of a run directory.

Both trainers (``training.imitation``, ``training.qlearning``) write

- ``OUT/tb/``: TensorBoard scalars ``<group>/<name>`` (main rank only; a missing tensorboard package
  only disables them),
- ``OUT/last.pt`` at every validation/checkpoint step and ``OUT/step_<n>.pt`` when kept;

and resume from ``OUT/last.pt`` (``training.checkpoint.latest_checkpoint``). How each restores its
random streams on resume is still its own: imitation draws each step's batch from a stream derived from
(seed, rank, step), GeRM saves its sampler's generator state per rank.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from quadforge.training.checkpoint import Checkpoint, save_checkpoint


class RunLog:
    """TensorBoard scalars of one run (a no-op off the main rank, without ``out`` or when disabled)."""

    def __init__(self, out: Path | None, is_main: bool, enabled: bool = True, who: str = "train"):
        self.writer = None
        if out is None or not is_main or not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:   # tensorboard is a dependency; without it training still runs
            print(f"{who}: tensorboard not importable; no TensorBoard logs")
            return
        self.writer = SummaryWriter(log_dir=str(Path(out) / "tb"))

    def scalars(self, group: str, row: Mapping[str, float], step: int) -> None:
        if self.writer is None:
            return
        for k, v in row.items():
            if k != "step":
                self.writer.add_scalar(f"{group}/{k}", v, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def save_run_checkpoint(out: Path, ckpt: Checkpoint, step: int, keep: bool) -> Path:
    """``OUT/last.pt`` (and ``OUT/step_<step>.pt`` when ``keep``); the path of last.pt."""
    last = save_checkpoint(Path(out) / "last.pt", ckpt)
    if keep:
        save_checkpoint(Path(out) / f"step_{step}.pt", ckpt)
    return last
