"""Camera frames in the store: image features, their recording rate and the frame <-> step mapping.

An image feature is named ``images/<camera>``: uint8 ``(H, W, C)`` pixels (C in 1/3/4: RGB is 3) or
float32 ``(H, W)`` depth in metres. Images are recorded at their own rate, every ``stride``-th control
step (GeRM trains on every 10th frame: 5 Hz at 50 Hz control), while proprioception and commands stay at
the control rate. The mapping is fixed by the stride alone:

    an episode of T steps has F = ceil(T / stride) frames;
    frame j of that episode was taken at step j * stride of the episode (the observation the policy
    acted on at that step), so frame 0 is the episode's first observation;
    in the store, episode e's frames are rows frame_start[e] : frame_start[e] + F[e] of every image
    array, frame_start = the cumulative sum of the earlier episodes' F (the same order as the steps).

The stride is per feature in the schema (``FeatureSpec.stride``, 1 for per-step features) and a
collector states it per episode (info ``frame_stride``; 1 when absent, i.e. a frame at every step).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

IMAGE_PREFIX = "images/"
DEFAULT_FRAME_STRIDE = 10           # 5 Hz at 50 Hz control (GeRM / QUARD)
IMAGE_CHUNK_BYTES = 4 << 20         # ~4 MiB of raw frames per chunk: 256 frames of 64x64 RGB
MIN_IMAGE_CHUNK_FRAMES = 16


def is_image(name: str) -> bool:
    return name.startswith(IMAGE_PREFIX)


def image_kind(shape: tuple[int, ...], dtype: Any) -> str:
    """"rgb" for uint8 (H, W, C), "depth" for float32 (H, W); raises ValueError otherwise."""
    dt = np.dtype(dtype)
    if len(shape) == 3 and shape[-1] in (1, 3, 4) and dt == np.uint8:
        return "rgb"
    if len(shape) == 2 and np.issubdtype(dt, np.floating):
        return "depth"
    raise ValueError(f"per-frame shape {tuple(shape)} dtype {dt}")


def image_dtype(name: str, value: np.ndarray, where: str) -> str:
    """The stored dtype of an image feature given its (T, ...) array; raises naming ``where``."""
    if value.ndim == 4 and value.shape[-1] in (1, 3, 4):
        if value.dtype != np.uint8 and not np.issubdtype(value.dtype, np.integer):
            raise ValueError(f"{where}: image feature {name!r} with channels must be uint8 pixels, got {value.dtype}")
        return "uint8"
    if value.ndim == 3 and (np.issubdtype(value.dtype, np.floating) or value.size == 0):
        return "float32"
    raise ValueError(f"{where}: image feature {name!r} must be uint8 (T, H, W, C) with C in 1/3/4 or float32 "
                     f"depth (T, H, W), got {value.dtype} {value.shape}")


def check_stride(stride: Any, where: str) -> int:
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or int(stride) < 1:
        raise ValueError(f"{where}: frame_stride={stride!r}; must be an integer >= 1 (control steps per frame)")
    return int(stride)


def frame_stride_of(info: Mapping[str, Any], where: str) -> int:
    """The episode's image stride from its info (``frame_stride``, default 1: a frame every step)."""
    return check_stride(info.get("frame_stride", 1), where)


def num_frames(length: int | np.ndarray, stride: int) -> int | np.ndarray:
    """Frames recorded in an episode of ``length`` steps: ceil(length / stride)."""
    return -(-length // stride)


def frame_starts(lengths: np.ndarray, stride: int) -> np.ndarray:
    """Row of each episode's first frame in the store's image arrays, (E,) int64."""
    counts = num_frames(np.asarray(lengths, dtype=np.int64), stride)
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def frame_steps(length: int, stride: int) -> np.ndarray:
    """Steps (within the episode) at which its frames were taken: 0, stride, 2*stride, ..."""
    return np.arange(0, length, stride, dtype=np.int64)


def image_chunk_frames(shape: tuple[int, ...], dtype: str) -> int:
    """Frames per chunk: the power of two nearest below ~4 MiB of frames (a few hundred at 64x64)."""
    row = max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    n = max(MIN_IMAGE_CHUNK_FRAMES, IMAGE_CHUNK_BYTES // row)
    return int(1 << int(np.floor(np.log2(n))))


def hold_frames(frames: np.ndarray, length: int, stride: int) -> np.ndarray:
    """A per-step (length, ...) array from an episode's frames: step t carries the latest frame taken,
    frame t // stride (how exports with one camera row per step lay them out). ``subsample`` undoes it."""
    return frames[np.arange(length) // stride]


def subsample(frames: np.ndarray, stride: int) -> np.ndarray:
    """Every ``stride``-th frame of a per-step (T, ...) image array, starting with the first."""
    return frames[::stride]
