"""Per-dimension action discretisation (Q-Transformer / GeRM: 256 bins per action dimension).

Edges come from dataset statistics, one set per dimension:
- ``"uniform"``: equal-width bins between the ``percentile`` and ``100 - percentile`` points of the data
  (percentile 0 = min-max); the margin keeps a few outliers from stretching every bin.
- ``"quantile"``: edges at the data's quantiles (each bin holds about the same number of samples); where
  many samples share one value the repeated edges are pushed apart so bins stay strictly increasing.

``encode`` maps a value to the bin holding it (values outside [low, high] clamp to the end bins);
``decode`` returns the bin centre, so an in-range value round-trips with error ≤ half its bin's width.
The edges are plain tensors saved in the checkpoint (``to_dict`` / ``from_dict``).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from quadforge.tensors import check_index_range

BIN_METHODS = ("uniform", "quantile")
_MIN_SPAN = 1e-3  # a constant dimension still gets bins spanning this (times max(1, |value|))


@dataclass
class ActionBinner:
    edges: torch.Tensor   # (d, bins + 1) float32, strictly increasing per row

    def __post_init__(self) -> None:
        self.edges = torch.as_tensor(self.edges, dtype=torch.float32)
        if self.edges.ndim != 2 or self.edges.shape[1] < 2:
            raise ValueError(f"bin edges must be (action_dim, bins + 1) with bins >= 1, got {tuple(self.edges.shape)}")
        if not bool((self.edges[:, 1:] > self.edges[:, :-1]).all()):
            raise ValueError("bin edges must be strictly increasing in every dimension")

    def to(self, device: str | torch.device) -> "ActionBinner":
        """The same edges on ``device`` (checked where they were built, not again: on a GPU the check
        would wait for the device)."""
        moved = copy.copy(self)
        moved.edges = self.edges.to(device)
        return moved

    @property
    def action_dim(self) -> int:
        return self.edges.shape[0]

    @property
    def num_bins(self) -> int:
        return self.edges.shape[1] - 1

    @property
    def centers(self) -> torch.Tensor:
        return 0.5 * (self.edges[:, 1:] + self.edges[:, :-1])       # (d, bins)

    @property
    def widths(self) -> torch.Tensor:
        return self.edges[:, 1:] - self.edges[:, :-1]               # (d, bins)

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """(..., d) continuous -> (..., d) long bin indices in [0, bins)."""
        self._check(actions)
        edges = self.edges.to(actions.device)
        flat = actions.reshape(-1, self.action_dim).float().T.contiguous()    # (d, M)
        # inner edges only: a value below edge 1 is bin 0, at/above edge `bins-1` is the last bin (clamp)
        idx = torch.searchsorted(edges[:, 1:-1].contiguous(), flat, right=True)  # (d, M)
        return idx.T.reshape(actions.shape)

    def decode(self, bins: torch.Tensor) -> torch.Tensor:
        """(..., d) long bin indices -> (..., d) bin centres."""
        self._check(bins)
        check_index_range(bins, self.num_bins, "bin indices")
        centers = self.centers.to(bins.device)                      # (d, bins)
        flat = bins.reshape(-1, self.action_dim).T                  # (d, M)
        return centers.gather(1, flat).T.reshape(bins.shape)

    def _check(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.action_dim:
            raise ValueError(f"actions have {x.shape[-1]} dimensions, the binner has {self.action_dim}")

    def to_dict(self) -> dict[str, Any]:
        return {"edges": self.edges.clone()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ActionBinner":
        if "edges" not in d:
            raise ValueError(f"binner dict needs 'edges', got keys {sorted(d)}")
        return cls(torch.as_tensor(d["edges"]))


def _strictly_increasing(edges: np.ndarray) -> np.ndarray:
    """Push repeated edges apart (per row) so every bin has positive width."""
    out = edges.astype(np.float64).copy()
    span = max(float(out[-1] - out[0]), _MIN_SPAN * max(1.0, float(np.abs(out).max())))
    for j in range(1, len(out)):
        if out[j] <= out[j - 1]:
            # large enough to survive the float32 cast at this magnitude
            out[j] = out[j - 1] + max(span * 1e-5, abs(out[j - 1]) * 1e-6, 1e-7)
    return out


def fit_binner(actions: np.ndarray | torch.Tensor, num_bins: int = 256, method: str = "uniform",
               percentile: float = 0.0) -> ActionBinner:
    """Fit per-dimension edges to ``actions`` (N, d)."""
    if method not in BIN_METHODS:
        raise ValueError(f"binning method {method!r} unknown; allowed: {BIN_METHODS}")
    if num_bins < 2:
        raise ValueError(f"num_bins must be >= 2, got {num_bins}")
    if not 0.0 <= percentile < 50.0:
        raise ValueError(f"binning percentile must be in [0, 50), got {percentile}")
    a = np.asarray(actions.detach().cpu() if isinstance(actions, torch.Tensor) else actions, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] == 0:
        raise ValueError(f"actions to fit bins on must be (N>0, d), got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("actions to fit bins on contain NaN or inf")
    rows = []
    for col in a.T:
        if method == "uniform":
            lo, hi = np.percentile(col, [percentile, 100.0 - percentile])
            span = _MIN_SPAN * max(1.0, abs(lo), abs(hi))   # bins must stay distinct in float32
            if hi - lo < span:
                mid = 0.5 * (lo + hi)
                lo, hi = mid - span / 2, mid + span / 2
            rows.append(np.linspace(lo, hi, num_bins + 1))
        else:
            q = np.linspace(percentile, 100.0 - percentile, num_bins + 1)
            rows.append(_strictly_increasing(np.percentile(col, q)))
    return ActionBinner(torch.as_tensor(np.stack(rows), dtype=torch.float32))

