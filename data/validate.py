"""Check every invariant of a store and report all broken ones, not just the first.

Invariants: manifest readable and consistent (generation >= 1, per-feature lengths = num_steps, the
schema's features); episode table with num_episodes complete rows; ends strictly increasing, starts
contiguous from 0, length = end - start, lengths summing to num_steps; unique episode ids; arrays
present with the schema's dtype/shape and at least the manifest's rows; every chunk under the
manifest's length present and decodable; finite values in float features; stats present for every
non-image feature with count = num_steps and matching a recomputation; image features with
sum(ceil(length / stride)) frames; a readable instruction table with the manifest's num_instructions
entries, per-step ``instruction`` values and ``instruction_id`` within it; task_params dicts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quadforge.data.images import is_image, num_frames
from quadforge.data.schema import StoreSchema
from quadforge.data.staging import list_staged
from quadforge.data.stats import RunningStats
from quadforge.data.store import (MANIFEST, SCHEMA_FILE, array_path, read_episode_table, read_instructions, read_json,
                                  read_manifest)


@dataclass
class ValidationReport:
    path: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        head = f"{self.path}: {'OK' if self.ok else f'{len(self.problems)} problem(s)'}"
        return "\n".join([head] + [f"  ERROR {p}" for p in self.problems] + [f"  note  {n}" for n in self.notes])


def validate(store_path: str | Path, check_values: bool = True) -> ValidationReport:
    root = Path(store_path)
    rep = ValidationReport(str(root))
    if not root.is_dir():
        rep.problems.append(f"{root}: no such directory")
        return rep
    staged = list_staged(root)
    if staged:
        rep.notes.append(f"{len(staged)} staged episode(s) not yet compacted")
    try:
        manifest = read_manifest(root)
    except (FileNotFoundError, ValueError) as err:
        rep.problems.append(str(err))
        return rep
    try:
        schema = StoreSchema.from_dict(read_json(root / SCHEMA_FILE, "schema"))
    except (FileNotFoundError, ValueError, KeyError, TypeError) as err:
        rep.problems.append(f"{root / SCHEMA_FILE}: {err}")
        schema = None

    n_steps, n_eps = int(manifest["num_steps"]), int(manifest["num_episodes"])
    if int(manifest["generation"]) < 1:
        rep.problems.append(f"{MANIFEST}: generation {manifest['generation']} < 1")
    lengths = manifest["lengths"]
    table = _check_table(root, n_eps, n_steps, rep)
    rows = _expected_rows(schema, table, n_steps)
    for name, n in lengths.items():
        want = rows.get(name, n_steps)
        if int(n) != want:
            what = "frames (sum of ceil(length / frame_stride))" if want != n_steps else "num_steps"
            rep.problems.append(f"{MANIFEST}: feature {name!r} length {n} != {what} {want}")
    if schema is not None and set(lengths) != set(schema.features):
        rep.problems.append(f"{MANIFEST}: features {sorted(lengths)} != schema features {sorted(schema.features)}")
    if schema is not None and len({schema.features[n].stride for n in schema.image_features}) > 1:
        rep.problems.append(f"{SCHEMA_FILE}: image features have different strides (one image rate per store)")
    instructions = _check_instructions(root, manifest, table, rep)

    if schema is not None:
        _check_arrays(root, schema, manifest, rows, rep, check_values, instructions)
    return rep


def _expected_rows(schema: StoreSchema | None, table, n_steps: int) -> dict[str, int]:
    """Rows each feature must have: num_steps, or for images the episodes' frame counts summed."""
    if schema is None:
        return {}
    out = {name: n_steps for name in schema.features}
    if table is not None:
        for name in schema.image_features:
            out[name] = int(num_frames(table["length"], schema.features[name].stride).sum())
    return out


def _check_instructions(root: Path, manifest: dict, table, rep: ValidationReport) -> int:
    """The committed instruction table's size (0 when it is unreadable, after reporting that)."""
    try:
        n = len(read_instructions(root, manifest))
    except (FileNotFoundError, ValueError) as err:
        rep.problems.append(str(err))
        return 0
    if table is not None and len(table):
        ids = table["instruction_id"]
        bad = np.flatnonzero((ids < -1) | (ids >= n))
        if bad.size:
            rep.problems.append(f"episode table: instruction_id outside the instruction table (size {n}) at episodes "
                                f"{bad.tolist()[:10]}")
        not_dict = [i for i, p in enumerate(table["task_params"]) if not isinstance(p, dict)]
        if not_dict:
            rep.problems.append(f"episode table: task_params not a dict at episodes {not_dict[:10]}")
    return n


def _check_table(root: Path, n_eps: int, n_steps: int, rep: ValidationReport):
    """The episode table (None when unreadable), after reporting its broken invariants."""
    try:
        table = read_episode_table(root, n_eps)
    except (FileNotFoundError, ValueError) as err:
        rep.problems.append(str(err))
        return None
    start, end, length = table["start"], table["end"], table["length"]
    if n_eps == 0:
        rep.problems.append("episode table: no episodes")
        return table
    if (np.diff(end) <= 0).any():
        rep.problems.append(f"episode table: ends not strictly increasing at episodes "
                            f"{(np.flatnonzero(np.diff(end) <= 0) + 1).tolist()[:10]}")
    if start[0] != 0 or (start[1:] != end[:-1]).any():
        bad = np.flatnonzero(np.concatenate([[start[0] != 0], start[1:] != end[:-1]]))
        rep.problems.append(f"episode table: starts not contiguous at episodes {bad.tolist()[:10]}")
    if (length != end - start).any() or (length <= 0).any():
        bad = np.flatnonzero((length != end - start) | (length <= 0))
        rep.problems.append(f"episode table: length != end - start (or <= 0) at episodes {bad.tolist()[:10]}")
    if int(length.sum()) != n_steps or int(end[-1]) != n_steps:
        rep.problems.append(f"episode table: lengths sum to {int(length.sum())}, last end {int(end[-1])}, "
                            f"manifest num_steps {n_steps}")
    ids, counts = np.unique(table["episode_id"], return_counts=True)
    if (counts > 1).any():
        rep.problems.append(f"episode table: duplicate episode ids {ids[counts > 1].tolist()[:10]}")
    return table


def _check_arrays(root: Path, schema: StoreSchema, manifest: dict, rows: dict[str, int], rep: ValidationReport,
                  check_values: bool, num_instructions: int) -> None:
    import zarr
    try:
        group = zarr.open_group(str(root), mode="r", zarr_format=3)
    except Exception as err:  # any zarr failure here means a damaged group
        rep.problems.append(f"{root}: cannot open zarr group ({err})")
        return
    n_steps = int(manifest["num_steps"])
    for name, spec in sorted(schema.features.items()):
        n = rows.get(name, n_steps)
        where = f"{array_path(name)}"
        try:
            arr = group[array_path(name)]
        except KeyError:
            rep.problems.append(f"{where}: array missing")
            continue
        if tuple(arr.shape[1:]) != spec.shape or np.dtype(arr.dtype) != np.dtype(spec.dtype):
            rep.problems.append(f"{where}: on disk {arr.dtype}{tuple(arr.shape[1:])}, schema "
                                f"{spec.dtype}{spec.shape}")
        if arr.shape[0] < n:
            rep.problems.append(f"{where}: {arr.shape[0]} rows on disk < manifest "
                                f"{'frames' if is_image(name) else 'num_steps'} {n}")
            continue
        chunk = arr.chunks[0]
        # chunks span the whole per-step shape, so chunk i's key is c/i/0/.../0
        tail = "/0" * (arr.ndim - 1)
        missing = [i for i in range(-(-n // chunk)) if not (root / array_path(name) / f"c/{i}{tail}").is_file()]
        if missing:
            rep.problems.append(f"{where}: chunk(s) {missing[:10]} missing")
        stats_d = manifest["stats"].get(name)
        if not is_image(name):
            if stats_d is None:
                rep.problems.append(f"{MANIFEST}: no stats for feature {name!r}")
            elif int(stats_d["count"]) != n:
                rep.problems.append(f"{MANIFEST}: stats count for {name!r} is {stats_d['count']}, not {n}")
        if not check_values or missing:
            continue
        _check_values(arr, name, n, chunk, spec.dtype, stats_d, rep,
                      num_instructions if name == "instruction" else None)


def _check_values(arr, name: str, n: int, chunk: int, dtype: str, stats_d: dict | None,
                  rep: ValidationReport, index_bound: int | None = None) -> None:
    where = array_path(name)
    recomputed = RunningStats.empty(tuple(arr.shape[1:])) if stats_d is not None else None
    nonfinite, first_bad = 0, None
    step = chunk * max(1, (8 << 20) // max(1, chunk * int(np.prod(arr.shape[1:])) * arr.dtype.itemsize))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        try:
            block = np.asarray(arr[lo:hi])
        except Exception as err:  # codec errors from a damaged chunk
            rep.problems.append(f"{where}: rows {lo}:{hi} unreadable ({type(err).__name__}: {err})")
            return
        if np.issubdtype(block.dtype, np.floating):
            bad = ~np.isfinite(block).reshape(len(block), -1).all(axis=1)
            if bad.any():
                nonfinite += int(bad.sum())
                first_bad = first_bad if first_bad is not None else lo + int(np.flatnonzero(bad)[0])
        if index_bound is not None:
            out = (block < -1) | (block >= index_bound)
            if out.any():
                rep.problems.append(f"{where}: instruction index outside the instruction table (size "
                                    f"{index_bound}) at step {lo + int(np.flatnonzero(out)[0])}")
                index_bound = None
        if recomputed is not None:
            recomputed.update(block)
    if nonfinite:
        rep.problems.append(f"{where}: {nonfinite} step(s) with non-finite values (first at step {first_bad})")
    if recomputed is not None and stats_d is not None and not nonfinite:
        stored = RunningStats.from_dict(stats_d)
        scale = np.maximum(1.0, np.abs(recomputed.mean))
        if (np.abs(stored.mean - recomputed.mean) > 1e-6 * scale).any() or \
                (stored.min != recomputed.min).any() or (stored.max != recomputed.max).any():
            rep.problems.append(f"{MANIFEST}: stats for {name!r} disagree with the data")
