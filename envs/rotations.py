"""Planar rotations of the base: heading from a quaternion, angles wrapped to [-pi, pi).

A leaf module (no other env module imported but its fast path) so commands, observations and the env
share one copy."""
from __future__ import annotations

import math

import torch

from quadforge.envs.fast_paths import yaw_from_quat_numpy


def wrap_to_pi(x: torch.Tensor) -> torch.Tensor:
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


def yaw_from_quat_reference(q: torch.Tensor) -> torch.Tensor:
    """Heading of the base's x axis, from (..., 4) wxyz quaternions: atan2(2(wz + xy), 1 - 2(yy + zz))."""
    w, x, y, z = q.unbind(-1)
    return torch.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def yaw_from_quat(q: torch.Tensor) -> torch.Tensor:
    """``yaw_from_quat_reference``, through its numpy fast path on the CPU (``envs.fast_paths``)."""
    fast = yaw_from_quat_numpy(q)
    return fast if fast is not None else yaw_from_quat_reference(q)
