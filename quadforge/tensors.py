"""Small tensor helpers every layer shares: a range check of integer tensors a user's data or checkpoint
hands in (a one-line ``ValueError``), and the row write of a state buffer that ``torch.inference_mode``
may have made."""
from __future__ import annotations

import torch


def check_index_range(idx: torch.Tensor, size: int, what: str, of: str = "") -> None:
    """Every value of ``idx`` lies in [0, size); otherwise a ValueError naming ``what``, what the indices
    point into (``of``) and the range found. The minimum and maximum come back in one read (on a GPU,
    one sync instead of two)."""
    lo, hi = torch.stack(torch.aminmax(idx)).tolist() if idx.numel() else (0, 0)
    if lo < 0 or hi >= size:
        raise ValueError(f"{what} must be in [0, {size})" + (f" ({of})" if of else "") + f", got [{lo}, {hi}]")


def set_rows(buf: torch.Tensor, rows, value) -> torch.Tensor:
    """``buf`` with ``buf[rows] = value`` written, in place where torch allows it; returns the buffer to
    keep. A buffer made under ``torch.inference_mode`` (rsl_rl's runner steps envs in it, a user's
    evaluation loop may act in it) cannot be written in place outside that mode: it is copied first, so
    an env or policy works in or out of the mode whatever the mode of its earlier calls."""
    if buf.is_inference() and not torch.is_inference_mode_enabled():
        buf = buf.clone()
    buf[rows] = value
    return buf
