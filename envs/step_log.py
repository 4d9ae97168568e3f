"""The step's log (``extras["log"]``) computed on the env's device and read to the host in one go.

On a GPU every read of a device value waits for the queue to drain; a step with episode ends logs the
reward terms, the episode means, the termination reasons and the curriculum levels, which read one by
one were nine host syncs (each ``bincount`` alone is two: it reads its input's range). Here each part
hands over a float64 device vector and how to name its values, and ``read_logs`` makes one ``tolist``
for all of them. Counts go through ``index_add_``, which needs no range read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class PendingLog:
    values: torch.Tensor                               # (k,) float64, on the env's device
    name: Callable[[list[float]], dict[str, float]]    # the k host floats -> named log entries


def named(keys: Sequence[str], values: torch.Tensor) -> PendingLog:
    keys = tuple(keys)
    return PendingLog(values.to(torch.float64).reshape(-1), lambda xs: dict(zip(keys, xs)))


def counts(index: torch.Tensor, size: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.bincount(index, weights, minlength=size)`` as float64 for indices known to lie in [0, size),
    with no host read (exact for integer counts and integer-valued weights below 2**53)."""
    w = torch.ones_like(index, dtype=torch.float64) if weights is None else weights.to(torch.float64)
    return torch.zeros(size, dtype=torch.float64, device=index.device).index_add_(0, index, w)


def read_logs(pending: Sequence[PendingLog]) -> dict[str, float]:
    if not pending:
        return {}
    xs = torch.cat([p.values for p in pending]).tolist()   # the one host read
    out: dict[str, float] = {}
    start = 0
    for p in pending:
        k = p.values.numel()
        out.update(p.name(xs[start:start + k]))
        start += k
    return out
