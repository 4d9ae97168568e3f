"""The step's log (``extras["log"]``) computed on the env's device and read to the host in one go.

On a GPU every read of a device value waits for the queue to drain; a step with episode ends logs the
reward terms, the episode means, the termination reasons and the curriculum levels, which read one by
one were nine host syncs (each ``bincount`` alone is two: it reads its input's range). Here each part
hands over a float64 device vector and how to name its values, and ``read_logs`` makes one ``tolist``
for all of them. Counts need no range read (``counts``).
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
    with no host read: a sum over an (N, size) match table (exact for integer counts and integer-valued
    weights below 2**53). Not ``index_add_``: on a GPU its atomics would trip the deterministic-algorithms
    warning every step."""
    match = (index.reshape(-1, 1) == torch.arange(size, device=index.device)).to(torch.float64)
    if weights is not None:
        match = match * weights.to(torch.float64).reshape(-1, 1)
    return match.sum(dim=0)


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
