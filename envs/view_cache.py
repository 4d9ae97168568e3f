"""``ViewCache``: a view of a tensor, made once and reused while the tensor stays the same object.

The task layer reads columns of buffers that live for the whole run (the backend's state tensors,
refreshed in place; constant point grids). Slicing them costs a torch call each, which at small N is a
visible part of a step, so the views are made once; keying on the tensor's identity means a buffer the
owner replaces gets fresh views instead of stale ones.
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

import torch

V = TypeVar("V")


class ViewCache(Generic[V]):
    def __init__(self, make: Callable[[torch.Tensor], V]):
        self._make = make
        self._source: torch.Tensor | None = None
        self._view: V | None = None

    def __call__(self, source: torch.Tensor) -> V:
        if torch.compiler.is_compiling():   # a traced view costs nothing at run time; no state to guard on
            return self._make(source)
        if source is not self._source:
            self._source, self._view = source, self._make(source)
        return self._view
