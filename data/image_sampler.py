"""Windows of camera frames (with their commands, rewards and done flags) for training VLAs.

Images need not fit in RAM: they are read from the store's compressed chunks through a small LRU cache
of decompressed chunks (``ChunkCache``), and the per-step features a window needs (commands/actions,
rewards, termination flags) are small and held in RAM.

A window ends at frame j of an episode (frames every ``stride`` steps; frame j = step j * stride,
see ``data.images``) and holds H = ``history`` frames j-H+1..j (zeros and mask False before the
episode's first frame, on the LEFT) plus, with ``next_frame``, frame j+1 for a Q target (GeRM's 7th
frame). Batch (B windows, torch tensors):

    images/<camera>       (B, H, h, w, c) uint8 | (B, H, h, w) float32 depth
    next_images/<camera>  (B, h, w, c) | (B, h, w), zeros where there is no next frame
    mask                  (B, H) bool, the frame exists
    actions               (B, H, A) the action feature (default ``hl_commands``) at each frame's step
    <step feature>        (B, H, D) any other per-step feature asked for, at each frame's step
    reward                (B,) sum of the stored ``rewards`` over the frame's decision interval
                          [j*stride, (j+1)*stride) (cut at the episode's end)
    sparse_reward         (B,) 1 at the last frame of a successful episode (GeRM / Q-Transformer)
    next_valid            (B,) bool, frame j+1 exists;  last = ~next_valid
    done                  (B,) float, the episode ended by a termination within this interval
    success               (B,) float, the episode's success label
    instruction           (B,) long, the episode's index into ``sampler.instructions`` (-1: none)
    episode_index, frame, step   (B,) long: into the store's table, frame j, step j*stride

Drawing: ``sample(B)`` draws windows uniformly (with replacement) from this rank's seeded stream;
``success_ratio=0.7569`` draws that share of every batch from successful episodes (GeRM's 75.69 %
demonstrations / 24.31 % failures, QUARD-Auto's mix). ``stream(B)`` is the chunk-aware path for stores
larger than the cache: it keeps a resident set of chunks per pool, draws each batch's windows from
windows whose frames lie in those chunks, and swaps ``refresh`` chunks after every batch, so a batch
decodes a few chunks instead of up to B·(H+1) (a shuffle buffer over chunks; every window keeps the same
chance over time). ``prefetch(iterator)`` builds batches on a thread (zarr/blosc decoding runs without the
GIL for the most part) while the trainer works; ``ImageWindowDataset`` runs the stream in
``torch.utils.data.DataLoader`` worker processes instead (each worker its own sampler and seed).
Everything is deterministic per (seed, rank[, worker]). One consumer per sampler: its random stream
and cache are not shared between threads other than the one ``prefetch`` runs.
"""
from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from quadforge.data.episodes import EpisodeArrays, select_episodes
from quadforge.data.images import num_frames
from quadforge.data.integrity import crc_rows
from quadforge.data.samplers import SeededSampler, check_success_pools
from quadforge.data.step_shards import StepShards
from quadforge.data.store import TrajectoryStore
from quadforge.seeding import derive_seed, numpy_rng

NEXT_PREFIX = "next_"


class ChunkCache:
    """Rows of one time-chunked zarr array through an LRU cache of ``capacity`` decompressed chunks.

    ``crcs``: the manifest's CRC32C of each chunk's committed rows (``data.integrity``); every decoded
    chunk is checked against it, as ``TrajectoryStore.load`` checks what it loads."""

    def __init__(self, array: Any, length: int, capacity: int = 32, crcs: Sequence[int] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"ChunkCache: capacity={capacity}; must be >= 1 chunk")
        self.array, self.length, self.capacity = array, int(length), int(capacity)
        self.chunk = int(array.chunks[0])
        self.shape, self.dtype = tuple(array.shape[1:]), np.dtype(array.dtype)
        self.crcs = None if crcs is None else [int(c) for c in crcs]
        self._chunks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, c: int) -> np.ndarray:
        with self._lock:
            block = self._chunks.get(c)
            if block is not None:
                self._chunks.move_to_end(c)
                self.hits += 1
                return block
            self.misses += 1
        lo = c * self.chunk
        try:
            block = np.asarray(self.array[lo:min(lo + self.chunk, self.length)])
        except Exception as err:  # a damaged chunk surfaces as a codec/checksum error from zarr
            raise ValueError(f"{getattr(self.array, 'path', 'image array')}: chunk {c} unreadable "
                             f"({type(err).__name__}: {err})") from err
        if self.crcs is not None and (c >= len(self.crcs) or crc_rows(block) != self.crcs[c]):
            raise ValueError(f"{getattr(self.array, 'path', 'image array')}: chunk {c} fails its CRC32C checksum "
                             f"(damaged or swapped); run `quadforge dataset validate`")
        with self._lock:
            self._chunks[c] = block
            self._chunks.move_to_end(c)
            while len(self._chunks) > self.capacity:
                self._chunks.popitem(last=False)
        return block

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), ...) rows, each chunk decoded (or found in the cache) once."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows),) + self.shape, dtype=self.dtype)
        ids = rows // self.chunk
        order = np.argsort(ids, kind="stable")
        bounds = np.flatnonzero(np.diff(ids[order])) + 1
        for part in np.split(order, bounds):
            if part.size:
                c = int(ids[part[0]])
                out[part] = self.get(c)[rows[part] - c * self.chunk]
        return out


class ImageWindowSampler(SeededSampler):
    """See the module doc. ``source``: a ``TrajectoryStore`` with image features. ``steps``: the store's
    ``StepShards`` to read the per-step features from memory-mapped shards instead of loading them
    (out of core: ``data.ram_budget``)."""

    def __init__(self, source: Any, cameras: Sequence[str] | None = None, history: int = 6,
                 next_frame: bool = True, action_feature: str = "hl_commands",
                 step_features: Sequence[str] = (), split: str = "train", val_fraction: float = 0.1,
                 filters: Mapping[str, Any] | None = None, success_ratio: float | None = None, seed: int = 0,
                 rank: int = 0, world_size: int = 1, cache_chunks: int = 32, steps: StepShards | None = None,
                 early_frames: int = 0, early_share: float = 0.0):
        who = "ImageWindowSampler"
        if not hasattr(source, "image_features") or not hasattr(source, "array"):
            raise ValueError(f"{who}: source must be a TrajectoryStore with image features, got {type(source).__name__}")
        if int(history) < 1:
            raise ValueError(f"{who}: history={history}; must be >= 1 frame")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"{who}: rank={rank}, world_size={world_size}; need 0 <= rank < world_size")
        if success_ratio is not None and not 0.0 <= success_ratio <= 1.0:
            raise ValueError(f"{who}: success_ratio={success_ratio}; must be in [0, 1] or None")
        if not 0.0 <= early_share <= 1.0 or (early_share > 0 and int(early_frames) < 1):
            raise ValueError(f"{who}: early_share={early_share}, early_frames={early_frames}; need a share in [0, 1] "
                             f"and early_frames >= 1 when the share is > 0")
        # one camera may be given as its name (a string would otherwise be read as its letters)
        cameras = ((cameras,) if isinstance(cameras, str) else tuple(cameras)) if cameras is not None \
            else source.image_features
        missing = [c for c in cameras if c not in source.image_features]
        if not cameras or missing:
            raise ValueError(f"{who}: cameras {list(missing or cameras)} not in the store's image features "
                             f"{list(source.image_features)}")
        strides = {source.frame_stride(c) for c in cameras}
        if len(strides) != 1:
            raise ValueError(f"{who}: cameras {list(cameras)} have different frame strides {sorted(strides)}")
        self.stride = strides.pop()
        self.cameras, self.history, self.next_frame = cameras, int(history), bool(next_frame)
        self.action_feature, self.step_features = action_feature, tuple(step_features)
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        self.success_ratio = success_ratio
        self.instructions: list[str] = list(getattr(source, "instructions", []))

        needed = list(dict.fromkeys([action_feature, *self.step_features]))
        absent = [n for n in needed if n not in source.feature_names]
        if absent:
            raise ValueError(f"{who}: features {absent} are missing; the store has {list(source.feature_names)}")
        extra = [n for n in ("rewards", "terminated") if n in source.feature_names]
        if steps is None:
            data = EpisodeArrays.from_store(source, needed + extra)
        else:   # out of core: the per-step features mapped from shards, each checked once in full here
            data = steps
            for name in needed + extra:
                steps.feature(name).check_all()
        self.episodes = select_episodes(data, split, val_fraction, seed, filters, who)   # (E_sel,)
        info = data.episode_info
        lengths = data.episode_lengths                                                     # (E,)
        frames = num_frames(lengths, self.stride)                                          # (E,)
        self._frame_start = np.concatenate([[0], np.cumsum(frames)[:-1]]).astype(np.int64)
        self._step_start = data.episode_starts
        self._lengths, self._frames = lengths, frames
        self._success = info["success"].astype(bool)
        self._instruction = (info["instruction_id"].astype(np.int64) if "instruction_id" in info
                             else np.full(len(lengths), -1, np.int64))
        self._terminal = (np.asarray(data.features["terminated"]).reshape(-1)[data.episode_ends - 1].astype(bool)
                          if "terminated" in data.features else info["terminated"].astype(bool))
        self._steps = {n: np.asarray(data.features[n], dtype=np.float32).reshape(data.num_steps, -1) for n in needed}
        rewards = (np.asarray(data.features["rewards"], dtype=np.float64).reshape(-1) if "rewards" in data.features
                   else np.zeros(data.num_steps))
        self._reward_csum = np.concatenate([[0.0], np.cumsum(rewards)])

        # window ends: every frame of every selected episode; this rank takes a strided shard
        sel_frames = frames[self.episodes]
        win_ep = np.repeat(self.episodes, sel_frames)
        win_j = np.arange(len(win_ep), dtype=np.int64) - np.repeat(np.cumsum(sel_frames) - sel_frames, sel_frames)
        self._win_ep, self._win_j = win_ep[self.rank::self.world_size], win_j[self.rank::self.world_size]
        self.num_windows = len(self._win_ep)
        if self.num_windows == 0:
            raise ValueError(f"{who}: rank {rank} of {world_size} has no windows ({len(win_ep)} in all)")
        succ = self._success[self._win_ep]
        self._pools = (np.flatnonzero(succ), np.flatnonzero(~succ))
        # the windows whose newest frame is one of the episode's first ``early_frames``: where a QUARD episode's
        # choice between two objects is made (later frames mostly show the chosen one ahead)
        self.early_share = float(early_share)
        self._early = np.flatnonzero(self._win_j < int(early_frames)) if early_share > 0 else np.zeros(0, np.int64)
        if early_share > 0 and self._early.size == 0:
            raise ValueError(f"{who}: early_share={early_share} draws windows ending in an episode's first "
                             f"{early_frames} frames; rank {rank} of {world_size} has none (train with "
                             f"early_share=0, or on fewer ranks)")
        check_success_pools(who, success_ratio, (self._pools[0].size, self._pools[1].size),
                            f"({len(self.episodes)} episodes, filters={dict(filters or {})})")
        n_frames = {c: int(source.manifest["lengths"][c]) for c in cameras}
        checksums = source.manifest.get("checksums") or {}
        self.caches = {c: ChunkCache(source.array(c), n_frames[c], cache_chunks, checksums.get(c)) for c in cameras}
        # a window's home chunk (that of its last frame), per camera the same rows: use the first camera's
        self._home = (self._frame_start[self._win_ep] + self._win_j) // self.caches[cameras[0]].chunk
        self._rng = numpy_rng(self.seed, f"image_window_sampler/rank{self.rank}")

    def window_actions(self) -> np.ndarray:
        """(num_windows, D) the action feature at the step of every window's newest frame (this rank's
        windows): the commands a model is trained to emit, e.g. to fit command bins to the data."""
        return self._steps[self.action_feature][self._step_of(self._win_ep, self._win_j)].copy()

    def _step_of(self, ep: np.ndarray, j: np.ndarray) -> np.ndarray:
        """The store step row of frame ``j`` of episode ``ep`` (broadcasting)."""
        return self._step_start[ep] + j * self.stride

    def __len__(self) -> int:
        return self.num_windows

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    # --- drawing --------------------------------------------------------------------------------
    def _split(self, batch_size: int) -> tuple[int, int]:
        n_succ = int(round(batch_size * self.success_ratio))
        return n_succ, batch_size - n_succ

    def _draw(self, batch_size: int, pools: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        if self.early_share > 0:
            if pools is not None:
                raise ValueError("ImageWindowSampler: early_share draws from the whole store; the chunk-aware "
                                 "stream() cannot honour it (use uniform sampling: sample(), or a cache that holds "
                                 "the store)")
            n_early = int(round(batch_size * self.early_share))
            early = self._early[self._rng.integers(0, len(self._early), size=n_early)]
            return self._rng.permutation(np.concatenate([early, self._draw_pools(batch_size - n_early, None)]))
        return self._draw_pools(batch_size, pools)

    def _draw_pools(self, batch_size: int, pools: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        rng = self._rng
        if self.success_ratio is None and pools is None:
            return rng.integers(0, self.num_windows, size=batch_size)
        succ, fail = pools if pools is not None else self._pools
        if self.success_ratio is None:
            everything = np.concatenate([succ, fail])
            return everything[rng.integers(0, len(everything), size=batch_size)]
        n_succ, n_fail = self._split(batch_size)
        parts = [succ[rng.integers(0, len(succ), size=n_succ)] if n_succ else succ[:0],
                 fail[rng.integers(0, len(fail), size=n_fail)] if n_fail else fail[:0]]
        return rng.permutation(np.concatenate(parts))

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """Uniformly random windows (with replacement; the success ratio when set)."""
        return self.batch_at(self._draw(int(batch_size)))

    def stream(self, batch_size: int, resident_chunks: int | None = None, refresh: int = 1
               ) -> Iterator[dict[str, torch.Tensor]]:
        """Endless chunk-aware batches: windows drawn from a resident set of chunks per pool (successes,
        failures), ``refresh`` chunks of each set swapped for random others after every batch.
        ``resident_chunks`` (per pool) defaults to a quarter of the cache over the pools, so the resident
        chunks, their neighbours (history, next frames) and the refreshed ones stay decoded."""
        pools = self._pools if self.success_ratio is not None else (np.arange(self.num_windows), np.zeros(0, np.int64))
        used = sum(1 for p in pools if p.size)
        k = int(resident_chunks or max(1, self.caches[self.cameras[0]].capacity // (4 * used)))
        rng = self._rng
        by_chunk = []
        for pool in pools:
            homes = self._home[pool]
            chunks = np.unique(homes)
            by_chunk.append((chunks, {int(c): pool[homes == c] for c in chunks}))
        resident = [list(rng.choice(chunks, size=min(k, len(chunks)), replace=False)) if len(chunks) else []
                    for chunks, _ in by_chunk]
        while True:
            local = tuple(np.concatenate([groups[c] for c in res]) if res else np.zeros(0, np.int64)
                          for (_, groups), res in zip(by_chunk, resident))
            yield self.batch_at(self._draw(int(batch_size), local))
            for (chunks, _), res in zip(by_chunk, resident):
                if len(chunks) > len(res):
                    for _ in range(min(refresh, len(res))):
                        res.pop(int(rng.integers(len(res))))
                        outside = np.setdiff1d(chunks, res)
                        res.append(int(outside[rng.integers(len(outside))]))

    def epoch(self, batch_size: int, chunks_per_group: int | None = None, epoch: int = 0
              ) -> Iterator[dict[str, torch.Tensor]]:
        """Every window of this rank once, chunk-aware: chunks in a seeded order, ``chunks_per_group``
        (default half the cache) at a time, windows shuffled within each group."""
        k = int(chunks_per_group or max(1, self.caches[self.cameras[0]].capacity // 2))
        rng = numpy_rng(self.seed, f"image_window_epoch/{epoch}/rank{self.rank}")
        chunks, home = np.unique(self._home, return_inverse=True)
        position = np.empty(len(chunks), np.int64)
        position[rng.permutation(len(chunks))] = np.arange(len(chunks))
        group = position[home] // k                                          # (W,) the window's group
        order = np.lexsort((rng.random(self.num_windows), group))            # by group, shuffled within
        for i in range(0, len(order), int(batch_size)):
            yield self.batch_at(order[i:i + batch_size])

    # --- building a batch -----------------------------------------------------------------------
    def batch_at(self, windows: np.ndarray) -> dict[str, torch.Tensor]:
        """The batch of these window indices (0..num_windows-1)."""
        w = np.asarray(windows, dtype=np.int64)
        ep, j = self._win_ep[w], self._win_j[w]                                      # (B,)
        H = self.history
        jj = j[:, None] + np.arange(1 - H, 1, dtype=np.int64)[None, :]              # (B, H)
        mask = jj >= 0
        jj0 = np.where(mask, jj, 0)
        rows = self._frame_start[ep][:, None] + jj0                                  # (B, H) frame rows
        steps = self._step_of(ep[:, None], jj0)                                     # (B, H) step rows
        has_next = j + 1 < self._frames[ep]
        next_rows = self._frame_start[ep] + np.where(has_next, j + 1, j)
        B = len(w)
        out: dict[str, torch.Tensor] = {}
        for cam, cache in self.caches.items():
            flat = rows.reshape(-1)
            frames = cache.gather(np.concatenate([flat, next_rows]) if self.next_frame else flat)
            hist = frames[:B * H].reshape((B, H) + cache.shape)
            hist[~mask] = 0
            out[cam] = torch.from_numpy(hist)
            if self.next_frame:
                nxt = frames[B * H:]
                nxt[~has_next] = 0
                out[NEXT_PREFIX + cam] = torch.from_numpy(nxt)
        for name, table in self._steps.items():
            vals = table[steps]                                                      # (B, H, D)
            vals[~mask] = 0
            out["actions" if name == self.action_feature else name] = torch.from_numpy(vals)
        # the decision interval of frame j: steps [j*stride, min((j+1)*stride, T))
        lo = self._step_of(ep, j)
        hi = self._step_start[ep] + np.minimum((j + 1) * self.stride, self._lengths[ep])
        last = ~has_next
        success = self._success[ep]
        out.update({
            "mask": torch.from_numpy(mask),
            "reward": torch.from_numpy((self._reward_csum[hi] - self._reward_csum[lo]).astype(np.float32)),
            "sparse_reward": torch.from_numpy((last & success).astype(np.float32)),
            "next_valid": torch.from_numpy(has_next),
            "last": torch.from_numpy(last),
            "done": torch.from_numpy((last & self._terminal[ep]).astype(np.float32)),
            "success": torch.from_numpy(success.astype(np.float32)),
            "instruction": torch.from_numpy(self._instruction[ep]),
            "episode_index": torch.from_numpy(ep),
            "frame": torch.from_numpy(j),
            "step": torch.from_numpy(j * self.stride),
        })
        return out


def prefetch(batches: Iterator[dict[str, torch.Tensor]], depth: int = 2) -> Iterator[dict[str, torch.Tensor]]:
    """Build the next ``depth`` batches of ``batches`` on a background thread (chunk decoding releases the
    GIL), yielding them in order; an error in the thread is raised here. Stop by closing the generator."""
    if depth < 1:
        raise ValueError(f"prefetch: depth={depth}; must be >= 1")
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def work() -> None:
        try:
            for b in batches:
                while not stop.is_set():
                    try:
                        q.put(b, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as err:  # noqa: BLE001 - re-raised in the consumer
            q.put(err)

    thread = threading.Thread(target=work, name="image-window-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise RuntimeError(f"image window prefetch failed: {item}") from item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


class ImageWindowDataset(torch.utils.data.IterableDataset):
    """Endless batches of ``ImageWindowSampler.stream`` for a ``DataLoader(dataset, batch_size=None,
    num_workers=K)``: each worker opens the store itself and samples with the seed
    ``derive_seed(seed, "image_worker<k>")`` (the main process, with no workers, uses ``seed``), so
    workers draw different, reproducible batches. ``sampler_kwargs`` are ``ImageWindowSampler``'s."""

    def __init__(self, store_path: str, batch_size: int, seed: int = 0, **sampler_kwargs: Any) -> None:
        super().__init__()
        self.store_path, self.batch_size, self.seed = str(store_path), int(batch_size), int(seed)
        self.sampler_kwargs = sampler_kwargs

    def sampler(self) -> ImageWindowSampler:
        info = torch.utils.data.get_worker_info()
        seed = self.seed if info is None else derive_seed(self.seed, f"image_worker{info.id}") % (2 ** 31)
        # the store is opened in the worker (a path pickles; an open zarr group need not)
        return ImageWindowSampler(TrajectoryStore.open(self.store_path), seed=seed, **self.sampler_kwargs)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self.sampler().stream(self.batch_size)
