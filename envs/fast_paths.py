"""``cpu_arrays``: numpy arrays on the memory of CPU tensors, for per-step expressions that numpy
evaluates with the same bits as torch (comparisons, selections, boolean logic, single IEEE-rounded
products and sums) at a fraction of torch's per-call cost on (N,)-(N, 4) arrays. The callers keep one
expression set for both libraries (``xp``) and use torch's wherever this returns None.
"""
from __future__ import annotations

import torch


def cpu_arrays(*tensors: torch.Tensor | None) -> tuple | None:
    """numpy views of these tensors (None stays None) when every one is a CPU tensor outside autograd
    in a dtype numpy has; otherwise None (a GPU tensor, a tensor that needs grad, bfloat16).

    ``Tensor.numpy`` itself refuses exactly those cases, so it is the check: asking each tensor for
    its device, grad flag and dtype first would cost three property calls a tensor on the hot path."""
    try:
        return tuple(None if t is None else t.numpy() for t in tensors)
    except (TypeError, RuntimeError):
        return None
