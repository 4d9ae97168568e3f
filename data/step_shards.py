"""Per-step arrays of a trajectory store as uncompressed, memory-mapped files: the out-of-core samplers' source.

The store keeps per-step features compressed in zarr chunks, which cannot be read a window at a time at
training speed (every window would decode a 2 MiB chunk). ``StepShards`` writes, once per store
generation and on first use after compaction, the arrays a sampler gathers from as plain ``.npy`` files:

```
<store>/shards/g<generation>/
  <feature>.npy                 a stored feature, uncompressed (actions, rewards, terminated, ...)
  obs@<layout>-<digest>.npy     the layout vector of every step (T, D) float32, built chunk by chunk
  reward@sparse.npy             1 at the last step of a successful episode (GeRM's sparse reward)
  return@<reward>@<gamma>.npy   per step, the discounted return to its episode's end (float32)
  <name>.npy.json               the shard's rows per chunk and each chunk's CRC32C
  .lock                         flock: one process writes, the others (DDP ranks) wait and map the same file
```

Every file is written in one streaming pass (a block of whole zarr chunks in RAM at a time); every zarr
chunk read is checked against the manifest's CRC32C, and a damaged one is an error naming the store, the
feature and the chunk. Readers map the files read-only and shared (``mmap``): ranks of one node read one
copy of the bytes, the kernel's page cache. A shard chunk is checked against its recorded CRC the first time
a batch touches it, so a damaged shard is an error too, never silent data. The process's mapped resident
pages are handed back to the page cache (``MADV_DONTNEED``) whenever they exceed ``MAPPED_RESIDENT_BYTES``,
which bounds the RSS the mapping adds however large the store.
"""
from __future__ import annotations

import fcntl
import json
import mmap
import os
import resource
import shutil
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from quadforge.data.episodes import EpisodeSpans, discounted_returns
from quadforge.data.integrity import ChunkCrcs, canonical_digest, crc_rows
from quadforge.data.store import TrajectoryStore, array_path
from quadforge.layout import ObsLayout

SHARDS_DIR = "shards"
SHARD_CHUNK_BYTES = 2 << 20            # ~2 MiB of rows per checked shard chunk (the store's own chunk size)
MAPPED_RESIDENT_BYTES = 1 << 30        # hand mapped pages back to the page cache above this much
RESIDENT_CHECK_EVERY = 8               # gathers between two looks at the resident size (/proc/self/statm)
PASS_BLOCK_STEPS = 1 << 18             # steps per block of the writing passes (>= any store chunk)
_PAGE = resource.getpagesize()
_OPEN: "weakref.WeakSet[ShardArray]" = weakref.WeakSet()


def shard_root(store_root: Path) -> Path:
    return Path(store_root) / SHARDS_DIR


def layout_key(layout: ObsLayout) -> str:
    return f"obs@{layout.name}-{canonical_digest(layout.to_dict())[:12]}"


# --- reading ------------------------------------------------------------------------------------------

class ShardArray:
    """One shard file mapped read-only: ``take(rows)`` gathers rows, checking each chunk once."""

    def __init__(self, path: Path, store_root: Path):
        self.path, self.store_root = path, store_root
        meta = json.loads(path.with_name(path.name + ".json").read_text())
        self.chunk, self.crcs = int(meta["chunk"]), [int(c) for c in meta["crcs"]]
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if fortran:
            raise ValueError(f"{path}: shard stored in Fortran order; delete {path.parent} to rebuild it")
        count = int(np.prod(shape, dtype=np.int64))
        if offset + count * dtype.itemsize != len(self._map):
            raise ValueError(f"{self.store_root}: shard {path.name} has {len(self._map)} bytes, its header "
                             f"says {offset + count * dtype.itemsize} (truncated); delete {path} to rebuild it")
        self._map.madvise(mmap.MADV_RANDOM)   # window reads: no read-ahead of neighbours never asked for
        self.array = np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(shape)
        self._offset, self._row_bytes = offset, int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        self._checked = np.zeros(len(self.crcs), dtype=bool)
        self._all_checked = False
        self._gathers = 0
        self._views: dict[int, np.ndarray] = {}
        _OPEN.add(self)

    def __len__(self) -> int:
        return len(self.array)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def all_checked(self) -> bool:
        """Whether every chunk has been checked (then ``check`` has nothing left to do)."""
        return self._all_checked

    def check(self, rows: np.ndarray) -> None:
        """Check (once each) the CRC of every chunk holding one of ``rows``; raise naming a damaged one."""
        if self._all_checked:
            return
        ids = np.asarray(rows, dtype=np.int64).reshape(-1) // self.chunk
        todo = ids[~self._checked[ids]]
        for c in np.unique(todo):
            c = int(c)
            block = self.array[c * self.chunk:(c + 1) * self.chunk]
            if crc_rows(block) != self.crcs[c]:
                self._damaged(c, c * self.chunk, c * self.chunk + len(block))
            self._checked[c] = True
        self._all_checked = bool(self._checked.all())

    def _damaged(self, c: int, lo: int, hi: int) -> None:
        raise ValueError(f"{self.store_root}: out-of-core shard {self.path.name} chunk {c} (rows {lo}..{hi - 1}) "
                         f"fails its CRC32C (damaged); delete {self.path.parent} to rebuild it from the store")

    def check_all(self) -> None:
        """Check every chunk now (a reader that indexes ``array`` directly)."""
        for c in range(0, len(self.crcs), 64):
            self.check(np.arange(c, min(c + 64, len(self.crcs)), dtype=np.int64) * self.chunk)
            self.release()

    def take(self, rows: np.ndarray, span: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` (any integer shape) as a new array of shape ``rows.shape + row shape``.
        ``span``: rows to check instead of all of ``rows`` (a window's first and last rows cover it)."""
        rows = np.asarray(rows, dtype=np.int64)
        self.check(rows if span is None else span)
        out = np.take(self.array, rows.reshape(-1), axis=0).reshape(rows.shape + self.array.shape[1:])
        self._gathers += 1
        if self._gathers % RESIDENT_CHECK_EVERY == 0:
            release_if_over()
        return out

    def windows(self, starts: np.ndarray, n: int, span: np.ndarray) -> np.ndarray:
        """(B, n, ...) the n consecutive rows from each of ``starts`` (>= 0, + n <= len): one block copy per
        window through a sliding-window view of the map; ``span``: rows to check (see ``take``)."""
        self.check(span)
        view = self._views.get(n)
        if view is None:   # made once per window length (as_strided costs about as much as a small gather)
            a = self.array
            view = self._views[n] = np.lib.stride_tricks.as_strided(
                a, shape=(len(a) - n + 1, n) + a.shape[1:], strides=(a.strides[0],) + a.strides, writeable=False)
        out = view[np.asarray(starts, dtype=np.int64)]
        self._gathers += 1
        if self._gathers % RESIDENT_CHECK_EVERY == 0:
            release_if_over()
        return out

    def windows_into(self, starts: np.ndarray, n: int, span: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``windows`` gathered into ``out`` (contiguous, at least len(starts) * n rows: a caller's reused scratch,
        so a batch assembled from several shards allocates nothing per shard). Every window must lie inside
        this shard (0 <= start, start + n <= len)."""
        self.check(span)
        starts = np.asarray(starts, dtype=np.int64)
        rows = (starts[:, None] + np.arange(n, dtype=np.int64)[None, :]).reshape(-1)
        dest = out[:len(rows)]
        np.take(self.array, rows, axis=0, out=dest, mode="clip")   # in range by contract; "clip": no buffered copy
        self._gathers += 1
        if self._gathers % RESIDENT_CHECK_EVERY == 0:
            release_if_over()
        return dest.reshape((len(starts), n) + self.array.shape[1:])

    def block(self, start: int, stop: int) -> np.ndarray:
        """Rows start..stop-1, checked, as a copy (streaming passes). Read with ``pread``, not through the
        map: the file's read-ahead applies (the map is ``MADV_RANDOM``) and no mapped page is left behind."""
        n = (stop - start) * self._row_bytes
        buf = bytearray(n)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self._offset + start * self._row_bytes)
            got = f.readinto(buf)
        if got != n:
            raise ValueError(f"{self.store_root}: out-of-core shard {self.path.name} ends before row {stop} "
                             f"(truncated); delete {self.path.parent} to rebuild it")
        x = np.frombuffer(buf, dtype=self.array.dtype).reshape((stop - start,) + self.array.shape[1:])
        for c in range(start // self.chunk, -(-stop // self.chunk)):
            lo, hi = c * self.chunk, min(len(self.array), (c + 1) * self.chunk)
            if self._checked[c]:
                continue
            if start <= lo and hi <= stop:       # the whole chunk is in the block: check the bytes just read
                if crc_rows(x[lo - start:hi - start]) != self.crcs[c]:
                    self._damaged(c, lo, hi)
                self._checked[c] = True
            else:
                self.check(np.asarray([lo]))
        return x

    def release(self) -> None:
        """Drop this process's mapped pages (they stay in the page cache for the next touch)."""
        self._map.madvise(mmap.MADV_DONTNEED)


def mapped_resident_bytes() -> int:
    """File-backed resident bytes of this process (``shared`` in /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[2]) * _PAGE


def release_if_over(limit: int | None = None) -> bool:
    if mapped_resident_bytes() <= (MAPPED_RESIDENT_BYTES if limit is None else limit):
        return False
    for shard in list(_OPEN):
        shard.release()
    return True


# --- the source -------------------------------------------------------------------------------------------

class LazyFeatures(Mapping[str, Any]):
    """``features[name]``: ``get(name)`` for each of a source's per-step feature ``names``, read (and its
    shards written) only on first use. ``StepShards`` maps a name to its shard array,
    ``data.store_set.MultiStepShards`` to the stores' shards joined."""

    def __init__(self, names: Sequence[str], get: Callable[[str], Any]):
        self._names, self._get = tuple(names), get

    def __getitem__(self, name: str) -> Any:
        return self._get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class ShardSource(EpisodeSpans):
    """What the out-of-core samplers read (``data.shard_steps``): the episode table (``episode_ends``,
    ``episode_info``), ``features`` (name -> mapped rows), ``require``, and per-step tables with ``take``,
    ``windows`` and ``block`` from ``feature``, ``layout_table``, ``reward`` and ``returns``. ``StepShards``
    reads one store; ``data.store_set.MultiStepShards`` several stores as one (DAgger's aggregate)."""

    features: Mapping[str, Any]
    episode_info: dict[str, np.ndarray]


class StepShards(ShardSource):
    """The out-of-core view of a ``TrajectoryStore``: what ``EpisodeArrays`` offers (episode table,
    ``features[name]``, lengths), with per-step arrays memory-mapped from shard files instead of loaded."""

    def __init__(self, store: TrajectoryStore, log: Callable[[str], None] | None = None):
        self.store = store
        self.dir = shard_root(store.root) / f"g{store.generation}"
        self.episode_ends = np.asarray(store.episode_ends, dtype=np.int64)
        self.episode_info = store.episodes.columns()
        self.features = LazyFeatures(store.feature_names, self._feature_array)
        self._log = log
        self._open: dict[str, ShardArray] = {}

    def require(self, names, who: str) -> None:
        missing = [n for n in names if n not in self.store.feature_names]
        if missing:
            raise ValueError(f"{who}: features {missing} are missing; the store has {list(self.store.feature_names)}")

    # shards ------------------------------------------------------------------------------------------
    def _feature_array(self, name: str) -> np.ndarray:
        """The shard array of a per-step feature (a bound method, so the mapping pickles with its source)."""
        return self.feature(name).array

    def feature(self, name: str) -> ShardArray:
        """A stored per-step feature, uncompressed."""
        self.store._check_feature(name)
        spec = self.store.schema.features[name]
        return self._shard(name, lambda: self._write_from_chunks(name, [name], (len(spec.shape) and spec.shape) or (),
                                                                 np.dtype(spec.dtype), lambda b: b[name]))

    def layout_table(self, layout: ObsLayout) -> ShardArray:
        """(T, D) float32: every step's layout vector, as the RAM path builds it."""
        terms = list(layout.term_names)
        self.require(terms, f"layout {layout.name!r}")

        def build(block: Mapping[str, np.ndarray]) -> np.ndarray:
            t = {n: torch.from_numpy(np.ascontiguousarray(block[n], dtype=np.float32)) for n in terms}
            return layout.build(t).numpy()

        key = layout_key(layout)
        return self._shard(key, lambda: self._write_from_chunks(key, terms, (layout.dim,), np.dtype(np.float32), build))

    def reward(self, kind: str) -> ShardArray:
        """Per-step reward: ``"sparse"`` (1 at a successful episode's last step) or a stored feature."""
        if kind != "sparse":
            return self.feature(kind)
        success = np.asarray(self.episode_info["success"]).astype(bool)

        def sparse(first: int, last: int) -> np.ndarray:
            starts, ends = self.episode_starts[first:last], self.episode_ends[first:last]
            r = np.zeros(int(ends[-1] - starts[0]), dtype=np.float32)
            r[(ends - starts[0] - 1)[success[first:last]]] = 1.0
            return r

        return self._shard("reward@sparse", lambda: self._write_by_episodes("reward@sparse", (), np.float32, sparse))

    def returns(self, kind: str, gamma: float) -> ShardArray:
        """Per step, the discounted return (``gamma``) of reward ``kind`` to the episode's end, float32."""
        key = f"return@{kind}@{float(gamma)!r}"
        rewards = self.reward(kind)

        def returns(first: int, last: int) -> np.ndarray:
            a, b = int(self.episode_starts[first]), int(self.episode_ends[last - 1])
            r = rewards.block(a, b).astype(np.float64).reshape(-1)
            return discounted_returns(r, self.episode_ends[first:last] - a, float(gamma)).astype(np.float32)

        return self._shard(key, lambda: self._write_by_episodes(key, (), np.float32, returns))

    def _shard(self, key: str, write: Callable[[], None]) -> ShardArray:
        if key in self._open:
            return self._open[key]
        path = self.dir / f"{key}.npy"
        if not _complete(path):
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / ".lock", "a+") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)   # the first rank writes; the others wait, then map it
                try:
                    if not _complete(path):
                        _drop_old_generations(self.dir)
                        t0 = time.perf_counter()
                        write()
                        if self._log:
                            self._log(f"out-of-core: wrote {path.name} ({path.stat().st_size / 1e9:.2f} GB) in "
                                      f"{time.perf_counter() - t0:.1f} s")
                finally:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        self._open[key] = ShardArray(path, self.store.root)
        return self._open[key]

    # writing passes ---------------------------------------------------------------------------------
    def _write_from_chunks(self, key: str, sources: list[str], row_shape: tuple[int, ...], dtype: np.dtype,
                           make: Callable[[Mapping[str, np.ndarray]], np.ndarray]) -> None:
        """One pass over ``sources``' zarr chunks, ``PASS_BLOCK_STEPS`` steps at a time, each chunk checked."""
        n = self.num_steps
        readers = {name: _ChunkReader(self.store, name) for name in sources}
        block = max([PASS_BLOCK_STEPS] + [r.chunk for r in readers.values()])
        with _ShardWriter(self.dir / f"{key}.npy", (n,) + tuple(row_shape), dtype) as out:
            for a in range(0, n, block):
                b = min(n, a + block)
                out.append(np.asarray(make({name: r.rows(a, b) for name, r in readers.items()}), dtype=dtype))

    def _write_by_episodes(self, key: str, row_shape: tuple[int, ...], dtype: Any,
                           make: Callable[[int, int], np.ndarray]) -> None:
        """One pass over groups of whole episodes (about ``PASS_BLOCK_STEPS`` steps each)."""
        ends = self.episode_ends
        with _ShardWriter(self.dir / f"{key}.npy", (self.num_steps,) + tuple(row_shape), np.dtype(dtype)) as out:
            first = 0
            while first < len(ends):
                base = int(ends[first - 1]) if first else 0
                last = max(first + 1, int(np.searchsorted(ends, base + PASS_BLOCK_STEPS, side="right")))
                out.append(make(first, last))
                first = last


class _ChunkReader:
    """Rows of one store array, read whole chunks at a time, each checked against the manifest's CRC32C."""

    def __init__(self, store: TrajectoryStore, name: str):
        self.store, self.name = store, name
        self.array = store.array(name)
        self.chunk = int(self.array.chunks[0])
        self.length = int(store.manifest["lengths"][name])
        self.crcs = (store.manifest.get("checksums") or {}).get(name)

    def rows(self, a: int, b: int) -> np.ndarray:
        """Rows a..b-1 with ``a`` on a chunk boundary (and ``b`` one, or the end)."""
        where = self.store.root / array_path(self.name)
        try:
            x = np.asarray(self.array[a:b])
        except Exception as err:  # a damaged chunk surfaces as a codec error (zarr's own CRC32C, blosc)
            first, last = a // self.chunk, (b - 1) // self.chunk
            bad = self._first_unreadable(first, last)
            raise ValueError(f"{self.store.root}: feature {self.name!r} chunk {bad} ({where}) is unreadable "
                             f"({type(err).__name__}); run `quadforge dataset validate --store "
                             f"{self.store.root}`") from err
        if self.crcs is not None:
            for c in range(a // self.chunk, -(-b // self.chunk)):
                lo, hi = c * self.chunk - a, min(b, (c + 1) * self.chunk) - a
                if crc_rows(x[lo:hi]) != int(self.crcs[c]):
                    raise ValueError(f"{self.store.root}: feature {self.name!r} chunk {c} ({where}) fails its "
                                     f"checksum (damaged or swapped); run `quadforge dataset validate --store "
                                     f"{self.store.root}`")
        return x

    def _first_unreadable(self, first: int, last: int) -> int:
        for c in range(first, last + 1):
            try:
                self.array[c * self.chunk:min(self.length, (c + 1) * self.chunk)]
            except Exception:
                return c
        return first


class _ShardWriter:
    """Appends rows to a new ``.npy`` file, keeping per-chunk CRCs; on success fsyncs and renames it (and its
    ``.json`` record) into place, so a shard is either complete or absent."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: np.dtype):
        self.path, self.shape, self.dtype = path, shape, np.dtype(dtype)
        row = max(1, int(np.prod(shape[1:], dtype=np.int64)) * self.dtype.itemsize)
        self.chunk = 1 << max(0, int(np.log2(max(1, SHARD_CHUNK_BYTES // row))))
        self.tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self.pos = 0

    def __enter__(self) -> "_ShardWriter":
        self.out = np.lib.format.open_memmap(self.tmp, mode="w+", dtype=self.dtype, shape=self.shape)
        self.crcs = ChunkCrcs(self.chunk, [], 0)
        return self

    def append(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=self.dtype).reshape((-1,) + self.shape[1:])
        self.out[self.pos:self.pos + len(rows)] = rows
        self.crcs.update(rows)
        self.pos += len(rows)
        self.out.flush()                                  # written pages go to disk, not to this process's RSS
        self.out._mmap.madvise(mmap.MADV_DONTNEED)

    def __exit__(self, kind, *rest) -> None:
        if kind is not None:
            del self.out
            self.tmp.unlink(missing_ok=True)
            return
        if self.pos != self.shape[0]:
            raise RuntimeError(f"{self.path}: wrote {self.pos} rows, expected {self.shape[0]}")
        self.out.flush()
        del self.out
        with open(self.tmp, "rb") as f:
            os.fsync(f.fileno())
        record = self.path.with_name(self.path.name + ".json")
        record.write_text(json.dumps({"chunk": self.chunk, "crcs": self.crcs.crcs, "shape": list(self.shape),
                                      "dtype": self.dtype.str}))
        os.replace(self.tmp, self.path)


def _complete(path: Path) -> bool:
    return path.is_file() and path.with_name(path.name + ".json").is_file()


def _drop_old_generations(current: Path) -> None:
    """Shards of earlier generations describe a store that has since grown: delete them. Only earlier
    ones: a reader holding an older view of the store (opened before a compaction) must not delete
    the shards a newer reader is using or writing."""
    mine = _generation_of(current)
    for old in current.parent.glob("g*"):
        g = _generation_of(old)
        if g is not None and mine is not None and g < mine and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def _generation_of(path: Path) -> int | None:
    """The generation of a ``g<G>`` shard folder (None for any other name)."""
    digits = path.name[1:]
    return int(digits) if path.name.startswith("g") and digits.isdigit() else None
