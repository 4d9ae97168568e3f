"""Speed-only numpy fast paths of the env's per-step arithmetic, each beside its torch reference.

On the CPU, numpy evaluates comparisons, selections, boolean logic and single IEEE-rounded products and
sums with the same bits as torch at a fraction of torch's per-call cost on (N,)-(N, 4) arrays. Each
function here runs one reference expression on numpy views of the tensors' memory and returns None
where it does not apply (a GPU tensor, a tensor that needs grad, bfloat16); the caller then runs its
reference. The references, and the tests that compare the two bit for bit
(tests/envs/test_env_perf.py):

    fast path                        reference
    yaw_from_quat_numpy              envs/rotations.py: yaw_from_quat_reference
    numpy_path(Terminations._outcome) envs/terminations.py: Terminations._outcome(torch, ...)
    numpy_path(FeetAirTime._update)  envs/rewards.py: FeetAirTime._update(torch, ...)
    Terrain.height_at_numpy          envs/terrain.py: Terrain.height_at_reference
    scan_points_w's numpy branch     the same function's torch branch (envs/observations.py)

(The fused reward block, ``envs/rewards_fused.py``, is the other speed-only env module.)

``torch_references()`` turns every fast path off for a block: the env then dispatches the torch calls a
GPU does (``bench env_step`` counts them) with the same results (tested over whole env rollouts).
Under ``torch.compile`` (``EnvConfig.compile_task``) every fast path declines too: the compiled graph
is traced from the torch references.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import numpy as np
import torch

_enabled = True


@contextlib.contextmanager
def torch_references() -> Iterator[None]:
    """Inside: every fast path declines, so the env runs its torch references on the CPU too - the
    calls a GPU dispatches (``bench env_step`` counts them; the results are the same bits)."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def cpu_arrays(*tensors: torch.Tensor | None) -> tuple | None:
    """numpy views of these tensors (None stays None) when every one is a CPU tensor outside autograd
    in a dtype numpy has; otherwise None (a GPU tensor, a tensor that needs grad, bfloat16; any tensor
    inside ``torch_references``).

    ``Tensor.numpy`` itself refuses exactly those cases, so it is the check: asking each tensor for
    its device, grad flag and dtype first would cost three property calls a tensor on the hot path."""
    if not _enabled or torch.compiler.is_compiling():   # a compiled step traces the torch references
        return None
    try:
        return tuple(None if t is None else t.numpy() for t in tensors)
    except (TypeError, RuntimeError):
        return None


def numpy_path(expr: Callable, tensors: tuple, *args) -> tuple[torch.Tensor, ...] | None:
    """``expr(numpy, *arrays, *args)`` on numpy views of ``tensors`` (in-place writes land in the
    tensors), its results as tensors; None when ``cpu_arrays`` does not apply. ``expr`` is a reference
    written once for either library (``xp``); ``args`` are numpy scalars of the arrays' dtype."""
    arrays = cpu_arrays(*tensors)
    if arrays is None:
        return None
    return tuple(torch.from_numpy(a) for a in expr(np, *arrays, *args))


def yaw_from_quat_numpy(q: torch.Tensor) -> torch.Tensor | None:
    """``rotations.yaw_from_quat_reference`` with the two atan2 arguments computed by numpy on the
    tensor's memory (the same IEEE-rounded products and sums, bit for bit, instead of ten small torch
    calls); atan2 itself stays torch's, on contiguous inputs as before."""
    arrays = cpu_arrays(q) if q.dtype in (torch.float32, torch.float64) else None
    if arrays is None:
        return None
    w, x, y, z = (arrays[0][..., i] for i in range(4))
    return torch.atan2(torch.from_numpy(2 * (w * z + x * y)), torch.from_numpy(1 - 2 * (y * y + z * z)))
