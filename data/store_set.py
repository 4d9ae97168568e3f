"""Several trajectory stores trained on as one: DAgger's aggregate (the expert's store and the relabelled one).

``StoreSet`` is store-like for ``data.ram_budget.sampler_source``: its episodes are the stores' episodes in
order, its steps their steps one after the other, its features the per-step features every store has (with
the same shape and dtype). On the RAM path it loads each store's features and concatenates them, one
feature at a time. Out of core it is read as ``MultiStepShards``: each store's own ``StepShards`` (shards
under ``<store>/shards``, written once per store generation, so the expert's are reused by every DAgger
iteration), joined by ``ConcatShards``, which sends each row a batch asks for to its store - no
concatenated copy, nothing per step held. A damaged chunk is the store's own error, naming that store.

Not joined: images (frame arrays, not per step) and the per-step ``instruction`` feature and
``instruction_id`` column (indices into each store's own instruction table).
"""
from __future__ import annotations

import threading
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from quadforge.data.episodes import EpisodeArrays
from quadforge.data.step_shards import LazyFeatures, ShardArray, ShardSource, StepShards, layout_key
from quadforge.data.episode_table import EpisodeTable, joined_column
from quadforge.data.store import TrajectoryStore
from quadforge.layout import ObsLayout

PER_STORE_FEATURES = ("instruction",)          # values index the store's own instruction table
PER_STORE_COLUMNS = ("instruction_id",)
SHIFTED_COLUMNS = ("start", "end")             # step offsets: shifted by the steps of the stores before


class StoreSet:
    """An ordered aggregate of trajectory stores, read as one store (see the module doc)."""

    def __init__(self, stores: Sequence[TrajectoryStore]):
        if not stores:
            raise ValueError("StoreSet: no stores given")
        self.stores = list(stores)
        first = self.stores[0]
        for s in self.stores[1:]:
            if (s.schema.robot, s.schema.control_dt) != (first.schema.robot, first.schema.control_dt):
                raise ValueError(f"StoreSet: {s.root} holds {s.schema.robot} at control_dt {s.schema.control_dt}, "
                                 f"{first.root} {first.schema.robot} at {first.schema.control_dt}; one aggregate "
                                 f"trains one robot at one control rate")
        common = set.intersection(*(set(s.feature_names) - set(s.image_features) for s in self.stores))
        common -= set(PER_STORE_FEATURES)
        for name in sorted(common):
            specs = {(tuple(s.schema.features[name].shape), str(s.schema.features[name].dtype)) for s in self.stores}
            if len(specs) > 1:
                common.discard(name)   # not joinable; ``require`` names it if a sampler asks for it
        self.feature_names = tuple(n for n in first.feature_names if n in common)
        self.schema = first.schema     # the common features' specs agree across the stores (checked above)
        self.step_offsets = np.cumsum([0] + [s.num_steps for s in self.stores]).astype(np.int64)

    @classmethod
    def open(cls, paths: Iterable[str | Path]) -> "StoreSet":
        stores = []
        for p in paths:
            if not Path(p).exists():
                raise FileNotFoundError(f"StoreSet: no trajectory store at {p}")
            stores.append(TrajectoryStore.open(p))
        return cls(stores)

    @property
    def roots(self) -> list[Path]:
        return [s.root for s in self.stores]

    @property
    def num_steps(self) -> int:
        return int(self.step_offsets[-1])

    @property
    def num_episodes(self) -> int:
        return sum(s.num_episodes for s in self.stores)

    @property
    def image_features(self) -> tuple[str, ...]:
        return ()

    def missing(self, names: Iterable[str]) -> list[str]:
        """Each of ``names`` not in every store (or not joinable), with the stores it is missing from."""
        out = []
        for n in names:
            if n not in self.feature_names:
                lacking = [str(s.root) for s in self.stores if n not in s.feature_names]
                why = f"not in {lacking}" if lacking else "per-store values or shapes/dtypes differ between the stores"
                out.append(f"{n!r} ({why})")
        return out

    def load(self, features: Iterable[str]) -> dict[str, np.ndarray]:
        """The stores' ``features`` in RAM, concatenated one feature at a time (each store's load checks its
        chunks' CRCs and names the store on damage)."""
        names = list(dict.fromkeys(features))
        bad = self.missing(names)
        if bad:
            raise ValueError(f"StoreSet {[str(r) for r in self.roots]}: features {', '.join(bad)}")
        return {n: np.concatenate([s.load([n])[n] for s in self.stores]) for n in names}

    @cached_property
    def episodes(self) -> EpisodeTable:
        """The stores' episode tables one after the other: step offsets shifted, per-store indices dropped."""
        tables = [s.episodes.columns() for s in self.stores]
        names = [c for c in tables[0] if c not in PER_STORE_COLUMNS and all(c in t for t in tables)]
        return EpisodeTable({c: _joined_column([t[c] for t in tables], c, self.step_offsets) for c in names})

    def __repr__(self) -> str:
        return f"StoreSet({[str(r) for r in self.roots]}, episodes={self.num_episodes}, steps={self.num_steps})"


def concat_episodes(parts: list[EpisodeArrays]) -> EpisodeArrays:
    """One EpisodeArrays of several in RAM (the features they all have), episodes in order; the info columns
    all parts have, ``start``/``end`` shifted and per-store indices dropped, as ``StoreSet.episodes``."""
    features = set.intersection(*(set(p.features) for p in parts))
    offsets = np.cumsum([0] + [p.num_steps for p in parts[:-1]])
    info = {c: _joined_column([p.episode_info[c] for p in parts], c, offsets) for c in parts[0].episode_info
            if c not in PER_STORE_COLUMNS and all(c in p.episode_info for p in parts)}
    return EpisodeArrays({n: np.concatenate([p.features[n] for p in parts]) for n in sorted(features)},
                         np.concatenate([p.episode_ends + o for p, o in zip(parts, offsets)]), info)


def _joined_column(parts: list[np.ndarray], name: str, offsets: Sequence[int]) -> np.ndarray:
    if name in SHIFTED_COLUMNS:
        return np.concatenate([np.asarray(p, dtype=np.int64) + int(o) for p, o in zip(parts, offsets)])
    return joined_column(parts)


# --- out of core --------------------------------------------------------------------------------------

class ConcatShards:
    """Several stores' shards of one table read as one: aggregate row r is row ``r - offsets[k]`` of store k's
    shard. ``take``, ``windows`` and ``block`` as ``ShardArray``'s; each store's shard checks its own chunks."""

    def __init__(self, parts: list[ShardArray], offsets: np.ndarray):
        self.parts, self.offsets = parts, np.asarray(offsets, dtype=np.int64)   # offsets: (K + 1,), last = total
        tails = {(p.array.shape[1:], p.array.dtype) for p in parts}
        if len(tails) > 1:
            raise ValueError(f"ConcatShards: the stores' shards differ in row shape or dtype: "
                             f"{[(str(p.path), p.array.shape[1:], str(p.array.dtype)) for p in parts]}")
        self.row_shape, self.dtype = parts[0].array.shape[1:], parts[0].array.dtype
        self.shape = (int(self.offsets[-1]),) + tuple(self.row_shape)
        self._local = threading.local()

    def __len__(self) -> int:
        return self.shape[0]

    def _part(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, rows, side="right") - 1

    def _split(self, rows: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """(store, mask over ``rows``) for every store some of ``rows`` fall in."""
        which = self._part(rows)
        for k in np.unique(which):
            yield int(k), which == k

    def _local_span(self, span: np.ndarray | None, k: int) -> np.ndarray | None:
        if span is None:
            return None
        span = np.asarray(span, dtype=np.int64).reshape(-1)
        return span[self._part(span) == k] - self.offsets[k]

    def check(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        for k, sel in self._split(rows):
            self.parts[k].check(rows[sel] - self.offsets[k])

    def check_all(self) -> None:
        for p in self.parts:
            p.check_all()

    def release(self) -> None:
        for p in self.parts:
            p.release()

    def take(self, rows: np.ndarray, span: np.ndarray | None = None) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        flat = rows.reshape(-1)
        out = np.empty((len(flat),) + tuple(self.row_shape), dtype=self.dtype)
        for k, sel in self._split(flat):
            out[sel] = self.parts[k].take(flat[sel] - self.offsets[k], span=self._local_span(span, k))
        return out.reshape(rows.shape + tuple(self.row_shape))

    def windows(self, starts: np.ndarray, n: int, span: np.ndarray) -> np.ndarray:
        """(B, n, ...) the n rows from each of ``starts``. A window belongs to the store of its last row; rows
        before that store's first row (only ever padding: an episode lies in one store) read its first row,
        and the caller zeroes them as it zeroes all padding."""
        starts = np.asarray(starts, dtype=np.int64)
        which = self._part(starts + (n - 1))
        if all(p.all_checked for p in self.parts):
            span = None      # every chunk checked already: no rows left to check, skip splitting them
        else:
            span = np.asarray(span, dtype=np.int64).reshape(-1)
            span_which = self._part(span)
        out = None
        for k, part in enumerate(self.parts):
            sel = np.flatnonzero(which == k)
            if len(sel) == 0:
                continue
            off = self.offsets[k]
            local = starts[sel] - off
            sp = np.zeros(0, dtype=np.int64) if span is None else span[span_which == k] - off
            if len(sel) == len(starts) and local.min() >= 0:
                return part.windows(local, n, span=sp)     # the whole batch in one store: read as one store's
            if out is None:
                out = np.empty((len(starts), n) + tuple(self.row_shape), dtype=self.dtype)
            if local.min() >= 0:   # through a scratch buffer kept between batches: no per-batch temporaries,
                out[sel] = part.windows_into(local, n, sp, self._scratch(len(sel) * n))   # which churn the heap
            else:   # windows reaching back into the store before: row by row, clamped to this store
                out[sel] = part.take(np.maximum(local[:, None] + np.arange(n, dtype=np.int64)[None, :], 0), span=sp)
        return out

    def _scratch(self, rows: int) -> np.ndarray:
        """A per-thread buffer of at least ``rows`` rows (the batch is copied out of it before it is reused)."""
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < rows:
            buf = self._local.buf = np.empty((rows,) + tuple(self.row_shape), dtype=self.dtype)
        return buf

    def block(self, start: int, stop: int) -> np.ndarray:
        """Rows start..stop-1, checked, as a copy (each store's part read by its own ``block``)."""
        pieces = []
        for k, p in enumerate(self.parts):
            lo, hi = max(start, int(self.offsets[k])), min(stop, int(self.offsets[k + 1]))
            if lo < hi:
                pieces.append(p.block(lo - int(self.offsets[k]), hi - int(self.offsets[k])))
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


class MultiStepShards(ShardSource):
    """The out-of-core view of a ``StoreSet``: its episode table, and per-step tables joined from each store's
    ``StepShards`` (see the module doc)."""

    def __init__(self, stores: StoreSet, log: Callable[[str], None] | None = None):
        self.stores = stores
        self.parts = [StepShards(s, log=log) for s in stores.stores]
        self.episode_ends = np.concatenate([p.episode_ends + o for p, o in zip(self.parts, stores.step_offsets)])
        self.episode_info = stores.episodes.columns()
        self.features = LazyFeatures(stores.feature_names, self.feature)
        self._open: dict[str, ConcatShards] = {}

    def require(self, names: Iterable[str], who: str) -> None:
        bad = self.stores.missing(names)
        if bad:
            raise ValueError(f"{who}: features {', '.join(bad)} are missing from the aggregate of "
                             f"{[str(r) for r in self.stores.roots]}")

    def _joined(self, key: str, table: Callable[[StepShards], ShardArray]) -> ConcatShards:
        if key not in self._open:
            self._open[key] = ConcatShards([table(p) for p in self.parts], self.stores.step_offsets)
        return self._open[key]

    def feature(self, name: str) -> ConcatShards:
        self.require([name], "out-of-core aggregate")
        return self._joined(name, lambda p: p.feature(name))

    def layout_table(self, layout: ObsLayout) -> ConcatShards:
        return self._joined(layout_key(layout), lambda p: p.layout_table(layout))

    def reward(self, kind: str) -> ConcatShards:
        return self._joined(f"reward@{kind}", lambda p: p.reward(kind))

    def returns(self, kind: str, gamma: float) -> ConcatShards:
        # per store: every episode lies in one store, so its return to the episode's end is the store's
        return self._joined(f"return@{kind}@{float(gamma)!r}", lambda p: p.returns(kind, gamma))


def open_aggregate(paths: Sequence[str | Path]) -> Any:
    """One store path as is, several as a ``StoreSet`` (what ``training.imitation.train`` accepts)."""
    return str(paths[0]) if len(paths) == 1 else StoreSet.open(paths)
