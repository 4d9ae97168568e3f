"""The step's log (``extras["log"]``) computed on the env's device and read to the host in one go.

On a GPU every read of a device value waits for the queue to drain; a step with episode ends logs the
reward terms, the episode means, the termination reasons and the curriculum levels, which read one by
one were nine host syncs (each ``bincount`` alone is two: it reads its input's range). Here each part
hands over a float64 device vector and how to name its values, and ``read_logs`` makes one ``tolist``
for all of them. Counts need no range read (``match_table``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from quadforge.tensors import device_constant


@dataclass(frozen=True)
class PendingLog:
    values: torch.Tensor                               # (k,) float64, on the env's device
    name: Callable[[list[float]], dict[str, float]]    # the k host floats -> named log entries


def named(keys: Sequence[str], values: torch.Tensor) -> PendingLog:
    keys = tuple(keys)
    return PendingLog(values.to(torch.float64).reshape(-1), lambda xs: dict(zip(keys, xs)))


def match_table(index: torch.Tensor, size: int) -> torch.Tensor:
    """(N, size) float64, 1 where ``index`` (N,) holds the column's value: summed over N it is
    ``torch.bincount(index, minlength=size)`` for indices known to lie in [0, size), with no host read
    (bincount reads its input's range first; ``index_add_``'s CUDA atomics would trip the
    deterministic-algorithms warning every step). Exact for counts and integer-valued weights below 2**53."""
    columns = device_constant(tuple(range(size)), torch.long, index.device)
    return (index.reshape(-1, 1) == columns).to(torch.float64)


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
