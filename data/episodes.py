"""Episodes held in RAM, and the seeded episode-level selection (split + filters) the samplers share.

``EpisodeArrays`` is the in-memory twin of a trajectory store: per-step features concatenated along
time, cumulative ``episode_ends`` (diffusion_policy's ReplayBuffer convention: episode i spans
``ends[i-1]:ends[i]``), and a per-episode info table (dict of equal-length columns). Samplers accept
either one of these or a ``TrajectoryStore``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from quadforge.data.deferred_column import DeferredColumn
from quadforge.seeding import numpy_rng
from quadforge.terms import TERRAIN_TYPES
from quadforge.typed_values import flag, is_whole, whole_array

SPLITS = ("train", "val", "all")
FILTER_KEYS = ("success_only", "failure_only", "terrain_types", "tasks", "policy_ids", "terrain_levels",
               "episode_ids", "families")


class EpisodeSpans:
    """Sizes and spans derived from cumulative ``episode_ends`` (shared by ``EpisodeArrays`` and the
    out-of-core ``data.step_shards.StepShards``)."""

    episode_ends: np.ndarray

    @property
    def num_episodes(self) -> int:
        return len(self.episode_ends)

    @property
    def num_steps(self) -> int:
        return int(self.episode_ends[-1]) if len(self.episode_ends) else 0

    @property
    def episode_starts(self) -> np.ndarray:
        return np.concatenate([[0], self.episode_ends[:-1]]).astype(np.int64)

    @property
    def episode_lengths(self) -> np.ndarray:
        return np.diff(self.episode_ends, prepend=0)


@dataclass
class EpisodeArrays(EpisodeSpans):
    features: dict[str, np.ndarray]
    episode_ends: np.ndarray
    episode_info: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # whole_array, not a cast: an end of 20.7 truncated to 20 would cut a step off silently
        ends = whole_array(self.episode_ends, "EpisodeArrays: episode_ends").reshape(-1)
        if ends.size == 0:
            raise ValueError("EpisodeArrays: episode_ends is empty; need at least one episode")
        lengths = np.diff(ends, prepend=0)
        if (lengths <= 0).any():
            bad = int(np.flatnonzero(lengths <= 0)[0])
            raise ValueError(f"EpisodeArrays: episode_ends must be strictly increasing and positive; "
                             f"episode {bad} has length {int(lengths[bad])}")
        self.episode_ends = ends
        for name, arr in self.features.items():
            if len(arr) != ends[-1]:
                raise ValueError(f"EpisodeArrays: feature {name!r} has {len(arr)} steps, "
                                 f"episode_ends says {int(ends[-1])}")
        # a store's dict columns stay undecoded until read (data.episode_table.DeferredColumn)
        info = {k: v if isinstance(v, DeferredColumn) else np.asarray(v) for k, v in self.episode_info.items()}
        for name, col in info.items():
            if len(col) != len(ends):
                raise ValueError(f"EpisodeArrays: episode_info column {name!r} has {len(col)} rows, "
                                 f"there are {len(ends)} episodes")
        self.episode_info = info

    @classmethod
    def from_store(cls, store: Any, features: Iterable[str]) -> "EpisodeArrays":
        """Load ``features`` of a ``TrajectoryStore`` into RAM, with its episode table as the info."""
        loaded = store.load(list(dict.fromkeys(features)))
        table = store.episodes
        info = table.columns() if hasattr(table, "columns") else dict(table)
        return cls(loaded, np.asarray(info["end"], dtype=np.int64), info)

    def require(self, names: Iterable[str], who: str) -> None:
        missing = [n for n in names if n not in self.features]
        if missing:
            raise ValueError(f"{who}: features {missing} are missing; the source has {sorted(self.features)}")


def as_episode_arrays(source: Any, features: Iterable[str]) -> EpisodeArrays:
    """Accept EpisodeArrays as is; load the needed features of anything store-like."""
    if isinstance(source, EpisodeArrays):
        return source
    if hasattr(source, "load") and hasattr(source, "episodes"):
        have = set(getattr(source, "feature_names", features))
        # load what exists; the sampler's own check names anything missing
        return EpisodeArrays.from_store(source, [f for f in features if f in have])
    raise ValueError(f"sampler source must be EpisodeArrays or a TrajectoryStore, got {type(source).__name__}")


def split_episodes(num_episodes: int, split: str, val_fraction: float, seed: int) -> np.ndarray:
    """Sorted episode indices of one split of a seeded episode-level permutation.

    An episode is wholly in train or val. With val_fraction > 0 and at least two episodes, val holds
    at least one episode and train at least one.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; allowed: {SPLITS}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction}; must be in [0, 1)")
    everything = np.arange(num_episodes)
    if split == "all":
        return everything
    n_val = int(round(val_fraction * num_episodes))
    if val_fraction > 0 and num_episodes >= 2:
        n_val = min(max(n_val, 1), num_episodes - 1)
    perm = numpy_rng(seed, "episode_split").permutation(num_episodes)
    chosen = perm[:n_val] if split == "val" else perm[n_val:]
    return np.sort(chosen)


def _column(info: Mapping[str, np.ndarray], name: str, filter_key: str) -> np.ndarray:
    if name not in info:
        raise ValueError(f"filter {filter_key!r} needs episode_info column {name!r}; have {sorted(info)}")
    return info[name]


def _names(wanted: Any) -> list[str] | None:
    """A name filter's values as a list: one string is one name (iterating it would match its letters)."""
    if wanted is None:
        return None
    return [wanted] if isinstance(wanted, str) else [str(w) for w in wanted]


def filter_episodes(info: Mapping[str, np.ndarray], indices: np.ndarray,
                    filters: Mapping[str, Any] | None) -> np.ndarray:
    """Keep the episodes of ``indices`` that pass every filter (all filters AND together)."""
    if not filters:
        return indices
    unknown = sorted(set(filters) - set(FILTER_KEYS))
    if unknown:
        raise ValueError(f"unknown sampler filters {unknown}; allowed: {list(FILTER_KEYS)}")
    keep = np.ones(len(indices), dtype=bool)
    # a flag of "no" is truthy: only a real bool says which episodes to keep
    if filters.get("success_only") is not None and flag(filters["success_only"], "filter success_only"):
        keep &= _column(info, "success", "success_only")[indices].astype(bool)
    if filters.get("failure_only") is not None and flag(filters["failure_only"], "filter failure_only"):
        keep &= ~_column(info, "success", "failure_only")[indices].astype(bool)
    for key, col in (("terrain_types", "terrain_type"), ("tasks", "task"), ("policy_ids", "policy_id"),
                     ("episode_ids", "episode_id")):
        wanted = _names(filters.get(key))
        if wanted is not None:
            column = _column(info, col, key).astype(str)
            _check_names(key, wanted, column)
            keep &= np.isin(column[indices], np.asarray(wanted))
    families = _names(filters.get("families"))
    if families is not None:   # task_params["family"] (QUARD: go_to, go_avoid, stop, distinguish, go_through)
        column = np.asarray([str((p or {}).get("family", "")) for p in _column(info, "task_params", "families")])
        _check_names("families", families, column)
        keep &= np.isin(column[indices], np.asarray(families))
    levels = filters.get("terrain_levels")
    if levels is not None:
        levels = [levels] if is_whole(levels) else list(levels) if isinstance(levels, Iterable) else [levels]
        bad = [v for v in levels if not is_whole(v)]
        if bad:   # "0" matches no int level: the filter would leave nothing, and not say why
            raise ValueError(f"filter terrain_levels: {bad} are not whole numbers (levels are ints, e.g. [0, 1])")
        keep &= np.isin(_column(info, "terrain_level", "terrain_levels")[indices], np.asarray(levels, dtype=np.int64))
    return indices[keep]


def _check_names(key: str, wanted: list[str], column: np.ndarray) -> None:
    """A name filter's values must name something: a terrain type registered (``quadforge.terms``) or
    present, any other name present in the source's column (of every episode, not only the split's).
    A misspelt value otherwise drops its episodes silently."""
    have = set(column.tolist())
    unknown = [w for w in wanted if w not in have and not (key == "terrain_types" and w in TERRAIN_TYPES)]
    if not unknown:
        return
    if key == "terrain_types":
        raise ValueError(f"filter terrain_types: unknown terrain types {unknown}; registered: {list(TERRAIN_TYPES)}")
    shown = sorted(have)
    listing = f"{shown[:10]}{f' and {len(shown) - 10} more' if len(shown) > 10 else ''}"
    raise ValueError(f"filter {key}: {unknown} match no episode of the source (its values: {listing})")


def select_episodes(data: EpisodeArrays, split: str, val_fraction: float, seed: int,
                    filters: Mapping[str, Any] | None, who: str) -> np.ndarray:
    chosen = filter_episodes(data.episode_info, split_episodes(data.num_episodes, split, val_fraction, seed),
                             filters)
    if chosen.size == 0:
        raise ValueError(f"{who}: no episodes left for split={split!r} with filters={dict(filters or {})} "
                         f"(of {data.num_episodes} episodes)")
    return chosen


def discounted_returns(rewards: np.ndarray, episode_ends: np.ndarray, gamma: float) -> np.ndarray:
    """Per step, the discounted sum of rewards from that step to the end of its episode (float64).

    Loops over steps-from-the-end (vectorised across episodes), so it is exact for any length.
    """
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    out = np.zeros_like(r)
    ends = np.asarray(episode_ends, dtype=np.int64)
    lengths = np.diff(ends, prepend=0)
    for k in range(int(lengths.max())):
        alive = lengths > k
        idx = ends[alive] - 1 - k
        out[idx] = r[idx] + (gamma * out[idx + 1] if k > 0 else 0.0)
    return out
