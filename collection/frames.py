"""Camera frames recorded at their own rate during a rollout.

Image terms (``images/<camera>``: uint8 (N, H, W, C) RGB, float32 (N, H, W) depth) are far wider than
everything else a step records (64x64 RGB is 12288 bytes against ~500 for proprioception), so they do
not go through the packed float32 step buffer: per camera, one preallocated buffer (num_envs,
ceil(max_len / stride), ...) in the term's own dtype gets env i's frame only on the steps where env i's
step counter is a multiple of ``stride`` (frame j = step j * stride of the episode, as
``data.images`` defines it). Other steps copy nothing.
"""
from __future__ import annotations

import numpy as np
import torch

from quadforge.data.images import num_frames


class FrameRecorder:
    def __init__(self, num_envs: int, max_len: int, stride: int) -> None:
        if stride < 1:
            raise ValueError(f"FrameRecorder: stride={stride}; must be >= 1 (control steps per frame)")
        self.num_envs, self.stride = num_envs, int(stride)
        self.max_frames = int(num_frames(max_len, self.stride))
        self.buffers: dict[str, np.ndarray] = {}

    def write(self, steps: np.ndarray, frames: dict[str, torch.Tensor]) -> None:
        """Store each env's frame when its step counter ``steps[i]`` falls on the stride."""
        ids = np.flatnonzero(steps % self.stride == 0)
        if ids.size == 0:
            return
        if not self.buffers:
            for name, t in frames.items():
                dtype = np.uint8 if t.dtype == torch.uint8 else np.float32
                self.buffers[name] = np.zeros((self.num_envs, self.max_frames) + tuple(t.shape[1:]), dtype=dtype)
        elif set(frames) != set(self.buffers):
            raise RuntimeError(f"recorded image terms changed mid-run: {sorted(self.buffers)} -> {sorted(frames)}")
        rows = steps[ids] // self.stride
        for name, t in frames.items():
            # CPU: numpy's row gather on a zero-copy view (torch's index_select costs ~ms on wide uint8 rows);
            # another device: gather there, copy only the chosen frames
            picked = t.detach().numpy()[ids] if t.device.type == "cpu" else \
                t.index_select(0, torch.from_numpy(ids).to(t.device)).cpu().numpy()
            self.buffers[name][ids, rows] = picked

    def episode(self, env_id: int, length: int) -> dict[str, np.ndarray]:
        """Env ``env_id``'s frames of an episode of ``length`` steps (fresh arrays)."""
        n = int(num_frames(length, self.stride))
        return {name: buf[env_id, :n].copy() for name, buf in self.buffers.items()}
