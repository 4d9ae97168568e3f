"""Will a store accept these episodes? Asked before a collection or an import starts, so a mismatch
(another robot, control rate, image rate or feature set) is a one-line error up front - not a failure at the final
merge after the work is done (compaction still checks every file, and quarantines what it cannot merge).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from quadforge.data.schema import StoreSchema, spec_for
from quadforge.data.store import MANIFEST, SCHEMA_FILE, read_schema

# per-step features added to the catalogue after stores were written without them: an episode joining
# such a store leaves them out, so the store keeps one schema (and reads as it always did)
LATER_FEATURES = ("pushed",)


def committed_schema(store_path: str | Path) -> StoreSchema | None:
    """The schema of a store that has committed episodes; None for a new or empty store."""
    root = Path(store_path)
    if not (root / MANIFEST).is_file() or not (root / SCHEMA_FILE).is_file():
        return None
    return read_schema(root)


def features_the_store_predates(store_path: str | Path) -> frozenset[str]:
    """The ``LATER_FEATURES`` a store's committed schema lacks (none for a new store)."""
    schema = committed_schema(store_path)
    if schema is None:
        return frozenset()
    return frozenset(f for f in LATER_FEATURES if f not in schema.features)


def check_store_accepts(store_path: str | Path, *, robot: str | None = None, control_dt: float | None = None,
                        frame_stride: int | None = None, features: Mapping[str, Any] | None = None,
                        what: str = "this collection") -> None:
    """Raise ValueError naming the store, what differs and what to do; a new store accepts anything.
    ``frame_stride``: the steps per camera frame of episodes that record images (None: they record none)."""
    schema = committed_schema(store_path)
    if schema is None:
        return
    fix = "collect into another --store, or match the store"
    if robot and schema.robot and robot != schema.robot:
        raise ValueError(f"{store_path}: the store holds {schema.robot!r} episodes, {what} is for robot {robot!r} "
                         f"(one robot per store); {fix}")
    if control_dt is not None and schema.control_dt and abs(float(control_dt) - schema.control_dt) > 1e-9:
        raise ValueError(f"{store_path}: the store runs at {schema.control_rate_hz:g} Hz (control_dt "
                         f"{schema.control_dt}), {what} at control_dt {control_dt}; {fix}")
    if frame_stride is not None and schema.image_features and frame_stride != schema.frame_stride:
        raise ValueError(f"{store_path}: the store records a camera frame every {schema.frame_stride} steps, {what} "
                         f"one every {frame_stride} (one image rate per store); {fix}")
    if features is not None:
        where = f"{what} (store {store_path})"
        try:
            # per-step shapes with the dtypes the staging writer casts to (data.schema.spec_for)
            heads = {}
            for name, value in features.items():
                value = np.asarray(value)
                heads[name] = np.empty((0,) + tuple(value.shape[1:]), spec_for(name, value, where).dtype)
            schema.check(heads, where=where)
        except ValueError as err:
            raise ValueError(f"{err}; {fix}") from None
