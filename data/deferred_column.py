"""A table column read when first read: its parts (a store's episode table segments) hold it undecoded.

``data.episode_table`` keeps a segment's dict columns (label, extras, task parameters) as the JSON text of
its file until something reads one: decoding them is most of what opening a store costs, and training
never reads them. ``DeferredColumn`` is that column as the rest of the code sees it - a 1-D object array
that decodes itself on first use - in a module of its own so that ``data.episodes`` (the samplers' info
tables, which keep it undecoded) can know it without importing the episode table.
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence

import numpy as np


class DeferredPart(Protocol):
    """Some consecutive rows of a deferred column (``episode_table._SegmentDicts``: one segment's)."""

    rows: int

    @property
    def decoded(self) -> bool: ...

    def column(self, name: str) -> np.ndarray: ...


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array of ``values`` (``np.asarray`` would make a 2-D one of equal-length lists)."""
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


class DeferredColumn:
    """Column ``name`` of ``parts``, one after the other, decoded into the 1-D object array it reads as on its
    first read (an item, a slice, iteration, ``np.asarray``), once."""

    def __init__(self, name: str, parts: Sequence[DeferredPart]):
        self.name, self.parts = name, tuple(parts)
        self._values: np.ndarray | None = None

    def __len__(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def decoded(self) -> bool:
        return self._values is not None or all(p.decoded for p in self.parts)

    def values(self) -> np.ndarray:
        if self._values is None:
            cols = [p.column(self.name) for p in self.parts]
            self._values = cols[0] if len(cols) == 1 else np.concatenate(cols) if cols else object_array([])
        return self._values

    def __getitem__(self, index: Any) -> Any:
        return self.values()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = self.values()
        return values if dtype is None or np.dtype(dtype) == values.dtype else values.astype(dtype)

    def __repr__(self) -> str:
        return f"DeferredColumn({self.name!r}, rows={len(self)}, decoded={self.decoded})"

    @staticmethod
    def joined(columns: Sequence["DeferredColumn"]) -> "DeferredColumn":
        """The columns' rows one after the other, still undecoded."""
        return DeferredColumn(columns[0].name, [p for c in columns for p in c.parts])
