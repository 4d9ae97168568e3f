"""What every trainer's loop shares: the TensorBoard log and the checkpoint files of a run directory.

Both trainers (``training.imitation``, ``training.qlearning``) write

- ``OUT/tb/``: TensorBoard scalars ``<group>/<name>`` (main rank only; a missing tensorboard package
  only disables them),
- ``OUT/last.pt`` at every validation/checkpoint step and ``OUT/step_<n>.pt`` when kept;

and resume from ``OUT/last.pt`` (``training.checkpoint.latest_checkpoint``) with the random streams
of every rank restored (``rng_state`` / ``set_rng_state``, in the checkpoint's ``extra["rng"]``): torch's
generator (dropout, MoE gating noise) and any named numpy generator (GeRM's transition sampler).
Imitation batches come from streams derived from (seed, rank, step), so they need no saved state.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from quadforge.training.checkpoint import Checkpoint, save_checkpoint
from quadforge.training.distributed import DistInfo


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


# --- random streams on resume ----------------------------------------------------------------------------
def rng_state(info: DistInfo, generators: Mapping[str, np.random.Generator] | None = None) -> dict[str, Any]:
    """Every rank's random streams, gathered (a collective: call it on every rank): ``{"rank<r>": {"torch":
    CPU generator state, ["cuda": ...,] <name>: numpy generator state}}``. What a bit-exact resume needs
    beyond streams derived from (seed, rank, step)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if info.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(info.device)
    for name, gen in (generators or {}).items():
        state[name] = gen.bit_generator.state
    states = [state]
    if info.enabled:
        import torch.distributed as dist
        states = [None] * info.world_size
        dist.all_gather_object(states, state)
    return {f"rank{r}": s for r, s in enumerate(states)}


def set_rng_state(saved: Mapping[str, Any] | None, info: DistInfo,
                  generators: Mapping[str, np.random.Generator] | None = None) -> bool:
    """Restore this rank's streams from ``rng_state``'s dict; False when the checkpoint has none for it."""
    state = (saved or {}).get(f"rank{info.rank}")
    if state is None:
        return False
    torch.set_rng_state(state["torch"])
    if info.device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], info.device)
    for name, gen in (generators or {}).items():
        if name in state:
            gen.bit_generator.state = state[name]
    return True
