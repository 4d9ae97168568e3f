"""The store's instruction table: one append-only list of instruction strings.

A QUARD env numbers its instructions in its own table and emits the per-step ``instruction`` term as
an index into it; a collector passes the texts its episode used (info ``instructions``: {env index:
text}). Compaction appends unseen texts to the store's table and rewrites the per-step indices into
the store's numbering, so episodes from collectors with different tables (other env versions, merged
stores) share one table; the episode table's ``instruction_id`` is the index of the episode's
instruction text (info ``instruction``). The committed table is the first ``num_instructions`` entries
of ``meta/instructions.json`` (the manifest says how many), so a crash never commits a half table.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

NO_INSTRUCTION = -1


class InstructionTable:
    def __init__(self, texts: list[str] | None = None) -> None:
        self.texts: list[str] = list(texts or [])
        self._index = {t: i for i, t in enumerate(self.texts)}

    def __len__(self) -> int:
        return len(self.texts)

    def add(self, text: str) -> int:
        """The index of ``text``, appending it when new."""
        text = str(text)
        if text not in self._index:
            self._index[text] = len(self.texts)
            self.texts.append(text)
        return self._index[text]

    def episode_id(self, info: Mapping[str, Any]) -> int:
        """Index of the episode's instruction text (info ``instruction``), -1 when it has none."""
        text = info.get("instruction")
        return NO_INSTRUCTION if text is None else self.add(text)

    def remap(self, values: np.ndarray, info: Mapping[str, Any], where: str) -> np.ndarray:
        """Per-step indices in the collector's numbering -> the store's; -1 stays -1.

        Every index used must be named in info ``instructions`` ({index: text}); new texts are appended
        in the order of their collector indices, so re-importing an export reproduces the table."""
        values = np.asarray(values, dtype=np.int64)
        used = sorted(int(v) for v in np.unique(values) if v != NO_INSTRUCTION)
        if not used:
            return values
        given = {int(k): str(v) for k, v in (info.get("instructions") or {}).items()}
        missing = [u for u in used if u not in given]
        if missing:
            raise ValueError(f"{where}: per-step instruction indices {missing[:10]} have no text in the episode's "
                             f"info 'instructions' ({{index: text}}); have {sorted(given)[:10]}")
        lut = {u: self.add(given[u]) for u in used}
        if all(k == v for k, v in lut.items()):
            return values
        out = values.copy()
        for u, g in lut.items():
            out[values == u] = g
        return out

    def used_texts(self, values: np.ndarray) -> dict[str, str]:
        """{index: text} of the indices in ``values`` (what an export hands back to an import)."""
        return {str(int(v)): self.texts[int(v)] for v in np.unique(values)
                if v != NO_INSTRUCTION and 0 <= int(v) < len(self.texts)}
