"""Check every invariant of a store and report all broken ones, not just the first.

Invariants: manifest readable and consistent (generation >= 1, per-feature lengths = num_steps, the
schema's features); episode table with num_episodes complete rows; ends strictly increasing, starts
contiguous from 0, length = end - start, lengths summing to num_steps; unique episode ids; arrays
present with the schema's dtype/shape and at least the manifest's rows; every chunk under the
manifest's length present and decodable; the digests the manifest records (itself, schema, episode
and tasks tables, every array's zarr.json) and every chunk's CRC32C (``data.integrity``); finite values
in float features and stats present for every non-image feature with count = num_steps and matching a
recomputation; image features with sum(ceil(length / stride)) frames (one stride per store); a
readable instruction table with the manifest's num_instructions entries (and digest), per-step
``instruction`` values and ``instruction_id`` within it; task_params dicts. Quarantined staging files are warnings: the store is sound, but they were not merged;
so are partial staging writes no live writer owns (``staging/.tmp-*``: leftovers of a killed or failed write).
Levels: metadata and chunk files only (``checksums=False, check_values=False``, the CLI's ``--quick``),
checksums (the CLI's default), checksums and values (``--deep``; the Python default).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quadforge.data.integrity import (DIGEST_KEY, array_meta_digest, bad_chunks, canonical_digest, manifest_digest,
                                     missing_chunk_files, num_chunks, read_array_meta, tasks_digest)
from quadforge.data.images import is_image, num_frames
from quadforge.data.schema import StoreSchema
from quadforge.data.staging import abandoned_partial_writes, list_quarantined, list_staged
from quadforge.data.stats import RunningStats
from quadforge.data.episode_table import committed_segments, read_table, segment_files_on_disk
from quadforge.data.store import (MANIFEST, SCHEMA_FILE, TASKS_FILE, array_path, read_instructions, read_manifest,
                                  read_schema, read_tasks)
from quadforge.progress import progress_bar


@dataclass
class ValidationReport:
    path: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # the store is sound, but something needs a look
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        head = f"{self.path}: {'OK' if self.ok else f'{len(self.problems)} problem(s)'}"
        if self.ok and self.warnings:
            head += f", {len(self.warnings)} warning(s)"
        return "\n".join([head] + [f"  ERROR {p}" for p in self.problems] + [f"  WARN  {w}" for w in self.warnings]
                         + [f"  note  {n}" for n in self.notes])


def validate(store_path: str | Path, check_values: bool = True, checksums: bool = True,
             progress: bool = False) -> ValidationReport:
    """Every invariant; ``checksums`` decodes every chunk and compares its CRC32C with the manifest's,
    ``check_values`` also checks the values (finite, stats). Neither: metadata and chunk files only.
    ``progress``: a bar (stderr, on a terminal) over the bytes the chunk checks decode, minutes on a large store."""
    rep = ValidationReport(str(store_path))
    try:
        _validate(Path(store_path), rep, check_values, checksums, progress)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OSError) as err:
        # damage in a place no specific check anticipated: still a report, never a traceback
        rep.problems.append(f"{store_path}: damaged store ({type(err).__name__}: {err})")
    return rep


def _validate(root: Path, rep: ValidationReport, check_values: bool, checksums: bool, progress: bool) -> None:
    if not root.is_dir():
        rep.problems.append(f"{root}: no such directory")
        return
    try:
        staged = list_staged(root)
    except OSError as err:
        rep.problems.append(f"{root / 'staging'}: unreadable ({err})")
        staged = []
    if staged:
        rep.notes.append(f"{len(staged)} staged episode(s) not yet compacted")
    for path, reason in list_quarantined(root):
        rep.warnings.append(f"quarantined staging file {path.name} (not merged): {reason}")
    for path in abandoned_partial_writes(root):
        rep.warnings.append(f"partial staging write {path} of a writer that is gone: no episode; `quadforge "
                            f"dataset compact --store {root}` or the collector's next run removes it")
    try:
        manifest = read_manifest(root, verify=False)
    except (FileNotFoundError, ValueError) as err:
        rep.problems.append(str(err))
        return
    if DIGEST_KEY in manifest and manifest[DIGEST_KEY] != manifest_digest(manifest):
        rep.problems.append(f"{MANIFEST}: its digest does not match its content (damaged or edited)")
    if "integrity" not in manifest:
        rep.notes.append("written before chunk checksums: missing chunks are detected, changed bytes inside a "
                         "chunk only by --deep's value checks; the next compaction records checksums")
    try:
        schema = read_schema(root)
    except (FileNotFoundError, ValueError) as err:
        rep.problems.append(str(err))
        schema = None

    n_steps = int(manifest["num_steps"])
    if int(manifest["generation"]) < 1:
        rep.problems.append(f"{MANIFEST}: generation {manifest['generation']} < 1")
    meta = manifest.get("meta") or {}
    table = _check_table(root, manifest, rep)
    rows = _expected_rows(schema, table, n_steps)
    lengths = manifest["lengths"]
    for name, n in lengths.items():
        want = rows.get(name, n_steps)
        if int(n) != want:
            what = "frames (sum of ceil(length / frame_stride))" if want != n_steps else "num_steps"
            rep.problems.append(f"{MANIFEST}: feature {name!r} length {n} != {what} {want}")
    if schema is not None and set(lengths) != set(schema.features):
        rep.problems.append(f"{MANIFEST}: features {sorted(lengths)} != schema features {sorted(schema.features)}")
    if schema is not None and len({schema.features[n].stride for n in schema.image_features}) > 1:
        rep.problems.append(f"{SCHEMA_FILE}: image features have different strides (one image rate per store)")
    num_instructions = _check_instructions(root, manifest, table, rep)

    if schema is not None and meta and meta.get("schema") != canonical_digest(schema.to_dict()):
        rep.problems.append(f"{SCHEMA_FILE}: differs from the schema the manifest committed")
    try:
        tasks = read_tasks(root, required=bool(meta))
        if meta and meta.get("tasks") != tasks_digest(tasks, meta.get("tasks_counts") or {}):
            rep.problems.append(f"{TASKS_FILE}: differs from the tasks table the manifest committed")
    except (FileNotFoundError, ValueError) as err:
        rep.problems.append(str(err))
    if schema is not None:
        _check_arrays(root, schema, manifest, rows, rep, check_values, checksums, num_instructions, progress)


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


def _check_table(root: Path, manifest: dict, rep: ValidationReport):
    """The episode table (None when unreadable), after reporting its broken invariants (a segment that
    differs from its digest is reported and its rows checked all the same)."""
    n_steps, n_eps = int(manifest["num_steps"]), int(manifest["num_episodes"])
    leftovers = sorted(segment_files_on_disk(root) - {str(s["file"]) for s in committed_segments(manifest)})
    if leftovers:
        rep.notes.append(f"{len(leftovers)} episode table segment file(s) the manifest does not list ({leftovers[:3]}): "
                         f"an interrupted compaction's; the next compaction deletes them")
    try:
        table = read_table(root, manifest, damaged=rep.problems).decode()
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
                  check_values: bool, checksums: bool, num_instructions: int, progress: bool = False) -> None:
    import zarr
    try:
        group = zarr.open_group(str(root), mode="r", zarr_format=3)
    except Exception as err:  # any zarr failure here means a damaged group
        rep.problems.append(f"{root}: cannot open zarr group ({err})")
        return
    n_steps = int(manifest["num_steps"])
    recorded = manifest.get("checksums") or {}
    array_digests = (manifest.get("meta") or {}).get("arrays") or {}
    row_bytes = {name: int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
                 for name, spec in schema.features.items()}
    todo = {name: rows.get(name, n_steps) * row_bytes[name] for name in schema.features
            if _reads_rows(name, recorded, check_values, checksums)}
    with progress_bar(sum(todo.values()), desc="validate", unit="B", unit_scale=True, enabled=progress) as bar:
        for name, spec in sorted(schema.features.items()):
            done = bar.n
            _check_array(group, root, name, spec, rows.get(name, n_steps), manifest, recorded, array_digests, rep,
                         check_values, checksums, num_instructions, bar)
            bar.update(done + todo.get(name, 0) - bar.n)   # a feature skipped or cut short still counts as done


def _reads_rows(name: str, recorded: dict, check_values: bool, checksums: bool) -> bool:
    """Whether a feature's rows are decoded: for their values, or for their recorded chunk CRCs."""
    return check_values or (checksums and name in recorded)


def _check_array(group, root: Path, name: str, spec, n: int, manifest: dict, recorded: dict, array_digests: dict,
                 rep: ValidationReport, check_values: bool, checksums: bool, num_instructions: int, bar) -> None:
    """One feature's array: metadata, shape, chunk files, then (``_check_data``) its rows."""
    where = f"{array_path(name)}"
    try:
        arr = group[array_path(name)]
        chunk, ndim = int(arr.chunks[0]), arr.ndim
    except KeyError:
        rep.problems.append(f"{where}: array missing")
        return
    except Exception as err:  # damaged zarr.json
        rep.problems.append(f"{where}: unreadable array metadata ({type(err).__name__}: {err})")
        return
    if name in array_digests:
        try:
            if array_meta_digest(read_array_meta(root / array_path(name))) != array_digests[name]:
                rep.problems.append(f"{where}/zarr.json: differs from the array metadata the manifest committed")
        except ValueError as err:
            rep.problems.append(str(err))
    if tuple(arr.shape[1:]) != spec.shape or np.dtype(arr.dtype) != np.dtype(spec.dtype):
        rep.problems.append(f"{where}: on disk {arr.dtype}{tuple(arr.shape[1:])}, schema "
                            f"{spec.dtype}{spec.shape}")
        return
    if arr.shape[0] < n:
        rep.problems.append(f"{where}: {arr.shape[0]} rows on disk < manifest "
                            f"{'frames' if is_image(name) else 'num_steps'} {n}")
        return
    if name in (manifest.get("chunks") or {}) and int(manifest["chunks"][name]) != chunk:
        rep.problems.append(f"{where}: chunks of {chunk} steps on disk, the manifest says {manifest['chunks'][name]}")
        return
    missing = missing_chunk_files(root / array_path(name), ndim, n, chunk)
    if missing:
        rep.problems.append(f"{where}: chunk(s) {missing[:10]} missing")
    stats_d = manifest["stats"].get(name)
    if not is_image(name):
        if stats_d is None:
            rep.problems.append(f"{MANIFEST}: no stats for feature {name!r}")
        elif int(stats_d["count"]) != n:
            rep.problems.append(f"{MANIFEST}: stats count for {name!r} is {stats_d['count']}, not {n}")
    if name in recorded and len(recorded[name]) != num_chunks(n, chunk):
        rep.problems.append(f"{MANIFEST}: {len(recorded[name])} chunk checksums for {where}, "
                            f"{num_chunks(n, chunk)} chunks expected")
        return
    if missing or not _reads_rows(name, recorded, check_values, checksums):
        return
    _check_data(arr, name, n, chunk, recorded.get(name) if checksums else None,
                stats_d if check_values else None, check_values, rep,
                num_instructions if name == "instruction" and check_values else None, bar)


def _read_block(arr, lo: int, hi: int, chunk: int) -> tuple[np.ndarray | None, list[int]]:
    """Rows lo:hi, or (None, the chunks that cannot be decoded)."""
    try:
        return np.asarray(arr[lo:hi]), []
    except Exception:  # codec errors from a damaged chunk: find which ones
        bad = []
        for c in range(lo // chunk, -(-hi // chunk)):
            try:
                np.asarray(arr[c * chunk:min(hi, (c + 1) * chunk)])
            except Exception:
                bad.append(c)
        return None, bad


def _check_data(arr, name: str, n: int, chunk: int, crcs: list[int] | None, stats_d: dict | None,
                check_values: bool, rep: ValidationReport, index_bound: int | None = None, bar=None) -> None:
    """One pass over the rows, a few chunks at a time: checksums, then (``check_values``) finiteness
    and a recomputation of the stats."""
    where = array_path(name)
    recomputed = RunningStats.empty(tuple(arr.shape[1:])) if stats_d is not None else None
    nonfinite, first_bad = 0, None
    undecodable, mismatched = [], []
    step = chunk * max(1, (8 << 20) // max(1, chunk * int(np.prod(arr.shape[1:])) * arr.dtype.itemsize))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        block, bad = _read_block(arr, lo, hi, chunk)
        if bar is not None:
            bar.update((hi - lo) * int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize)
        if block is None:
            undecodable += bad
            continue
        if crcs is not None:
            first = lo // chunk
            mismatched += [first + i for i in bad_chunks(block, chunk, crcs[first:first + num_chunks(hi - lo, chunk)])]
        if not check_values:
            continue
        if np.issubdtype(block.dtype, np.floating):
            bad_rows = ~np.isfinite(block).reshape(len(block), -1).all(axis=1)
            if bad_rows.any():
                nonfinite += int(bad_rows.sum())
                first_bad = first_bad if first_bad is not None else lo + int(np.flatnonzero(bad_rows)[0])
        if index_bound is not None:
            out = (block < -1) | (block >= index_bound)
            if out.any():
                rep.problems.append(f"{where}: instruction index outside the instruction table (size "
                                    f"{index_bound}) at step {lo + int(np.flatnonzero(out)[0])}")
                index_bound = None
        if recomputed is not None:
            recomputed.update(block)
    if undecodable:
        rep.problems.append(f"{where}: chunk(s) {undecodable[:10]} cannot be decoded (damaged)")
    if mismatched:
        rep.problems.append(f"{where}: chunk(s) {mismatched[:10]} fail their CRC32C checksum (damaged or swapped)")
    if nonfinite:
        rep.problems.append(f"{where}: {nonfinite} step(s) with non-finite values (first at step {first_bad})")
    if recomputed is not None and stats_d is not None and not nonfinite and not undecodable:
        try:
            stored = RunningStats.from_dict(stats_d)
            scale = np.maximum(1.0, np.abs(recomputed.mean))
            differ = (np.abs(stored.mean - recomputed.mean) > 1e-6 * scale).any() or \
                (stored.min != recomputed.min).any() or (stored.max != recomputed.max).any()
        except (KeyError, TypeError, ValueError):
            differ = True
        if differ:
            rep.problems.append(f"{MANIFEST}: stats for {name!r} disagree with the data")
