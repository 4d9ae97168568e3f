"""Which sampler path a store takes: RAM when its tables fit the RAM budget, out of core when not.

``sampler_source(source, features, layout, ram_budget)`` is the one call every trainer makes before building
its samplers. It estimates the bytes the RAM path would hold (``ram_bytes_per_step``: the loaded features,
the layout-vector and action tables, the per-step indices), times the data-parallel ranks on this node (each
holds its own copy), and returns

- the loaded ``EpisodeArrays`` when that fits ``ram_budget`` (the RAM path: fastest batches), or
- a ``StepShards`` (``data.step_shards``) when it does not: per-step arrays memory-mapped from uncompressed
  shard files, one copy of the bytes for every rank on the node, windows gathered per batch.

A ``data.store_set.StoreSet`` (several stores as one: DAgger's aggregate) takes the same choice on its
total: its stores loaded and concatenated, or a ``MultiStepShards`` over each store's shards.

It says which in the log. ``ram_budget``: "auto" (``DEFAULT_FRACTION`` of this machine's memory), a size
("8G", "512M", "1.5GB", plain bytes), "0" (always out of core) or "inf" (always RAM).
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Iterable

import numpy as np

from quadforge.data.episodes import EpisodeArrays, as_episode_arrays
from quadforge.data.step_shards import ShardSource, StepShards
from quadforge.data.store_set import MultiStepShards, StoreSet
from quadforge.layout import ObsLayout

DEFAULT_FRACTION = 0.5           # of physical memory: room for the model, the optimizer and the OS
INDEX_BYTES_PER_STEP = 72        # the RAM path's per-step int64 indices (5) and float64 reward/return (2) + pool
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def machine_memory() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def parse_ram_budget(value: Any) -> float:
    """Bytes from "auto", "inf", a number of bytes or a size with a K/M/G/T suffix (powers of 1024)."""
    text = str(value).strip().lower()
    if text in ("auto", "", "none"):
        return DEFAULT_FRACTION * machine_memory()
    if text in ("inf", "infinity", "ram"):
        return float("inf")
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"--ram-budget {value!r}: expected a size such as 8G, 512M, 1.5GB, a byte count, "
                         f"'auto' or 'inf'")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def local_ranks() -> int:
    """Data-parallel ranks on this node (torchrun's LOCAL_WORLD_SIZE; 1 outside torchrun)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def ram_bytes_per_step(store: Any, features: Iterable[str], layout: ObsLayout | None) -> int:
    """What the RAM path holds per stored step: the loaded features, the layout-vector and action tables
    built from them (float32; the layout build's temporary copy counted once more) and the indices.
    ``layout=None``: no tables (the image sampler keeps the loaded features as they are)."""
    loaded = 0
    for name in features:
        spec = store.schema.features[name]
        loaded += int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
    if layout is None:
        return loaded + INDEX_BYTES_PER_STEP
    d, a = layout.dim, 12
    # at its peak the RAM path holds the loaded features, the gathered term copies (4 d), the tables
    # (4 (d + a + 1)) and the moments' float64 copy and deviations (16 d, 8 a): ~2.0 KB per step on proprio
    return loaded + 4 * d + 4 * (d + a + 1) + 16 * d + 8 * a + INDEX_BYTES_PER_STEP


def fits_in_ram(store: Any, features: Iterable[str], layout: ObsLayout | None, ram_budget: Any = "auto",
                log: Callable[[str], None] | None = print) -> bool:
    """Whether the RAM path's tables for ``features`` of ``store`` (times the ranks on this node) fit the
    budget; says which path in the log."""
    present = [f for f in dict.fromkeys(features) if f in set(store.feature_names)]
    budget = parse_ram_budget(ram_budget)
    ranks = local_ranks()
    need = store.num_steps * ram_bytes_per_step(store, present, layout) * ranks
    where = f"{store.num_steps:,} steps x {ranks} rank(s) ~ {need / 2**30:.2f} GiB for the RAM path"
    limit = "no limit" if budget == float("inf") else f"{budget / 2**30:.2f} GiB"
    fits = need <= budget
    if log and fits:
        log(f"data: RAM path ({where} <= --ram-budget {limit})")
    elif log:
        roots = store.roots if hasattr(store, "roots") else [store.root]   # a StoreSet: each store's shards
        shards = " and ".join(f"{root}/shards" for root in roots)
        log(f"data: out-of-core path ({where} > --ram-budget {limit}): windows read per batch from memory-mapped "
            f"shards under {shards}")
    return fits


def sampler_source(source: Any, features: Iterable[str], layout: ObsLayout, ram_budget: Any = "auto",
                   log: Callable[[str], None] | None = print) -> Any:
    """``source`` (a store, a ``StoreSet`` or ``EpisodeArrays``) as the samplers should read it; see the module doc."""
    features = [f for f in dict.fromkeys(features)]
    if isinstance(source, (EpisodeArrays, ShardSource)):
        return source
    if not (hasattr(source, "schema") and hasattr(source, "num_steps")):
        return as_episode_arrays(source, features)
    if fits_in_ram(source, features, layout, ram_budget, log):
        return as_episode_arrays(source, [f for f in features if f in set(source.feature_names)])
    return MultiStepShards(source, log=log) if isinstance(source, StoreSet) else StepShards(source, log=log)
