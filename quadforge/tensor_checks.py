"""Checks of integer tensors a user's data or checkpoint hands in, each a one-line ``ValueError``."""
from __future__ import annotations

import torch


def check_index_range(idx: torch.Tensor, size: int, what: str, of: str = "") -> None:
    """Every value of ``idx`` lies in [0, size); otherwise a ValueError naming ``what``, what the indices
    point into (``of``) and the range found. The minimum and maximum come back in one read (on a GPU,
    one sync instead of two)."""
    lo, hi = torch.stack(torch.aminmax(idx)).tolist() if idx.numel() else (0, 0)
    if lo < 0 or hi >= size:
        raise ValueError(f"{what} must be in [0, {size})" + (f" ({of})" if of else "") + f", got [{lo}, {hi}]")
