"""Planar rotations of the base: heading from a quaternion, angles wrapped to [-pi, pi).

A leaf module (no other env module imported) so commands, observations and the env share one copy."""
from __future__ import annotations

import math

import torch

from quadforge.envs.cpu_arrays import cpu_arrays


def wrap_to_pi(x: torch.Tensor) -> torch.Tensor:
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


def yaw_from_quat(q: torch.Tensor) -> torch.Tensor:
    """Heading of the base's x axis, from (..., 4) wxyz quaternions: atan2(2(wz + xy), 1 - 2(yy + zz)).

    On the CPU the two atan2 arguments are computed with numpy on the tensor's memory: the same
    IEEE-rounded float products and sums as torch's (bit for bit, tested) at a fraction of the cost of
    ten small torch calls; atan2 itself stays torch's, on contiguous inputs as before."""
    arrays = cpu_arrays(q) if q.dtype in (torch.float32, torch.float64) else None
    if arrays is not None:
        w, x, y, z = (arrays[0][..., i] for i in range(4))
        return torch.atan2(torch.from_numpy(2 * (w * z + x * y)), torch.from_numpy(1 - 2 * (y * y + z * z)))
    w, x, y, z = q.unbind(-1)
    return torch.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
