"""torchrun / DDP helpers shared by every trainer.

The same training command runs single-process or under ``torchrun --nproc_per_node K``: torchrun sets
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, ``init_distributed`` reads them and opens a
process group (gloo on the CPU, nccl on CUDA). Each rank trains on its own shard of windows (samplers
take ``rank`` / ``world_size``); DDP averages gradients so all ranks keep identical weights.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from quadforge.tensors import check_device


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(device: str | torch.device) -> torch.device:
    return check_device(device, "--device")


def init_distributed(device: str = "cpu") -> DistInfo:
    """Open the process group when launched by torchrun (WORLD_SIZE > 1); otherwise single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    base = resolve_device(device)
    if world_size <= 1:
        return DistInfo(device=base)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if base.type == "cuda":
        torch.cuda.set_device(local_rank)
        base = torch.device("cuda", local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if base.type == "cuda" else "gloo",
                                rank=rank, world_size=world_size)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=base)


def wrap_model(model: nn.Module, info: DistInfo) -> nn.Module:
    """DDP-wrap the model when distributed; a no-op otherwise."""
    if not info.enabled:
        return model
    ids = [info.device.index] if info.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def all_reduce_mean(value: torch.Tensor | float, info: DistInfo) -> float:
    """Mean of a scalar over ranks (for logging losses); the value itself when single-process."""
    t = torch.as_tensor(value, dtype=torch.float64, device=info.device).detach().clone()
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= info.world_size
    return float(t)


def broadcast_object(obj: Any, info: DistInfo, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (e.g. normalisation stats computed once)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
