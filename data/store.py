"""The read side of the zarr v3 trajectory store, and its on-disk layout.

```
<store>/
  zarr.json                   zarr v3 root group
  data/<feature>              per-step arrays concatenated along time, chunked along time only
  images/<camera>             camera frames (uint8 (F, H, W, C) or float32 depth (F, H, W)), every
                              `stride`-th step of each episode (see data/images.py), when present
  meta/schema.json            per-feature dtype, shape, names, units, stride; robot; control rate; version
  meta/episodes/<gen>.json    the episode table's segments, columnar JSON ({"columns": {name: [...]}}),
                              append-only (data/episode_table.py; a format-1 store: meta/episodes.json)
  meta/tasks.json             tasks and their instructions ({"tasks": {task: [instruction, ...]}})
  meta/instructions.json      the instruction table ({"instructions": [text, ...]}), append-only; the
                              per-step `instruction` feature and the `instruction_id` column index it
  manifest.json               the commit record: generation, steps, episodes, per-feature lengths
                              (frames for images), stats, num_instructions, the table's segments
  staging/<id>.episode       episodes written by collectors, not yet compacted
  .lock                       compaction's exclusive flock
```

Readers trust only ``manifest.json``: array rows beyond its per-feature lengths, episode-table segments
it does not list and instructions beyond ``num_instructions`` are leftovers of an interrupted compaction
and are ignored (the next compaction overwrites or deletes them). ``compact`` (in ``data.compaction``) is
the only writer.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from quadforge.data import integrity
from quadforge.data.episode_table import EpisodeTable, SegmentMissing, committed_segments, read_table
from quadforge.data.images import IMAGE_PREFIX, frame_starts, num_frames
from quadforge.data.json_files import read_json
from quadforge.data.schema import FORMAT_VERSION, READABLE_FORMATS, StoreSchema
from quadforge.data.staging import episode_id_of, list_staged
from quadforge.data.stats import RunningStats

MANIFEST = "manifest.json"
SCHEMA_FILE = "meta/schema.json"
TASKS_FILE = "meta/tasks.json"
INSTRUCTIONS_FILE = "meta/instructions.json"
MANIFEST_KEYS = ("format_version", "generation", "num_steps", "num_episodes", "lengths", "stats")
OPEN_ATTEMPTS = 3     # a compaction may merge away a segment between reading the manifest and the segment


def array_path(name: str) -> str:
    """Zarr path of a feature: images in their own group, everything else under data/."""
    return name if name.startswith(IMAGE_PREFIX) else f"data/{name}"


def read_instructions(root: Path, manifest: Mapping[str, Any]) -> list[str]:
    """The committed instruction table: the first ``manifest["num_instructions"]`` entries, checked
    against the manifest's digest of them when it has one."""
    n = int(manifest.get("num_instructions", 0))
    if n == 0:
        return []
    raw = read_json(root / INSTRUCTIONS_FILE, "instruction table")
    table = raw.get("instructions") if isinstance(raw, dict) else None
    if not isinstance(table, list) or len(table) < n or not all(isinstance(t, str) for t in table[:n]):
        raise ValueError(f"{root / INSTRUCTIONS_FILE}: corrupt instruction table (want a list of at least {n} "
                         f"strings under 'instructions')")
    texts = list(table[:n])
    digest = (manifest.get("meta") or {}).get("instructions")
    if digest is not None and digest != integrity.canonical_digest(texts):
        raise ValueError(f"{root / INSTRUCTIONS_FILE}: instruction table differs from the one the manifest "
                         f"committed (damaged)")
    return texts


def read_schema(root: Path) -> StoreSchema:
    raw = read_json(root / SCHEMA_FILE, "schema")
    try:
        return StoreSchema.from_dict(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{root / SCHEMA_FILE}: corrupt schema ({type(err).__name__}: {err})") from err


def missing_manifest_message(root: Path) -> str:
    """Why a directory without a manifest cannot be read, and the command that recovers when one does:
    staged episodes that were never compacted (a collection stopped before its first compaction)."""
    staged = len(list_staged(root)) if root.is_dir() else 0
    if staged:
        return (f"{root}: no manifest: {staged} staged episode(s), never compacted (a collection stopped before "
                f"its first compaction); nothing is lost: run `quadforge dataset compact --store {root}` to make them "
                f"readable (or rerun the collection to resume it)")
    return f"{root / MANIFEST}: missing manifest (not a trajectory store)"


def read_manifest(root: Path, verify: bool = True) -> dict[str, Any]:
    """The manifest, checked (keys, types, digest); ``verify=False`` skips the digest (the validator
    reports a mismatch as one problem among others instead of stopping there)."""
    path = root / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(missing_manifest_message(root))
    m = read_json(path, "manifest")
    missing = [k for k in MANIFEST_KEYS if not isinstance(m, dict) or k not in m]
    if missing:
        raise ValueError(f"{path}: corrupt manifest: missing keys {missing}")
    if m["format_version"] not in READABLE_FORMATS:
        raise ValueError(f"{path}: format_version {m['format_version']}; this code reads "
                         f"{' and '.join(map(str, READABLE_FORMATS))} (writes {FORMAT_VERSION})")
    if verify and integrity.DIGEST_KEY in m and m[integrity.DIGEST_KEY] != integrity.manifest_digest(m):
        raise ValueError(f"{path}: corrupt manifest (its digest does not match its content)")
    if "integrity" in m and integrity.DIGEST_KEY not in m:
        raise ValueError(f"{path}: corrupt manifest (integrity records without a digest)")
    try:
        ok = (isinstance(m["lengths"], dict) and isinstance(m["stats"], dict)
              and all(int(v) >= 0 for v in m["lengths"].values())
              and int(m["num_steps"]) >= 0 and int(m["num_episodes"]) >= 0 and int(m["generation"]) >= 0)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{path}: corrupt manifest (lengths, counts or stats of the wrong type)")
    return m


def read_tasks(root: Path, required: bool = False) -> dict[str, list[str]]:
    """The tasks table; a missing file reads as empty unless ``required`` (a store with integrity
    records always has one)."""
    if not (root / TASKS_FILE).exists() and not required:
        return {}
    raw = read_json(root / TASKS_FILE, "tasks table")
    tasks = raw.get("tasks", {}) if isinstance(raw, dict) else None
    if not isinstance(tasks, dict) or not all(isinstance(v, list) for v in tasks.values()):
        raise ValueError(f"{root / TASKS_FILE}: corrupt tasks table (expected {{'tasks': {{task: [instruction, ...]}}}})")
    return tasks


def verify_metadata(root: Path, manifest: Mapping[str, Any], schema: StoreSchema, tasks: Mapping[str, Any]) -> None:
    """Compare the committed metadata with the digests in the manifest (``data.integrity``); a store
    written before the digests existed passes (the validator notes it has none). The episode table's
    segments are checked as they are read (``episode_table.read_segment``)."""
    meta = manifest.get("meta")
    if not meta:
        return
    if meta.get("schema") != integrity.canonical_digest(schema.to_dict()):
        raise ValueError(f"{root / SCHEMA_FILE}: schema differs from the one the manifest committed (damaged)")
    counts = meta.get("tasks_counts") or {}
    if meta.get("tasks") != integrity.tasks_digest(tasks, counts):
        raise ValueError(f"{root / TASKS_FILE}: tasks table differs from the one the manifest committed (damaged)")
    for name, digest in (meta.get("arrays") or {}).items():
        where = root / array_path(name)
        if integrity.array_meta_digest(integrity.read_array_meta(where)) != digest:
            raise ValueError(f"{where / 'zarr.json'}: array metadata differs from what the manifest committed "
                             f"(damaged)")


def read_manifest_and_table(root: Path) -> tuple[dict[str, Any], EpisodeTable]:
    """The manifest and the episode table it commits. A segment missing because a compaction committed and
    merged it away meanwhile: the newer manifest is read and the table again."""
    manifest = read_manifest(root)
    for attempt in range(1, OPEN_ATTEMPTS + 1):
        try:
            return manifest, read_table(root, manifest)
        except SegmentMissing:
            newer = read_manifest(root)
            if attempt == OPEN_ATTEMPTS or newer["generation"] == manifest["generation"]:
                raise
            manifest = newer


def refuse_file_as_store(path: str | Path, flag: str = "") -> None:
    """A file where a store's folder belongs is its own error, not "no such store" (``flag``: how the
    user gave the path, e.g. "--store", put before it)."""
    if Path(path).is_file():
        where = f"{flag} {path}" if flag else str(path)
        raise ValueError(f"{where}: is a file, not a trajectory store folder; give the store's folder")


def existing_store_dir(path: str | Path) -> Path:
    """``path`` as an existing folder, or a one-line error saying what it is instead: the first check of
    every reader and of compaction."""
    root = Path(path)
    refuse_file_as_store(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such trajectory store directory")
    return root


class TrajectoryStore:
    """A read-only view of the store at its manifest's generation."""

    def __init__(self, root: Path, manifest: dict[str, Any], schema: StoreSchema, table: EpisodeTable,
                 tasks: dict[str, list[str]]):
        self.root, self.manifest, self.schema, self._table, self.tasks = root, manifest, schema, table, tasks
        self.instructions: list[str] = []     # the instruction table (per-step `instruction` indexes it)
        self._group = None

    # --- opening --------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> "TrajectoryStore":
        root = existing_store_dir(path)
        manifest, table = read_manifest_and_table(root)
        schema = read_schema(root)
        tasks = read_tasks(root, required=bool(manifest.get("meta")))
        verify_metadata(root, manifest, schema, tasks)
        store = cls(root, manifest, schema, table, tasks)
        store.instructions = read_instructions(root, manifest)
        store._check_arrays()
        return store

    def _check_arrays(self) -> None:
        """Every array present with the schema's dtype and shape, its manifest length on disk and, the
        cheap part of integrity, a file for every chunk under that length (one stat per chunk)."""
        lengths = self.manifest["lengths"]
        if set(lengths) != set(self.schema.features):
            raise ValueError(f"{self.root / MANIFEST}: manifest features {sorted(lengths)} disagree with "
                             f"the schema's {sorted(self.schema.features)}")
        group = self.group
        chunks = self.manifest.get("chunks") or {}
        for name, n in lengths.items():
            where = self.root / array_path(name)
            try:
                arr = group[array_path(name)]
                shape, dtype, chunk = tuple(arr.shape), np.dtype(arr.dtype), int(arr.chunks[0])
            except KeyError:
                raise ValueError(f"{where}: array missing (manifest lists {n} steps)") from None
            except Exception as err:  # zarr raises several types for damaged array metadata
                raise ValueError(f"{where}: unreadable array metadata ({type(err).__name__}: {err})") from err
            spec = self.schema.features[name]
            if shape[1:] != spec.shape or dtype != np.dtype(spec.dtype):
                raise ValueError(f"{where}: on disk {dtype}{shape[1:]}, the schema says {spec.dtype}{spec.shape}")
            if shape[0] < n:
                raise ValueError(f"{where}: truncated: {shape[0]} steps on disk, the manifest says {n}")
            if name in chunks and int(chunks[name]) != chunk:
                raise ValueError(f"{where}: chunks of {chunk} steps on disk, the manifest says {chunks[name]}")
            missing = integrity.missing_chunk_files(where, len(shape), int(n), chunk)
            if missing:
                raise ValueError(f"{where}: chunk(s) {missing[:10]} missing (zarr would read zeros); "
                                 f"run `quadforge dataset validate --store {self.root}`")

    @property
    def group(self):
        if self._group is None:
            import zarr
            try:
                self._group = zarr.open_group(str(self.root), mode="r", zarr_format=3)
            except Exception as err:  # zarr raises several types for a damaged group
                raise ValueError(f"{self.root}: cannot open zarr group ({err})") from err
        return self._group

    @staticmethod
    def existing_episode_ids(path: str | Path) -> set[str]:
        """Ids already compacted (per the manifest) or waiting in staging: never write these again."""
        root = Path(path)
        ids = {episode_id_of(p) for p in list_staged(root)}
        if (root / MANIFEST).is_file():
            ids.update(read_manifest_and_table(root)[1]["episode_id"].tolist())
        return ids

    # --- contents -------------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        return int(self.manifest["generation"])

    @property
    def num_steps(self) -> int:
        return int(self.manifest["num_steps"])

    @property
    def num_episodes(self) -> int:
        return int(self.manifest["num_episodes"])

    @property
    def episodes(self) -> EpisodeTable:
        return self._table

    @property
    def table_files(self) -> list[Path]:
        """The episode table's files, in row order (its segments: ``data.episode_table``)."""
        return [self.root / str(s["file"]) for s in committed_segments(self.manifest)]

    @property
    def episode_ids(self) -> list[str]:
        return self._table["episode_id"].tolist()

    @property
    def episode_ends(self) -> np.ndarray:
        return self._table["end"]

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.schema.features))

    # --- images: frames every `stride`-th step (data/images.py) ---------------------------------
    @property
    def image_features(self) -> tuple[str, ...]:
        return self.schema.image_features

    def frame_stride(self, name: str) -> int:
        self._check_feature(name)
        return self.schema.features[name].stride

    def frame_starts(self, name: str) -> np.ndarray:
        """(E,) row of each episode's first frame in the image array ``name``."""
        return frame_starts(self._table["length"], self.frame_stride(name))

    def frame_counts(self, name: str) -> np.ndarray:
        """(E,) frames per episode: ceil(length / stride)."""
        return num_frames(self._table["length"], self.frame_stride(name))

    def task_params(self, i: int) -> dict[str, Any]:
        """Episode i's task parameters (family, target, colours, slots, speed, gait, seed, ...)."""
        return dict(self._table["task_params"][i])

    def instruction_text(self, i: int) -> str | None:
        """Episode i's instruction from the instruction table (None when it has none)."""
        k = int(self._table["instruction_id"][i])
        return self.instructions[k] if 0 <= k < len(self.instructions) else None

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]]:
        """Per feature: count, mean, std, min, max (images have none)."""
        return {k: RunningStats.from_dict(v).summary() for k, v in self.manifest["stats"].items()}

    def array(self, name: str):
        """The on-disk zarr array of a feature (rows beyond ``num_steps`` are not part of the store)."""
        self._check_feature(name)
        return self.group[array_path(name)]

    def _check_feature(self, name: str) -> None:
        if name not in self.schema.features:
            raise ValueError(f"{self.root}: no feature {name!r}; the store has {list(self.feature_names)}")

    def load(self, features: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Read whole features into RAM (all features when ``features`` is None)."""
        names = list(self.feature_names if features is None else features)
        for name in names:
            self._check_feature(name)
        out = {}
        checksums = self.manifest.get("checksums") or {}
        for name in names:
            n = int(self.manifest["lengths"][name])
            where = self.root / array_path(name)
            try:
                arr = self.group[array_path(name)]
                out[name] = np.asarray(arr[:n])
            except Exception as err:  # a damaged chunk surfaces as a codec error from zarr/numcodecs
                raise ValueError(f"{where}: unreadable data ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0] if str(err) else ''})") from err
            if name in checksums:  # one CRC32C pass over the rows: never silently different data
                bad = integrity.bad_chunks(out[name], int(arr.chunks[0]), checksums[name])
                if bad:
                    raise ValueError(f"{where}: chunk(s) {bad[:10]} fail their checksum (damaged or swapped); "
                                     f"run `quadforge dataset validate --store {self.root}`")
        return out

    def __repr__(self) -> str:
        return (f"TrajectoryStore({str(self.root)!r}, generation={self.generation}, "
                f"episodes={self.num_episodes}, steps={self.num_steps})")

