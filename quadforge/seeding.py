"""The one place every random stream is seeded from.

``seed_everything(seed)`` seeds Python, NumPy and torch and turns on torch's deterministic
algorithms, so the same seed gives the same result on the CPU. Components that need their own stream
take a ``numpy.random.Generator`` / ``torch.Generator`` derived with ``derive_seed(seed, name)`` so
that adding a consumer of randomness in one part never shifts the numbers another part draws.
"""
from __future__ import annotations

import hashlib
import os
import random

import numpy as np

# torch is imported by the two functions that seed it, not here: the store's tools (`quadforge dataset
# export-hdf5`, ...) draw numpy streams only and then start without torch (about 1.7 s)


def check_seed(seed: object) -> int:
    """``seed`` as an int; a ValueError for anything else (``1.5`` would run seed 1's run, ``True`` seed 1's)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed={seed!r} is invalid; allowed: an integer")
    return int(seed)


def derive_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed for the named sub-stream of ``seed``."""
    check_seed(seed)
    digest = hashlib.sha256(f"{int(seed)}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seed_everything(seed: int, deterministic: bool = True) -> None:
    import torch
    seed = check_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    # This process's string hashing was fixed when it started; processes it starts later (collection
    # workers) hash alike run to run. Nothing here lets a result follow a set's order all the same.
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    if deterministic:
        # cuBLAS picks reduction orders per call unless its workspace is pinned (read when CUDA starts
        # its cuBLAS handle; a process that set it already keeps its value). warn_only: ops without a
        # deterministic kernel warn instead of failing a run; MuJoCo Warp's contact kernels use atomics,
        # so GPU physics is not bitwise repeatable either (docs/backends.md).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        # Deterministic mode also fills every new tensor with NaN before its op writes it (a guard for
        # ops that leave memory unwritten; none of ours do: trained weights are the same bits either way,
        # tests/test_seeding.py). The fill is a pass over each activation: up to ~10 % of an FCNet training
        # step on the CPU (`quadforge bench models`, docs/training.md).
        torch.utils.deterministic.fill_uninitialized_memory = False


def rank_seed(seed: int, rank: int) -> int:
    """The seed of data-parallel rank ``rank``: ``seed`` itself on rank 0 (a one-process run is the same
    run), a derived stream on the others (``seed + rank`` would give rank 1 of seed s rank 0's stream of
    seed s + 1)."""
    return int(seed) if int(rank) == 0 else derive_seed(seed, f"rank{int(rank)}")


def numpy_rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, name))


def torch_generator(seed: int, name: str, device: str | torch.device = "cpu") -> torch.Generator:
    import torch
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, name))
    return g
