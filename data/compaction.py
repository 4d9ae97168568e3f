"""Compaction: the store's only writer. Appends staged episodes, then commits a new manifest.

Order of a compaction (under an exclusive ``fcntl.flock`` on ``<store>/.lock``):
1. read the manifest (the trusted state) and truncate every array to its trusted length;
2. list staging files by name; skip those whose episode id is already in the table's last segment
   (where a crash after step 6 leaves them: the newest rows are always in the last segment);
3. check every remaining file's header against the schema (before any write);
4. append the episodes feature by feature in buffered, chunk-aligned blocks, updating running stats;
5. fsync the chunks written, then write the episode table's new segment (the new rows, merged with
   trailing segments: data/episode_table.py) and the tasks table (temp + fsync + rename);
6. write the new manifest (generation + 1) the same way - this is the commit point;
7. delete the consumed staging files and the segments the new one merged (and any a crash left).
A crash before 6 leaves the previous generation intact (the extra rows are ignored and overwritten
next time); a crash after 6 leaves staging files whose ids are already in the table, which the next
compaction deletes without appending them again.
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple

import numpy as np

from quadforge.data.episode_table import (SEGMENTS_KEY, EpisodeTable, committed_segments, encode_segment,
                                          merge_start, read_segment, segment_file, segment_files_on_disk)
from quadforge.data.integrity import (INTEGRITY_VERSION, ChunkCrcs, array_meta_digest, chunk_crcs, crc_rows,
                                     manifest_digest, read_array_meta, tasks_counts, tasks_digest, canonical_digest)
from quadforge.data.images import frame_stride_of, image_chunk_frames, is_image
from quadforge.data.instructions import InstructionTable
from quadforge.data.schema import StoreSchema, episode_length, spec_for
from quadforge.data.staging import (abandoned_partial_writes, episode_id_of, fsync_dir, info_type_problem, list_staged,
                                    quarantine_staged, read_staged, read_staged_header, remove_partial_writes)
from quadforge.data.stats import RunningStats
from quadforge.data.integrity import DIGEST_KEY
from quadforge.data.json_files import write_bytes_atomic, write_json_atomic
from quadforge.data.store import (INSTRUCTIONS_FILE, MANIFEST, SCHEMA_FILE, TASKS_FILE, TrajectoryStore, array_path,
                                  existing_store_dir, read_instructions, read_manifest, read_schema, read_tasks,
                                  verify_metadata)
from quadforge.data.schema import FORMAT_VERSION
from quadforge.errors import JobFailed, is_write_failure, os_reason
from quadforge.output_paths import is_store_dir, listing
from quadforge.progress import progress_bar

LOCK_FILE = ".lock"
TARGET_CHUNK_BYTES = 2 << 20        # ~2 MiB per chunk (diffusion_policy's choice)
MAX_CHUNK_STEPS = 1 << 18
FLUSH_CHUNKS = 2                    # buffer about this many chunks per feature before writing
APPEND_MODES = ("chunked", "episode")


class ArrayHeader(NamedTuple):
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class CompactionResult:
    generation: int
    appended: list[str]               # episode ids appended, in order
    skipped: list[str]                # staged ids already in the store (deleted)
    steps: int                        # steps appended
    seconds: float
    quarantined: list[str] = field(default_factory=list)   # staging files set aside (paths)
    removed_partial: list[str] = field(default_factory=list)   # abandoned partial writes deleted (paths)


@contextmanager
def store_lock(root: Path, timeout: float | None = None) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK_FILE, "a+") as f:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{root / LOCK_FILE}: another compaction holds the lock") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def read_headers(path: Path) -> tuple[dict[str, ArrayHeader], dict[str, Any]]:
    """Shapes and dtypes of a staging file's features, and its info, from its header alone."""
    feats, info = read_staged_header(path)
    return {k: ArrayHeader(shape, dtype) for k, (shape, dtype) in feats.items()}, info


def chunk_steps(spec_shape: tuple[int, ...], dtype: str) -> int:
    """Steps per chunk: the power of two nearest below ~2 MiB of rows, at most MAX_CHUNK_STEPS."""
    row = max(1, int(np.prod(spec_shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    n = max(1, TARGET_CHUNK_BYTES // row)
    return int(min(MAX_CHUNK_STEPS, 1 << int(np.floor(np.log2(n)))))


class _Appender:
    """Writes one feature's rows from ``pos`` on, in blocks that end on chunk boundaries, keeping its
    running stats and per-chunk CRCs (``data.integrity``) up to date with exactly the rows written."""

    def __init__(self, arr, pos: int, chunk: int, mode: str, stats: RunningStats | None, crcs: ChunkCrcs):
        self.arr, self.pos, self.chunk, self.mode, self.stats, self.crcs = arr, pos, chunk, mode, stats, crcs
        self.first_chunk = pos // chunk
        self.pending: list[np.ndarray] = []
        self.pending_n = 0

    def add(self, x: np.ndarray) -> None:
        if self.mode == "episode":
            self.arr.append(x, axis=0)   # resize + write per episode: the slow path, for the benchmark
            self.pos += len(x)
            self._account(x)
            return
        self.pending.append(x)
        self.pending_n += len(x)
        end = self.pos + self.pending_n
        if end - (self.pos // self.chunk) * self.chunk >= FLUSH_CHUNKS * self.chunk:
            self._write((end // self.chunk) * self.chunk)

    def finish(self) -> None:
        if self.pending_n:
            self._write(self.pos + self.pending_n)

    def _write(self, end: int) -> None:
        block = self.pending[0] if len(self.pending) == 1 else np.concatenate(self.pending)
        k = end - self.pos
        self.arr[self.pos:end] = block[:k]
        self._account(block[:k])
        rest = block[k:]
        self.pending, self.pending_n = ([rest], len(rest)) if len(rest) else ([], 0)
        self.pos = end

    def _account(self, x: np.ndarray) -> None:
        if self.stats is not None:
            self.stats.update(x)
        self.crcs.update(x)


def _fsync_tree(path: Path) -> None:
    """fsync every file under ``path`` (zarr's LocalStore renames atomically but does not fsync)."""
    if path.is_file():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        return
    if path.is_dir():
        for p in path.rglob("*"):
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())


def _fsync_written(root: Path, name: str, first_chunk: int, last_chunk: int) -> None:
    base = root / array_path(name)
    _fsync_tree(base / "zarr.json")
    for i in range(first_chunk, last_chunk + 1):
        _fsync_tree(base / "c" / str(i))


def _episode_row(features: Mapping[str, np.ndarray], info: Mapping[str, Any], start: int,
                 tasks: dict[str, list[str]], instructions: InstructionTable) -> dict[str, Any]:
    length = len(next(v for k, v in features.items() if not is_image(k)))
    success = bool(info.get("success", False))
    if "terminated" in features:
        terminated = bool(features["terminated"][-1])
    else:
        terminated = bool(info.get("terminated", False))
    if "return" in info:
        ret = float(info["return"])
    elif "rewards" in features:
        ret = float(np.sum(features["rewards"], dtype=np.float64))
    else:
        ret = float("nan")
    # the collector's own command summary wins; else the mean of the stored joystick commands
    if all(k in info for k in ("cmd_vx", "cmd_vy", "cmd_wz")):
        cmd = [info["cmd_vx"], info["cmd_vy"], info["cmd_wz"]]
    elif "commands" in features:
        cmd = np.asarray(features["commands"][:, :3], dtype=np.float64).mean(axis=0)
    else:
        cmd = [np.nan] * 3
    task = str(info.get("task", "locomotion"))
    task_instructions = tasks.setdefault(task, [])
    if info.get("instruction") is not None:
        if info["instruction"] not in task_instructions:
            task_instructions.append(str(info["instruction"]))
        instruction_index = task_instructions.index(info["instruction"])
    else:
        instruction_index = int(info.get("instruction_index", -1))
    known = {"success", "terminated", "return", "cmd_vx", "cmd_vy", "cmd_wz", "task", "instruction",
             "instruction_index", "failure_reason", "terrain_type", "terrain_level", "gait", "policy_id",
             "seed", "collector_id", "episode_id", "label", "length", "robot", "control_dt", "task_params",
             "instructions", "frame_stride"}
    return {
        "start": start, "end": start + length, "length": length, "success": success,
        "terminated": terminated, "return": ret,
        "cmd_vx": float(cmd[0]), "cmd_vy": float(cmd[1]), "cmd_wz": float(cmd[2]),
        "failure_reason": str(info.get("failure_reason", "none" if success else "unknown")),
        "terrain_type": str(info.get("terrain_type", "")), "terrain_level": int(info.get("terrain_level", -1)),
        "task": task, "instruction_index": instruction_index, "gait": str(info.get("gait", "")),
        "policy_id": str(info.get("policy_id", "")), "seed": int(info.get("seed", -1)),
        "collector_id": str(info["collector_id"]), "episode_id": str(info["episode_id"]),
        "label": dict(info.get("label", {})),
        "extra": {k: v for k, v in info.items() if k not in known},
        "instruction_id": instructions.episode_id(info),
        "task_params": dict(info.get("task_params") or {}),
    }


def _create_arrays(group, schema: StoreSchema) -> None:
    from zarr.codecs import BloscCodec, BloscShuffle, Crc32cCodec
    for name, spec in schema.features.items():
        chunk = image_chunk_frames(spec.shape, spec.dtype) if is_image(name) else chunk_steps(spec.shape, spec.dtype)
        # bit shuffle for multi-byte numbers (sign/exponent/high mantissa bits of smooth signals repeat);
        # single-byte bools and pixels are left as they are
        shuffle = BloscShuffle.bitshuffle if np.dtype(spec.dtype).itemsize > 1 else BloscShuffle.noshuffle
        group.create_array(array_path(name), shape=(0,) + spec.shape, dtype=spec.dtype,
                           chunks=(chunk,) + spec.shape,
                           # the CRC32C after the compressor: zarr refuses a chunk with flipped bytes on read
                           compressors=[BloscCodec(cname="zstd", clevel=3, shuffle=shuffle), Crc32cCodec()],
                           fill_value=0, overwrite=True, dimension_names=("time",) + (None,) * len(spec.shape))


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    write_json_atomic(root / MANIFEST, manifest)


class Unmergeable(ValueError):
    """A staging file that cannot join this store (damaged, or another schema/robot/rate)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(reason)
        self.path = path


def compact(store_path: str | Path, *, lock_timeout: float | None = None,
            append_mode: str = "chunked", progress: bool = False) -> CompactionResult:
    """Append every staged episode to the store; returns what was done.

    A staging file that cannot be merged (damaged, or written for another schema, robot or control
    rate) is moved to ``<store>/quarantine/`` with a ``.reason.txt`` beside it and the compaction
    starts over without it: it never blocks the store. ``validate`` and ``info`` report quarantined
    files; ``CompactionResult.quarantined`` lists them. Partial writes no live writer owns are removed
    (``CompactionResult.removed_partial``). A write the disk refuses (full, quota, I/O) is a ``JobFailed``
    naming the store: nothing was committed, the previous generation and the staged episodes are intact.
    ``progress``: a bar (stderr, on a terminal) over the staged episodes appended (``dataset compact``; a
    collection's own compactions stay quiet under its progress line).
    """
    import zarr
    if append_mode not in APPEND_MODES:
        raise ValueError(f"append_mode={append_mode!r}; allowed: {APPEND_MODES}")
    root = existing_store_dir(store_path)
    if not is_store_dir(root):   # before the lock file is made: compacting a folder never turns it into a "store"
        held = f"it holds {listing(root)}" if any(root.iterdir()) else "it is empty"
        raise ValueError(f"--store {root}: not a trajectory store (no manifest.json, no staged episodes; {held}); "
                         f"give a store's folder (one `quadforge collect` or `dataset import-hdf5` made)")
    t0 = time.perf_counter()
    quarantined: list[str] = []
    # every chunk is written, even all-fill ones, so a lost chunk is never mistaken for zeros
    with store_lock(root, lock_timeout), zarr.config.set({"array.write_empty_chunks": True}):
        removed = [str(p) for p in remove_partial_writes(abandoned_partial_writes(root))]
        while True:
            try:
                result = _compact_locked(root, append_mode, t0, progress)
            except Unmergeable as bad:
                # nothing was committed (the manifest is written last): set the file aside, start over
                quarantined.append(str(quarantine_staged(root, bad.path, str(bad))))
                continue
            except OSError as err:
                if is_write_failure(err):
                    raise _write_failed(root, err) from err
                raise
            result.quarantined, result.removed_partial = quarantined, removed
            return result


def _write_failed(root: Path, err: OSError) -> JobFailed:
    """The one line for a compaction the disk stopped: what failed, what is intact, how to finish."""
    try:
        m = read_manifest(root)
        committed = f"generation {m['generation']} ({m['num_episodes']} episodes) is intact"
    except (OSError, ValueError):
        committed = "the store has no committed generation yet"
    return JobFailed(f"{root}: compaction failed: {os_reason(err)}; nothing was committed: {committed} and the "
                     f"{len(list_staged(root))} staged episode(s) are kept; free space and run "
                     f"`quadforge dataset compact --store {root}` (or rerun the collection) to finish")


def _check_integrity_start(root: Path, manifest: dict[str, Any], schema: StoreSchema, group) -> dict[str, list[int]]:
    """The committed chunk CRCs per feature; recorded now (one full read) for a store that predates them."""
    recorded = manifest.get("checksums") or {}
    out: dict[str, list[int]] = {}
    for name in schema.features:
        n0 = int(manifest["lengths"].get(name, 0))
        if name in recorded:
            out[name] = [int(c) for c in recorded[name]]
            continue
        arr = group[array_path(name)]
        chunk = arr.chunks[0]
        crcs: list[int] = []
        step = chunk * max(1, (64 << 20) // max(1, chunk * int(np.prod(arr.shape[1:], dtype=np.int64))
                                                  * arr.dtype.itemsize))
        for lo in range(0, n0, step):
            crcs += chunk_crcs(np.asarray(arr[lo:min(n0, lo + step)]), chunk)
        out[name] = crcs
    return out


@dataclass
class _Committed:
    """The store as its manifest commits it (a fresh store: generation 0, nothing else)."""
    fresh: bool
    manifest: dict[str, Any]
    schema: StoreSchema | None
    segments: list[dict[str, Any]]   # the episode table's committed segments
    last: EpisodeTable               # the last segment's rows (the newest episodes)
    tasks: dict[str, list[str]]
    instructions: InstructionTable


def _read_committed(root: Path) -> _Committed:
    if not (root / MANIFEST).is_file():
        manifest = {"format_version": FORMAT_VERSION, "generation": 0, "num_steps": 0,
                    "num_episodes": 0, "lengths": {}, "stats": {}}
        return _Committed(True, manifest, None, [], EpisodeTable.from_rows([]), {}, InstructionTable())
    manifest = read_manifest(root)
    schema = read_schema(root)
    segments = committed_segments(manifest)
    last = read_segment(root, segments[-1]) if segments else EpisodeTable.from_rows([])
    tasks = read_tasks(root, required=bool(manifest.get("meta")))
    # appending to a store whose committed metadata or chunks are damaged would bury the damage (a damaged
    # segment this compaction does not read stays as it is, under its digest, for readers to report)
    verify_metadata(root, manifest, schema, tasks)
    TrajectoryStore(root, manifest, schema, last, tasks)._check_arrays()
    counts = manifest.get("meta", {}).get("tasks_counts")
    if counts is not None:   # instructions beyond the committed ones are leftovers of a crash
        # in the manifest's order: a set's order is the process's string hashing, and tasks.json's bytes follow it
        tasks = {t: list(tasks.get(t, []))[:int(counts[t])] for t in counts}
    instructions = InstructionTable(read_instructions(root, manifest))   # the committed entries only
    return _Committed(False, manifest, schema, segments, last, tasks, instructions)


_Header = tuple[Path, dict[str, ArrayHeader], dict[str, Any]]


def _checked_headers(todo: list[Path], schema: StoreSchema | None) -> tuple[list[_Header], StoreSchema]:
    """Step 3: every staging file's header against the schema (a fresh store's comes from the first file),
    before the first write; a file that cannot join is ``Unmergeable``."""
    headers = []
    for p in todo:
        try:
            headers.append((p, *read_headers(p)))
        except ValueError as err:
            raise Unmergeable(p, str(err)) from err
    if schema is None:
        p0, h0, info0 = headers[0]
        try:
            stride0 = frame_stride_of(info0, f"staging file {p0}")
            specs = {n: spec_for(n, np.empty((0,) + h.shape[1:], h.dtype), f"staging file {p0}", stride0)
                     for n, h in h0.items()}
        except ValueError as err:
            raise Unmergeable(p0, str(err)) from err
        schema = StoreSchema(specs, robot=str(info0.get("robot", "")),
                             control_dt=float(info0.get("control_dt", 0.02)))
    for p, h, info in headers:
        problem = staging_mismatch(schema, h, info, f"staging file {p}")
        if problem:
            raise Unmergeable(p, problem)
    return headers, schema


def _open_appenders(root: Path, state: _Committed, schema: StoreSchema, headers: list[_Header],
                    append_mode: str) -> dict[str, _Appender]:
    """Step 1: every array at its trusted length (truncating leftovers of an interrupted compaction),
    sized for the rows to come, with its running stats and chunk CRCs."""
    import zarr
    group = zarr.open_group(str(root), mode="a", zarr_format=3)
    if state.fresh:
        write_json_atomic(root / SCHEMA_FILE, schema.to_dict())
        _create_arrays(group, schema)
    committed_crcs = {} if state.fresh else _check_integrity_start(root, state.manifest, schema, group)
    arrays, crcs_of = {}, {}
    for name in schema.features:   # every check before any resize: a refused append changes nothing
        arrays[name] = arr = group[array_path(name)]
        n0 = int(state.manifest["lengths"].get(name, 0))
        crcs_of[name] = ChunkCrcs(arr.chunks[0], committed_crcs.get(name, []), n0)
        _check_partial_chunk(root, name, arr, crcs_of[name])
    appenders: dict[str, _Appender] = {}
    for name, spec in schema.features.items():
        arr, crcs = arrays[name], crcs_of[name]
        n0 = crcs.n
        if arr.shape[0] != n0:
            arr.resize((n0,) + spec.shape)
        if append_mode == "chunked":   # rows to come: steps, or frames for images
            arr.resize((n0 + sum(h[name].shape[0] for _, h, _ in headers),) + spec.shape)
        stats = None
        if not is_image(name):
            stats = (RunningStats.from_dict(state.manifest["stats"][name]) if name in state.manifest["stats"]
                     else RunningStats.empty(spec.shape))
        appenders[name] = _Appender(arr, n0, arr.chunks[0], append_mode, stats, crcs)
    return appenders


def _check_partial_chunk(root: Path, name: str, arr, crcs: ChunkCrcs) -> None:
    """The committed rows of the last chunk, which the append reads back and rewrites, against their recorded
    CRC: appending to a damaged chunk would hide the damage under a new generation's checksums."""
    n0, chunk = crcs.n, crcs.chunk
    lo = (n0 // chunk) * chunk
    if lo == n0:   # the committed rows end on a chunk boundary: the append starts a new chunk
        return
    where = f"{root}: {name!r} chunk {n0 // chunk} (rows {lo}-{n0 - 1})"
    try:
        rows = np.asarray(arr[lo:n0])
    except Exception as err:   # the codec's checksum, or a chunk file that does not decode
        raise ValueError(f"{where} does not read back ({type(err).__name__}: {err}); appending rewrites that chunk, "
                         f"so nothing was appended (the staged episodes stay staged): `quadforge dataset validate "
                         f"--store {root}` lists the damage") from err
    if crc_rows(rows) != crcs.crcs[-1]:
        raise ValueError(f"{where} differs from its recorded checksum; appending rewrites that chunk, so nothing "
                         f"was appended (the staged episodes stay staged): `quadforge dataset validate --store "
                         f"{root}` lists the damage")


def _append_episodes(headers: list[_Header], appenders: dict[str, _Appender], schema: StoreSchema,
                     state: _Committed, progress: bool = False) -> list[dict[str, Any]]:
    """Step 4: each staged episode's features through the appenders (buffered); its episode-table row."""
    rows = []
    pos = int(state.manifest["num_steps"])
    with progress_bar(len(headers), desc="compact", unit="episode", enabled=progress) as bar:
        for p, _, _ in headers:
            try:
                features, info = read_staged(p)
                # the header promised this; check the data really agrees before appending it
                schema.check(features, where=f"staging file {p}")
                if "instruction" in features:   # the collector's instruction numbering -> the store's
                    features = {**features, "instruction": state.instructions.remap(features["instruction"], info,
                                                                                    f"staging file {p}")}
            except ValueError as err:
                raise Unmergeable(p, str(err)) from err
            for name, app in appenders.items():
                app.add(features[name])
            rows.append(_episode_row(features, info, pos, state.tasks, state.instructions))
            pos += rows[-1]["length"]
            bar.update()
    for app in appenders.values():
        app.finish()
    return rows


def _write_tables(root: Path, appenders: dict[str, _Appender], added: EpisodeTable,
                  state: _Committed) -> list[dict[str, Any]]:
    """Step 5: the written chunks fsynced, then the episode table's new segment, the tasks and instruction
    tables (not yet committed: the manifest's segments, digests and counts decide what a reader trusts).
    Returns the table's segments as the new manifest lists them."""
    for name, app in appenders.items():
        _fsync_written(root, name, app.first_chunk, max(app.pos - 1, 0) // app.chunk)
    segments = _write_segment(root, state, added)
    write_json_atomic(root / TASKS_FILE, {"tasks": state.tasks})
    if len(state.instructions):
        write_json_atomic(root / INSTRUCTIONS_FILE, {"instructions": state.instructions.texts})
    return segments


def _write_segment(root: Path, state: _Committed, added: EpisodeTable) -> list[dict[str, Any]]:
    """The new rows as one segment, merged with the trailing segments ``merge_start`` picks (each read and
    checked against its digest first), named after the generation this compaction commits."""
    i = merge_start([int(s["rows"]) for s in state.segments], len(added))
    merged = [read_segment(root, s) for s in state.segments[i:-1]] + ([state.last] if i < len(state.segments) else [])
    table = EpisodeTable.joined(merged + [added])
    data, digest = encode_segment(table)
    name = segment_file(int(state.manifest["generation"]) + 1)
    write_bytes_atomic(root / name, data)
    return state.segments[:i] + [{"file": name, "rows": len(table), "sha256": digest}]


def _new_manifest(root: Path, state: _Committed, schema: StoreSchema, appenders: dict[str, _Appender],
                  num_steps: int, segments: list[dict[str, Any]]) -> dict[str, Any]:
    """Step 6's record: generation + 1, lengths, stats, chunk CRCs, the episode table's segments and the
    digests of all metadata."""
    tasks, instructions = state.tasks, state.instructions
    manifest = {
        "format_version": FORMAT_VERSION, "generation": int(state.manifest["generation"]) + 1,
        "num_steps": num_steps, "num_episodes": sum(int(s["rows"]) for s in segments), SEGMENTS_KEY: segments,
        "lengths": {name: app.pos for name, app in appenders.items()},
        "stats": {name: app.stats.to_dict() for name, app in appenders.items() if app.stats is not None},
        "chunks": {name: app.chunk for name, app in appenders.items()},
        "num_instructions": len(instructions),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "integrity": INTEGRITY_VERSION,
        "checksums": {name: app.crcs.crcs for name, app in appenders.items()},
        "meta": {"schema": canonical_digest(schema.to_dict()),
                 "tasks_counts": tasks_counts(tasks), "tasks": tasks_digest(tasks, tasks_counts(tasks)),
                 "instructions": canonical_digest(instructions.texts),
                 "arrays": {name: array_meta_digest(read_array_meta(root / array_path(name)))
                            for name in appenders}},
    }
    manifest[DIGEST_KEY] = manifest_digest(manifest)
    return manifest


def _compact_locked(root: Path, append_mode: str, t0: float, progress: bool = False) -> CompactionResult:
    """The numbered steps of the module docstring, under the store's lock."""
    state = _read_committed(root)
    known = set(state.last["episode_id"].tolist())
    staged = list_staged(root)
    skipped = [p for p in staged if episode_id_of(p) in known]
    todo = [p for p in staged if episode_id_of(p) not in known]
    if not todo:
        _delete(skipped, root)
        return CompactionResult(int(state.manifest["generation"]), [], [episode_id_of(p) for p in skipped], 0,
                                time.perf_counter() - t0)
    headers, schema = _checked_headers(todo, state.schema)
    appenders = _open_appenders(root, state, schema, headers, append_mode)
    rows = _append_episodes(headers, appenders, schema, state, progress)
    start = int(state.manifest["num_steps"])
    end = start + sum(r["length"] for r in rows)
    added = EpisodeTable.from_rows(rows)
    segments = _write_tables(root, appenders, added, state)
    manifest = _new_manifest(root, state, schema, appenders, end, segments)
    write_manifest(root, manifest)   # 6. the commit point
    _delete(todo + skipped, root)    # 7. the staged copies are now redundant, and so are merged segments
    _delete([root / f for f in sorted(segment_files_on_disk(root) - {s["file"] for s in segments})], root)
    return CompactionResult(manifest["generation"], [r["episode_id"] for r in rows],
                            [episode_id_of(p) for p in skipped], end - start, time.perf_counter() - t0)


def staging_mismatch(schema: StoreSchema, headers: Mapping[str, ArrayHeader], info: Mapping[str, Any],
                     where: str) -> str | None:
    """Why a staged episode (headers + info) cannot join a store of ``schema``, or None."""
    try:
        schema.check(headers, where=where)
    except ValueError as err:
        return str(err)
    problem = info_type_problem(info, where)   # a staging file written by other code than the writer
    if problem:
        return problem
    if info.get("robot") and schema.robot and str(info["robot"]) != schema.robot:
        return f"{where}: robot {info['robot']!r}, the store holds {schema.robot!r} (one robot per store)"
    try:
        if "control_dt" in info and abs(float(info["control_dt"]) - schema.control_dt) > 1e-9:
            return f"{where}: control_dt {info['control_dt']}, the store's is {schema.control_dt}"
    except (TypeError, ValueError):
        return f"{where}: control_dt {info.get('control_dt')!r} is not a number"
    try:   # one image rate per store; T steps per feature and ceil(T / stride) frames per image
        schema.check_stride(info, where)
        episode_length({k: hh.shape[0] if hh.shape else -1 for k, hh in headers.items()},
                       frame_stride_of(info, where), where)
    except ValueError as err:
        return str(err)
    return None


def _delete(paths: list[Path], root: Path) -> None:
    for p in paths:
        p.unlink(missing_ok=True)
    for folder in sorted({p.parent for p in paths}):
        fsync_dir(folder)
