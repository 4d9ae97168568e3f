"""The episode table: one row per episode, held as numpy columns, stored as append-only segments.

On disk (format 2, what this code writes) the table is a list of *segments*: each
``meta/episodes/<generation:08d>.json`` holds consecutive rows as columnar JSON (``{"columns": {name:
[...]}}``), and the manifest lists them in order under ``episode_segments`` as ``{"file", "rows",
"sha256"}`` (the digest of the file's bytes: a segment is written once, whole, and never changed). A
compaction writes one segment, named after the generation it commits: its new rows, merged with the
trailing segments shorter than ``MERGE_RATIO`` times the merged rows. Segment sizes then at least double
along the list, so a table of E episodes compacted k at a time has at most about log2(E / k) + 1
segments and each row is rewritten about log2(E / k) times over the store's life; before, every
compaction read, verified and rewrote the whole table (about 60 ms per 1,000 episodes, so a collection's
compactions cost grew with the square of its size). A segment a merge replaced is deleted after the
commit; a reader that read the manifest before that reads it again (``SegmentMissing``).

Opening a store reads only the typed columns: a format-2 segment's dict columns (``DICT_COLUMNS``: the
label, the collector's extras, the task parameters; two thirds of its bytes and nearly all of its decoding)
stay in the segment file, mapped read-only, until something reads one (``DeferredColumn``); that read
checks the file against its digest again and decodes them. Training reads none of them, so a table opens
in about a quarter of the time and holds a sixth of the heap (``bench store``'s "opening the episode
table" rows). The map holds the file's inode: a compaction that merges the segment away after the open
leaves the text readable.

Format 1 (stores written before): the whole table in ``meta/episodes.json``, its digest of the committed
rows' values (``integrity.table_digest``; the file may hold a crash's extra rows after them), when the
store has digests, under the manifest's ``meta.episodes``. It reads as the first and only segment,
``{"file", "rows", "digest"}``, and the next compaction appends a segment after it (the file is
rewritten, as a format-2 segment, only when a merge reaches it).
"""
from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from quadforge.data.deferred_column import DeferredColumn, object_array
from quadforge.data.integrity import file_digest, table_digest

INT_COLUMNS = ("start", "end", "length", "terrain_level", "instruction_index", "seed", "instruction_id")
BOOL_COLUMNS = ("success", "terminated")
FLOAT_COLUMNS = ("return", "cmd_vx", "cmd_vy", "cmd_wz")
STR_COLUMNS = ("failure_reason", "terrain_type", "task", "gait", "policy_id", "collector_id", "episode_id")
DICT_COLUMNS = ("label", "extra", "task_params")
COLUMNS = INT_COLUMNS + BOOL_COLUMNS + FLOAT_COLUMNS + STR_COLUMNS + DICT_COLUMNS
# columns added after stores were first written: a table without them reads with these values
LATER_COLUMNS = {"instruction_id": -1, "task_params": {}}

LEGACY_FILE = "meta/episodes.json"     # format 1: the whole table in one file
SEGMENT_DIR = "meta/episodes"          # format 2: one file per segment
SEGMENTS_KEY = "episode_segments"      # the manifest's list of segments
MERGE_RATIO = 2


class _SegmentDicts:
    """One segment's dict columns, left in the segment file's bytes until first read: ``data[start:stop]`` is
    the object of columns but for its opening brace (``"label": [...], "extra": [...], ...}``). ``data`` is
    a read-only map of the file, so the text costs no RAM until read (its pages are handed back after the
    open, and come back from the page cache) and stays readable after a compaction deletes the file (the
    map holds its inode). The first read of any of the columns checks the file against ``sha256`` (the
    manifest's digest, as at open), decodes all of them, and drops the map."""

    def __init__(self, data: bytes | mmap.mmap, start: int, stop: int, rows: int, source: str,
                 sha256: str | None = None):
        self.data, self.start, self.stop = data, int(start), int(stop)
        self.rows, self.source, self.sha256 = int(rows), source, sha256
        self.columns: dict[str, np.ndarray] | None = None

    @property
    def decoded(self) -> bool:
        return self.columns is not None

    def column(self, name: str) -> np.ndarray:
        if self.columns is None:
            data = self.data
            if data is not None:   # else another thread decoded it meanwhile: it sets ``columns`` before it drops the map
                if self.sha256 is not None and file_digest(data) != self.sha256:
                    raise ValueError(f"{self.source}: the episode table segment changed since the store was opened "
                                     f"(its digest differs; a compaction never rewrites a segment in place): open the "
                                     f"store again, and run `quadforge dataset validate`")
                self.columns = _decode_dict_columns(b"{" + data[self.start:self.stop], self.rows, self.source)
                self.data = None
        return self.columns[name]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if isinstance(state["data"], mmap.mmap):   # a map does not pickle: its bytes travel instead
            state["data"] = state["data"][:]
        return state


def _decode_dict_columns(text: bytes, rows: int, source: str) -> dict[str, np.ndarray]:
    try:
        cols = json.loads(text)
        if not isinstance(cols, dict):
            raise TypeError(f"a {type(cols).__name__}, not an object of columns")
        lists = {c: cols[c] if c in cols else [LATER_COLUMNS[c]] * rows for c in DICT_COLUMNS}
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{source}: corrupt episode table ({type(err).__name__}: {err})") from err
    short = [f"{c} has {len(v)}" for c, v in lists.items() if not isinstance(v, list) or len(v) != rows]
    if short:
        raise ValueError(f"{source}: corrupt episode table: {rows} rows, but {', '.join(short)}")
    return {c: object_array(v) for c, v in lists.items()}


@dataclass
class EpisodeTable:
    """One row per episode, held as columns (numpy arrays); see ``COLUMNS``."""

    data: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.data["end"]) if "end" in self.data else 0

    def __getitem__(self, column: str) -> np.ndarray:
        if column not in self.data:
            raise KeyError(f"episode table has no column {column!r}; columns: {list(self.data)}")
        return self.data[column]

    def __contains__(self, column: str) -> bool:
        return column in self.data

    def columns(self) -> dict[str, np.ndarray]:
        return dict(self.data)

    def row(self, i: int) -> dict[str, Any]:
        return {k: (v[i].item() if isinstance(v[i], np.generic) else v[i]) for k, v in self.data.items()}

    def select(self, filters: Mapping[str, Any] | None = None) -> np.ndarray:
        """Indices of the episodes passing the sampler filters (``data.episodes.FILTER_KEYS``)."""
        from quadforge.data.episodes import filter_episodes
        return filter_episodes(self.data, np.arange(len(self)), filters)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> "EpisodeTable":
        rows = list(rows)
        return cls.from_lists({c: [r[c] for r in rows] for c in COLUMNS})

    @classmethod
    def from_lists(cls, cols: Mapping[str, list], dicts: _SegmentDicts | None = None) -> "EpisodeTable":
        """The table of columns of plain values; with ``dicts``, the dict columns are read from there (when
        first read) instead of ``cols``."""
        out: dict[str, Any] = {}
        rows = len(cols.get("end", []))
        for c in COLUMNS:
            if dicts is not None and c in DICT_COLUMNS:
                out[c] = DeferredColumn(c, (dicts,))
                continue
            if c not in cols and c in LATER_COLUMNS:
                values = [LATER_COLUMNS[c]] * rows
            else:
                values = list(cols.get(c, []))
            if c in INT_COLUMNS:
                out[c] = np.asarray(values, dtype=np.int64)
            elif c in BOOL_COLUMNS:
                out[c] = np.asarray(values, dtype=bool)
            elif c in FLOAT_COLUMNS:
                out[c] = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
            elif c in STR_COLUMNS:
                # numpy's str conversion is str()'s (None -> "None"), without a Python list of copies
                out[c] = np.asarray(values, dtype=str) if values else np.zeros(0, dtype="<U1")
            else:
                out[c] = object_array(values)
        return cls(out)

    def decode(self) -> "EpisodeTable":
        """Decode every deferred dict column now (the validator: a damaged one is reported at once, not met
        by whatever reads it later); raises ValueError naming the segment file."""
        for c in DICT_COLUMNS:
            if isinstance(self.data.get(c), DeferredColumn):
                self.data[c].values()
        return self

    def head(self, n: int) -> "EpisodeTable":
        if n >= len(self):   # as it is: a deferred column stays undecoded
            return self
        return EpisodeTable({k: v[:n] for k, v in self.data.items()})

    def to_lists(self) -> dict[str, list]:
        """Columns of plain Python values (numpy's ``tolist`` for typed columns: one C call, not an
        ``item()`` per value)."""
        return {c: _plain(self.data[c]) for c in COLUMNS}

    @staticmethod
    def joined(tables: "Sequence[EpisodeTable]") -> "EpisodeTable":
        """The tables' rows one after the other: the table ``from_lists`` makes of all of them."""
        if len(tables) == 1:
            return tables[0]
        if not tables:
            return EpisodeTable.from_rows([])
        return EpisodeTable({c: joined_column([t.data[c] for t in tables]) for c in COLUMNS})


def joined_column(parts: Sequence[Any]) -> Any:
    """Columns' rows one after the other: deferred columns stay deferred, anything else is concatenated."""
    if parts and all(isinstance(p, DeferredColumn) for p in parts):
        return DeferredColumn.joined(parts)
    return np.concatenate([np.asarray(p) for p in parts])


def _plain(column: Any) -> list:
    if isinstance(column, DeferredColumn):
        column = column.values()
    if column.dtype != object:
        return column.tolist()
    return [x.item() if isinstance(x, np.generic) else x for x in column]


# --- segments ---------------------------------------------------------------------------------------
class SegmentMissing(FileNotFoundError):
    """A segment the manifest lists is gone: damage, or a compaction merged it away after this reader
    read the manifest (then the manifest on disk is newer; read it again)."""


def segment_file(generation: int) -> str:
    """The segment a compaction committing ``generation`` writes, relative to the store's root."""
    return f"{SEGMENT_DIR}/{generation:08d}.json"


def committed_segments(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The manifest's segments in order; a format-1 store's whole-table file as its only segment."""
    if SEGMENTS_KEY in manifest:
        return [dict(s) for s in manifest[SEGMENTS_KEY]]
    n = int(manifest["num_episodes"])
    digest = (manifest.get("meta") or {}).get("episodes")
    return [{"file": LEGACY_FILE, "rows": n, "digest": digest}] if n or digest else []


def read_segment(root: Path, segment: Mapping[str, Any], damaged: list[str] | None = None,
                 defer_dicts: bool = True) -> EpisodeTable:
    """A segment's committed rows, checked against its digest: a mismatch raises, or with ``damaged`` given
    (the validator) is appended there and the rows returned all the same. With ``defer_dicts`` a format-2
    segment's dict columns are left undecoded until read (``DeferredColumn``)."""
    path = root / str(segment["file"])
    legacy = "sha256" not in segment            # format 1: the committed rows, then maybe a crash's
    defer_dicts = defer_dicts and not legacy    # format 1's digest is over its values: every one is read
    try:
        data = _map_file(path) if defer_dicts else path.read_bytes()
    except FileNotFoundError:
        raise SegmentMissing(f"{path}: missing episode table segment (the manifest lists it, {segment['rows']} "
                             f"rows)") from None
    differs = not legacy and file_digest(data) != segment["sha256"]
    try:
        # a damaged segment (the validator reads on) is decoded whole, now
        table = _parse_segment(data, str(path), defer_dicts and not differs, segment.get("sha256"))
    except (KeyError, TypeError, ValueError) as err:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path}: corrupt episode table ({type(err).__name__}: {err})") from err
    rows = int(segment["rows"])
    short = len(table) < rows if legacy else len(table) != rows
    if short or any(len(v) != len(table) for v in table.data.values()):
        raise ValueError(f"{path}: episode table has {len(table)} complete rows, the manifest says {rows}")
    table = table.head(rows)
    if legacy and segment.get("digest") is not None:
        differs = segment["digest"] != table_digest(table.to_lists())
    if differs:
        problem = f"{path}: episode table differs from the one the manifest committed (damaged)"
        if damaged is None:
            raise ValueError(problem)
        damaged.append(problem)
    return table


# Where a segment's dict columns begin: encode_segment writes the columns in COLUMNS order, the dict columns
# last, with json's default separators. The text cannot occur earlier: a string value holds its quotes
# escaped, and no typed column holds an object whose keys it could be.
_DICT_COLUMNS_BEGIN = f', "{DICT_COLUMNS[0]}": ['.encode()
_SEGMENT_END = b"]}}"


def _map_file(path: Path) -> bytes | mmap.mmap:
    """A read-only map of the file (its bytes when it is empty: an empty file cannot be mapped)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _parse_segment(data: bytes | mmap.mmap, source: str, defer_dicts: bool, sha256: str | None = None
                   ) -> EpisodeTable:
    """A segment file's table; with ``defer_dicts`` its typed columns parsed and its dict columns left in
    ``data`` (any other layout - a file not written by ``encode_segment`` - is parsed whole)."""
    laid_out = defer_dicts and data[-len(_SEGMENT_END):] == _SEGMENT_END
    cut = data.find(_DICT_COLUMNS_BEGIN) if laid_out else -1
    if cut < 0:
        return EpisodeTable.from_lists(json.loads(data[:])["columns"])
    typed = json.loads(data[:cut] + b"}}")["columns"]
    if any(c in typed for c in DICT_COLUMNS):
        return EpisodeTable.from_lists(json.loads(data[:])["columns"])
    dicts = _SegmentDicts(data, cut + 2, len(data) - 1, len(typed.get("end", [])), source, sha256)
    if isinstance(data, mmap.mmap):   # the pages the open read go back to the page cache until the text is read
        data.madvise(mmap.MADV_DONTNEED)
    return EpisodeTable.from_lists(typed, dicts)


def read_table(root: Path, manifest: Mapping[str, Any], damaged: list[str] | None = None,
               defer_dicts: bool = True) -> EpisodeTable:
    """The committed episode table: the manifest's segments, each checked, one after the other (dict columns
    deferred as ``read_segment`` says)."""
    table = EpisodeTable.joined([read_segment(root, s, damaged, defer_dicts) for s in committed_segments(manifest)])
    if len(table) != int(manifest["num_episodes"]):
        raise ValueError(f"{root / 'manifest.json'}: its episode table segments hold {len(table)} rows, it says "
                         f"{manifest['num_episodes']} episodes")
    return table


def encode_segment(table: EpisodeTable) -> tuple[bytes, str]:
    """A segment file's bytes and their digest (json.dumps, not json.dump: dump streams through the
    encoder's pure-Python path, ~3x slower on a large table)."""
    data = json.dumps({"columns": table.to_lists()}).encode()
    return data, file_digest(data)


def merge_start(segment_rows: Sequence[int], new_rows: int) -> int:
    """Index of the first segment a compaction adding ``new_rows`` merges into its own: trailing segments
    while each is shorter than ``MERGE_RATIO`` times the rows merged after it."""
    i, merged = len(segment_rows), new_rows
    while i > 0 and segment_rows[i - 1] < MERGE_RATIO * merged:
        i -= 1
        merged += segment_rows[i]
    return i


def segment_files_on_disk(root: Path) -> set[str]:
    """Every segment file present (relative to ``root``), the format-1 table included: what a compaction
    deletes of them is what its manifest no longer lists."""
    found = {LEGACY_FILE} if (root / LEGACY_FILE).is_file() else set()
    d = root / SEGMENT_DIR
    if d.is_dir():
        found |= {f"{SEGMENT_DIR}/{p.name}" for p in d.iterdir() if p.suffix == ".json" and not p.name.startswith(".")}
    return found
