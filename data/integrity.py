"""What the manifest records so that readers and the validator tell damaged data from good data.

Compaction records in the manifest, per feature, the CRC32C of every chunk's rows (the raw C-order
bytes of rows ``[i*chunk, min((i+1)*chunk, num_steps))``, computed from the data as it is appended,
never read back), digests of the metadata it commits (schema, the committed rows of the episode
table, the committed instructions of the tasks table, every array's ``zarr.json`` without its shape)
and a digest of the manifest itself. The CRCs cover the decoded rows, not the compressed files,
because an interrupted compaction legitimately rewrites the last, partly filled chunk with extra rows
beyond the committed length: the committed rows - and their CRC - stay the same. Arrays created by
this version also end every compressed chunk with zarr's ``Crc32cCodec``, so zarr itself refuses a
chunk with flipped bytes on any read (random windows read straight from disk included).

Costs (docs/data.md, "what the store guarantees"):
- ``TrajectoryStore.open``: the digests of the small metadata files and one ``stat`` per chunk (a
  missing chunk is an error before any data is read; zarr would return zeros);
- ``TrajectoryStore.load``: one CRC32C pass over the loaded rows (several GB/s) - a flipped, swapped,
  truncated or stale chunk is an error, never silently different data;
- ``quadforge dataset validate``: every chunk decoded and its CRC compared (all problems listed);
  ``--deep`` also checks the values (finite, stats).

A store written before this (no ``integrity`` key in its manifest) still opens and reads; the
validator notes that it has no checksums, and its next compaction records them for the rows already
there (one full read).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import google_crc32c
import numpy as np

INTEGRITY_VERSION = 1
DIGEST_KEY = "digest"          # the manifest's digest of itself


# --- digests of JSON metadata ----------------------------------------------------------------------
_CANONICAL = dict(sort_keys=True, separators=(",", ":"), allow_nan=True, default=str)


def canonical_digest(obj: Any) -> str:
    """sha256 of a JSON value written canonically (sorted keys): stable across re-serialisation."""
    return _digest_of(json.dumps(obj, **_CANONICAL).encode())


def _digest_of(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()[:32]


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    return canonical_digest({k: v for k, v in manifest.items() if k != DIGEST_KEY})


def table_digest(columns: Mapping[str, list]) -> str:
    """Digest of a format-1 episode table (one file, possibly with a crash's extra rows after the committed
    ones), given as columns of the values JSON parsing gives, so that the writer's and a reader's agree."""
    return canonical_digest(columns)


def file_digest(data: bytes) -> str:
    """Digest of a file written once and never changed (an episode table segment): its bytes, which
    hashing reads at memory speed, where a canonical re-encoding of its values cost more than parsing."""
    return _digest_of(data)


def tasks_digest(tasks: Mapping[str, Any], counts: Mapping[str, int]) -> str:
    """Digest of the first ``counts[task]`` instructions of each task: the committed part of the tasks
    table (an interrupted compaction may have appended more, which are not part of the store yet)."""
    return canonical_digest({t: list(tasks.get(t, []))[:int(n)] for t, n in sorted(counts.items())})


def tasks_counts(tasks: Mapping[str, Any]) -> dict[str, int]:
    return {t: len(v) for t, v in tasks.items()}


def array_meta_digest(meta: Mapping[str, Any]) -> str:
    """Digest of an array's zarr.json without its shape (which every compaction changes)."""
    return canonical_digest({k: v for k, v in meta.items() if k != "shape"})


def read_array_meta(array_dir: Path) -> dict[str, Any]:
    path = array_dir / "zarr.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: array metadata missing") from None
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: corrupt array metadata ({err})") from err
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: corrupt array metadata (not a JSON object)")
    return meta


# --- chunk CRCs ------------------------------------------------------------------------------------
def _bytes_of(x: np.ndarray) -> np.ndarray:
    """A read-only uint8 view of ``x``'s C-order bytes (google_crc32c wants a read-only buffer)."""
    b = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    if b.flags.writeable:
        b = b.view()
        b.flags.writeable = False
    return b


def crc_rows(x: np.ndarray, crc: int = 0) -> int:
    """CRC32C of ``x``'s rows, continuing ``crc`` (the CRC of the rows before them)."""
    return int(google_crc32c.extend(crc, _bytes_of(x))) if len(x) else int(crc)


class ChunkCrcs:
    """Per-chunk CRCs of one feature kept up to date while rows are appended in order.

    ``crcs`` are the committed chunks' CRCs for the first ``n0`` rows; when ``n0`` is not a chunk
    boundary, the last entry is the partial chunk's, which new rows extend (CRC32C extends).
    """

    def __init__(self, chunk: int, crcs: list[int], n0: int):
        expect = num_chunks(n0, chunk)
        if len(crcs) != expect:
            raise ValueError(f"chunk CRC list has {len(crcs)} entries, {expect} expected for {n0} rows")
        self.chunk, self.n = int(chunk), int(n0)
        self.crcs = [int(c) for c in crcs]

    def update(self, x: np.ndarray) -> None:
        i = 0
        while i < len(x):
            offset = self.n % self.chunk
            take = min(len(x) - i, self.chunk - offset)
            if offset == 0:
                self.crcs.append(crc_rows(x[i:i + take]))
            else:
                self.crcs[-1] = crc_rows(x[i:i + take], self.crcs[-1])
            self.n += take
            i += take


def chunk_crcs(x: np.ndarray, chunk: int) -> list[int]:
    """The CRC of each chunk of the rows ``x``."""
    return [crc_rows(x[i:i + chunk]) for i in range(0, len(x), chunk)]


def bad_chunks(x: np.ndarray, chunk: int, crcs: list[int]) -> list[int]:
    """Chunks of the loaded rows ``x`` whose CRC differs from the recorded ones."""
    got = chunk_crcs(x, chunk)
    if len(got) != len(crcs):
        return list(range(max(len(got), len(crcs))))
    return [i for i, (a, b) in enumerate(zip(got, crcs)) if int(a) != int(b)]


# --- chunk files --------------------------------------------------------------------------------------
def num_chunks(length: int, chunk: int) -> int:
    return -(-int(length) // int(chunk))


def chunk_path(array_dir: Path, index: int, ndim: int) -> Path:
    """Chunks span the whole per-step shape, so chunk i's key is c/i/0/.../0."""
    return array_dir.joinpath("c", str(index), *(["0"] * (ndim - 1)))


def missing_chunk_files(array_dir: Path, ndim: int, length: int, chunk: int) -> list[int]:
    """Chunks under ``length`` with no file (one stat each): zarr would read them as zeros."""
    return [i for i in range(num_chunks(length, chunk)) if not os.path.isfile(chunk_path(array_dir, i, ndim))]
