"""The out-of-core twin of the samplers' ``_SelectedSteps``: windows gathered per batch from memory-mapped shards.

The RAM path tables every selected step (layout vectors, strided zero padding, five int64 indices per
step). Here only per-episode arrays are held (the selection's compact starts, lengths and source starts:
24 bytes per episode); a batch maps its compact step indices to episodes with one ``searchsorted``, gathers
its windows' rows from the shards (``data.step_shards``) and zeroes the left padding. Per-step lookups the
samplers make (``step_episode[t]``, ``timestep[t]``, a reward at ``t``) are computed for the indices asked,
so the samplers' batch code runs unchanged on either path and draws the same batches from the same seed.
Normalisation moments come from one streaming pass over the selected rows (Chan's parallel update in
float64), the same numbers as the RAM path's two-pass moments up to float64 rounding.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from quadforge.data.step_shards import ShardArray, ShardSource
from quadforge.layout import ObsLayout

MOMENT_BLOCK_STEPS = 1 << 16     # rows per block of the moments pass (its float64 copies stay ~30 MB)


class _PerStep:
    """``x[t]`` for arrays of compact step indices ``t``, computed on demand (never a per-step table)."""

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray]):
        self._fn = fn

    def __getitem__(self, t) -> np.ndarray:
        return self._fn(np.asarray(t, dtype=np.int64))


class ShardSteps:
    """The selected episodes of a ``ShardSource``, read per batch (same interface as ``_SelectedSteps``)."""

    def __init__(self, data: ShardSource, episodes: np.ndarray, layout: ObsLayout, action_feature: str, context: int):
        self.data, self.episodes, self.context = data, episodes, int(context)
        self.lengths = data.episode_lengths[episodes]
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)   # compact starts
        self.num_steps = int(self.lengths.sum())
        self.source_starts = data.episode_starts[episodes]
        self.obs = data.layout_table(layout)                       # (T_store, D) mapped
        self.actions = data.feature(action_feature)                # (T_store, ...) mapped
        self.step_episode = _PerStep(self.episode_of)
        self.timestep = _PerStep(lambda t: t - self.starts[self.episode_of(t)])
        self._moments: tuple | None = None

    def episode_of(self, t: np.ndarray) -> np.ndarray:
        """Position in ``episodes`` of each compact step."""
        return np.searchsorted(self.starts, t, side="right") - 1

    def source_of(self, t: np.ndarray) -> np.ndarray:
        ep = self.episode_of(t)
        return self.source_starts[ep] + (t - self.starts[ep])

    def per_step(self, shard: ShardArray, dtype=np.float64) -> _PerStep:
        """``shard``'s values at compact steps, as ``dtype``."""
        return _PerStep(lambda t: shard.take(self.source_of(t)).astype(dtype, copy=False).reshape(t.shape))

    def mask_timestep(self, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        back = np.arange(self.context - 1, -1, -1, dtype=np.int64)[None, :]
        t = self.timestep[ends][:, None] - back
        mask = t >= 0
        return mask, np.where(mask, t, 0)

    def windows(self, table: ShardArray, ends: np.ndarray, valid: np.ndarray | None = None) -> torch.Tensor:
        """(B, n, ...) windows of ``table`` ending at compact steps ``ends``; zeros before the episode's start
        and wherever not ``valid`` (a 1-D table gives (B, n, 1), as the RAM path's column tables do)."""
        ends = np.asarray(ends, dtype=np.int64)
        ep = self.episode_of(ends)
        first = self.source_starts[ep]
        last = first + (ends - self.starts[ep])                                   # (B,) source row of the end
        idx = last[:, None] + np.arange(1 - self.context, 1, dtype=np.int64)[None, :]
        ok = idx >= first[:, None]
        if valid is not None:
            ok &= np.asarray(valid, dtype=bool)[:, None]
        safe = np.where(ok, idx, last[:, None])
        start = last - (self.context - 1)
        if start.min() >= 0:   # each window one block of n rows (as the RAM path copies them), padding zeroed
            x = table.windows(start, self.context, span=np.concatenate([safe[:, 0], last]))
        else:                  # a window reaching before the store's first row: gather row by row
            x = table.take(safe, span=np.concatenate([safe[:, 0], last]))
        x[~ok] = 0
        if x.ndim == 2:
            x = x[..., None]
        return torch.from_numpy(x)

    def rows(self, table: ShardArray, steps: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(table.take(self.source_of(np.asarray(steps, dtype=np.int64))))

    def action_rows(self, max_rows: int, seed: int) -> np.ndarray:
        """(N, A) the selected steps' actions: all of them up to ``max_rows``, else a seeded uniform sample of
        ``max_rows`` (what a bin fit needs without loading the store)."""
        if self.num_steps <= max_rows:
            t = np.arange(self.num_steps, dtype=np.int64)
        else:
            t = np.sort(np.random.default_rng(seed).choice(self.num_steps, size=max_rows, replace=False))
        out = np.concatenate([self.actions.take(self.source_of(t[i:i + (1 << 20)]))
                              for i in range(0, len(t), 1 << 20)])
        return out.reshape(len(t), -1)

    # --- moments: one streaming pass over the selected rows ---------------------------------------------
    @property
    def obs_moments(self) -> tuple[np.ndarray, np.ndarray]:
        return self._stream_moments()[0]

    @property
    def action_moments(self) -> tuple[np.ndarray, np.ndarray]:
        return self._stream_moments()[1]

    def _stream_moments(self):
        if self._moments is None:
            acc = [_Moments(), _Moments()]
            for a, b, keep in self._selected_blocks():
                for m, table in zip(acc, (self.obs, self.actions)):
                    x = table.block(a, b)
                    m.add(x.reshape(len(x), -1)[keep])
            self._moments = tuple(m.result() for m in acc)
        return self._moments

    def _selected_blocks(self):
        """(a, b, mask) per block of source rows: which rows of a..b-1 belong to the selected episodes."""
        first, stop = self.source_starts, self.source_starts + self.lengths
        total = int(stop[-1])
        block = MOMENT_BLOCK_STEPS
        for a in range(int(first[0]) // block * block, total, block):   # blocks on chunk boundaries
            b = min(total, a + block)
            lo, hi = np.searchsorted(stop, a, side="right"), np.searchsorted(first, b, side="left")
            d = np.zeros(b - a + 1, dtype=np.int64)
            np.add.at(d, np.clip(first[lo:hi] - a, 0, b - a), 1)
            np.add.at(d, np.clip(stop[lo:hi] - a, 0, b - a), -1)
            yield a, b, np.cumsum(d)[:-1] > 0


class _Moments:
    """Mean and population std over rows added block by block (Chan et al.'s pairwise update, float64)."""

    def __init__(self):
        self.n, self.mean, self.m2 = 0, None, None

    def add(self, x: np.ndarray) -> None:
        if len(x) == 0:
            return
        x = x.astype(np.float64)
        n_b, mean_b = len(x), x.mean(axis=0)
        m2_b = ((x - mean_b) ** 2).sum(axis=0)
        if self.n == 0:
            self.n, self.mean, self.m2 = n_b, mean_b, m2_b
            return
        n = self.n + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + m2_b + delta ** 2 * (self.n * n_b / n)
        self.n = n

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        return self.mean, np.sqrt(self.m2 / self.n)


class StridedPool:
    """The sorted compact steps ``t`` of the chosen episodes with ``t % world_size == rank``, without a table:
    ``pool[k]`` finds the k-th through per-episode counts (the RAM path's ``arange(T)[rank::W]`` filtered by
    episode, element for element)."""

    def __init__(self, starts: np.ndarray, lengths: np.ndarray, chosen: np.ndarray, rank: int, world_size: int):
        w, r = int(world_size), int(rank)
        s, e = starts[chosen], starts[chosen] + lengths[chosen]
        count = (e - r + w - 1) // w - (s - r + w - 1) // w           # t in [s, e) with t ≡ r (mod w)
        self._first = s + (r - s) % w
        keep = count > 0
        self._first, count = self._first[keep], count[keep]
        self._cum = np.cumsum(count)
        self._count, self._w = count, w

    def __len__(self) -> int:
        return int(self._cum[-1]) if len(self._cum) else 0

    @property
    def size(self) -> int:
        return len(self)

    def __getitem__(self, k) -> np.ndarray:
        if isinstance(k, slice):   # only the empty slice the draw code takes (pool[:0])
            if len(range(*k.indices(len(self)))):
                raise IndexError("StridedPool: only empty slices")
            return np.zeros(0, dtype=np.int64)
        k = np.asarray(k, dtype=np.int64)
        e = np.searchsorted(self._cum, k, side="right")
        j = k - (self._cum[e] - self._count[e])
        return self._first[e] + j * self._w
