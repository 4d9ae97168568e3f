"""What the VLA trainer reads: image windows, one interface, and a synthetic source that meets it.

A source of image windows (``ImageWindowSource``) has
- ``instructions``: the instruction table (list of strings; batches index into it),
- ``history``: T, the frames per window; ``image_size``: (H, W),
- ``settings``: the task/camera settings a checkpoint records and deployment checks
  (``{"task": "quard:go_to", "camera": {"name": "front", "height": H, "width": W}, "image_every": 10,
  "control_hz": 50}``),
- ``sample(batch_size) -> dict`` of tensors, one transition per row at the IMAGE rate (frames are recorded
  every ``image_every`` control steps; the command is the one applied at the newest frame):

  ``frames`` uint8 (B, T+1, H, W, 3)  frames t-T+1 .. t+1; left-padded with zeros at episode starts;
                                      frame t+1 (the 7th of seed 003) feeds only the Q target
  ``frame_mask`` bool (B, T+1)        real frames (the last is False when the episode ended at t)
  ``instruction`` long (B,)           index into ``instructions``
  ``action`` float (B, 12)            the 12-D command at frame t (``experts.hierarchical.HL_COMMAND_NAMES``)
  ``reward``, ``discount``, ``mc_return``, ``success`` float (B,);  ``done``, ``last`` bool (B,)
                                      as ``data.samplers.TransitionSampler`` (sparse reward, γ^m, MC return)

The store-backed source is the store's image-window sampler (``open_image_source``); ``ColourChoiceTask``
below generates the same batches for tests and the benchmark.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, runtime_checkable

import numpy as np
import torch

from quadforge.data.image_sampler import ImageWindowSampler, prefetch
from quadforge.data.ram_budget import fits_in_ram
from quadforge.data.step_shards import StepShards
from quadforge.data.store import TrajectoryStore
from quadforge.experts.hierarchical import HL_COMMAND_DIM, HL_COMMAND_NAMES
from quadforge.seeding import numpy_rng
from quadforge.training.grounding import TARGET_TERMS, target_polar

SAMPLING_MODES = ("auto", "stream", "uniform")
BATCH_KEYS = ("frames", "frame_mask", "instruction", "action", "reward", "discount", "mc_return", "success",
              "done", "last")


@runtime_checkable
class ImageWindowSource(Protocol):
    instructions: list[str]
    history: int
    image_size: tuple[int, int]
    settings: dict[str, Any]

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]: ...


def check_batch(batch: Mapping[str, torch.Tensor], history: int, image_size: tuple[int, int]) -> None:
    """One clear line when a source's batch does not meet the interface."""
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"image-window batch lacks {missing}; a source must give {BATCH_KEYS}")
    f = batch["frames"]
    b = f.shape[0]
    h, w = image_size
    if f.dtype != torch.uint8 or tuple(f.shape[1:]) != (history + 1, h, w, 3):
        raise ValueError(f"batch frames must be uint8 (B, history+1={history + 1}, {h}, {w}, 3), "
                         f"got {f.dtype} {tuple(f.shape)}")
    if tuple(batch["frame_mask"].shape) != (b, history + 1):
        raise ValueError(f"batch frame_mask must be (B, {history + 1}), got {tuple(batch['frame_mask'].shape)}")
    if tuple(batch["action"].shape) != (b, HL_COMMAND_DIM):
        raise ValueError(f"batch action must be the 12-D command (B, {HL_COMMAND_DIM}), got {tuple(batch['action'].shape)}")


def settings_of_store(store: Any, camera: str) -> dict[str, Any]:
    """Task/camera settings of an image store: its task (``quard:all`` when it mixes several QUARD
    families), the camera's name, frame size and recording stride."""
    array = store.array(camera)
    h, w = (int(x) for x in tuple(array.shape)[1:3])
    tasks = sorted(getattr(store, "tasks", {}) or {})
    task = tasks[0] if len(tasks) == 1 else ("quard:all" if tasks and all(t.startswith("quard:") for t in tasks)
                                             else ",".join(tasks))
    name = camera.split("/", 1)[-1].rsplit("_", 1)[0]            # images/front_rgb -> front
    return {"task": task, "camera": {"name": name, "height": h, "width": w},
            "image_every": int(store.frame_stride(camera)), "control_hz": 50}


class StoreImageSource:
    """An ``ImageWindowSource`` over the image store's window sampler (``data.image_sampler``, issue 14):
    its batches (``images/<cam>`` (B, H, ...), ``next_images/<cam>``, ``mask``, ``actions`` (B, H, 12),
    ``sparse_reward``, ``next_valid``, ``last``, ``done``, ``success``, ``instruction``,
    ``episode_index``, ``frame``) become this module's batch keys. The Monte-Carlo return is
    ``success · γ^(frames to the episode's end)`` at the image rate, the transition discount γ."""

    def __init__(self, sampler: Any, store: Any, camera: str = "images/front_rgb", gamma: float = 0.98):
        if camera not in getattr(sampler, "caches", {camera: None}):
            raise ValueError(f"the image sampler does not read camera {camera!r}")
        self.sampler, self.camera, self.gamma = sampler, camera, float(gamma)
        self.history = int(sampler.history)
        self.instructions = list(sampler.instructions)
        if not self.instructions:
            raise ValueError("the image store has no instruction table (meta/instructions.json)")
        self.settings = settings_of_store(store, camera)
        self.image_size = (self.settings["camera"]["height"], self.settings["camera"]["width"])
        self._frames = np.asarray(store.frame_counts(camera), dtype=np.int64)     # (E,) frames per episode

    @property
    def num_episodes(self) -> int:
        return int(self.sampler.num_episodes)

    @property
    def num_windows(self) -> int:
        return int(self.sampler.num_windows)

    @property
    def fits_in_cache(self) -> bool:
        """Every chunk of the camera's frames fits in the sampler's cache at once."""
        cache = self.sampler.caches[self.camera]
        return -(-cache.length // cache.chunk) <= cache.capacity

    def commands(self) -> torch.Tensor:
        """(num_windows, 12) the stored command of every window's newest frame (``bins=data`` fits on it)."""
        return torch.from_numpy(self.sampler.window_actions())

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """Uniformly random windows (the success ratio when set) from the sampler's own random stream."""
        return self.convert(self.sampler.sample(int(batch_size)))

    def batches(self, batch_size: int, start_step: int = 0, mode: str = "stream",
                prefetch_depth: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """Endless training batches from ``start_step`` on, their random stream restarted from (seed, rank,
        ``start_step``): a run resumed at a step draws what an uninterrupted run that restarted there drew.
        ``mode`` "stream": the sampler's chunk-aware ``stream()`` (a resident set of chunks per pool,
        one swapped per batch; decodes a few chunks per batch); "uniform": i.i.d. windows, each may need
        its own chunk; "auto": uniform when the store's chunks all fit in the cache (i.i.d. at the same
        cost), else the stream. All keep the success:failure ratio and the success-only filter. With
        ``prefetch_depth`` the next batches are built on a thread. Close the iterator to stop it."""
        if mode not in SAMPLING_MODES:
            raise ValueError(f"sampling {mode!r} unknown; allowed: {SAMPLING_MODES}")
        if mode == "auto":
            mode = "uniform" if self.fits_in_cache else "stream"
        if mode == "stream" and getattr(self.sampler, "early_share", 0.0) > 0:
            raise ValueError(f"early_share={self.sampler.early_share} needs i.i.d. windows from the whole store; the "
                             f"chunk-aware stream cannot give them (sampling=uniform, or a cache_chunks that holds "
                             f"the store's frames)")
        s, b = self.sampler, int(batch_size)
        # the sampler draws (and stream() refreshes its chunks) from its rng: a stream of its own per segment
        s.reseed(f"vla/batches/rank{s.rank}/step{int(start_step)}")
        raw = s.stream(b) if mode == "stream" else (s.sample(b) for _ in itertools.count())
        return _Converted(prefetch(raw, prefetch_depth) if prefetch_depth else raw, self.convert)

    def fixed_batches(self, count: int, batch_size: int, seed: int) -> Callable[[], Iterator[dict[str, torch.Tensor]]]:
        """``count`` batches of windows chosen once (seeded), rebuilt from the store on each call: the same
        validation windows at every validation step, only their indices held in RAM."""
        rng = numpy_rng(seed, "vla/validation")
        size = min(int(batch_size), self.num_windows)
        picks = [rng.integers(0, self.num_windows, size=size) for _ in range(int(count))]
        return lambda: (self.convert(self.sampler.batch_at(w)) for w in picks)

    def convert(self, b: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cam = self.camera
        if "next_" + cam not in b:
            raise ValueError("the image sampler must be built with next_frame=True (GeRM's 7th frame)")
        instruction = b["instruction"].long()
        if bool((instruction < 0).any()):
            raise ValueError("image windows from episodes without an instruction (instruction_id -1)")
        success = b["success"].float()
        extra = {}
        if all(t in b for t in TARGET_TERMS):   # the named target in the robot frame (auxiliary grounding loss)
            extra["target_polar"] = target_polar(*(b[t][:, -1].float() for t in TARGET_TERMS))
        to_end = torch.from_numpy(self._frames[b["episode_index"].numpy()]) - 1 - b["frame"].long()
        return {"frames": torch.cat([b[cam], b["next_" + cam][:, None]], dim=1),             # (B, H+1, h, w, 3)
                "frame_mask": torch.cat([b["mask"].bool(), b["next_valid"].bool()[:, None]], dim=1),
                "instruction": instruction,
                "action": b["actions"][:, -1].float(),                                   # command at frame t
                "reward": b["sparse_reward"].float(),
                "discount": torch.full_like(success, self.gamma),
                "mc_return": success * self.gamma ** to_end.float(),
                "success": success, "done": b["done"].bool(), "last": b["last"].bool(), **extra}


class _Converted:
    """An iterator of sampler batches as this module's batches; ``close()`` also stops a prefetch thread."""

    def __init__(self, raw: Iterator[dict[str, torch.Tensor]], convert: Callable):
        self.raw, self.convert = raw, convert

    def __iter__(self) -> "_Converted":
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        return self.convert(next(self.raw))

    def close(self) -> None:
        close = getattr(self.raw, "close", None)
        if close is not None:
            close()


def open_image_source(path: str | Path, history: int, seed: int = 0, split: str = "all",
                      success_ratio: float | None = None, success_only: bool = False,
                      camera: str = "images/front_rgb", val_fraction: float = 0.1, rank: int = 0,
                      world_size: int = 1, cache_chunks: int = 32, ram_budget: str = "auto",
                      step_features: tuple[str, ...] = (), families: tuple[str, ...] = (),
                      early_frames: int = 0, early_share: float = 0.0) -> StoreImageSource:
    """Image windows from a trajectory store holding ``camera`` (``data.image_sampler``): ``history``
    frames + the next one, the ``hl_commands`` at each frame's step, the success/failure mix. ``split``
    "train" / "val" holds ``val_fraction`` of the episodes out by the seeded episode permutation every
    trainer uses (``data.episodes.split_episodes``: the same ``seed`` gives the same held-out episodes);
    ``rank`` / ``world_size`` take a strided shard of the windows (DDP). The per-step features come from RAM, or
    from memory-mapped shards when they exceed ``ram_budget`` (``data.ram_budget``). ``families`` keeps those
    QUARD families' episodes only (the sampler's ``families`` filter); ``step_features`` adds per-step
    features to the sampler (``training.grounding.TARGET_TERMS`` make the batches carry ``target_polar``);
    ``early_share`` of every batch comes from windows ending in an episode's first ``early_frames`` frames."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--store {path}: no trajectory store there")
    store = TrajectoryStore.open(path)
    if camera not in store.image_features:
        raise ValueError(f"--store {path}: no {camera!r} frames (image features: {list(store.image_features)}); "
                         f"collect with a camera task (quadforge collect --task quard:...)")
    in_ram = fits_in_ram(store, ["hl_commands", "rewards", "terminated", *step_features], None, ram_budget,
                         log=print if rank == 0 and split != "val" else None)
    sampler = ImageWindowSampler(store, cameras=[camera], history=history, next_frame=True,
                                 steps=None if in_ram else StepShards(store),
                                 action_feature="hl_commands", step_features=tuple(step_features), split=split,
                                 val_fraction=val_fraction, seed=seed,
                                 success_ratio=success_ratio, filters=_filters(success_only, families),
                                 rank=rank, world_size=world_size, cache_chunks=cache_chunks,
                                 early_frames=early_frames, early_share=early_share)
    return StoreImageSource(sampler, store, camera)


def _filters(success_only: bool, families: tuple[str, ...]) -> dict[str, Any] | None:
    out: dict[str, Any] = {"success_only": True} if success_only else {}
    if families:
        out["families"] = list(families)
    return out or None


# --- a synthetic source: "go left/right to the named colour" ----------------------------------------

PALETTE = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40)}
# the command a demonstration gives: walk forward at 0.5 m/s with a trot, sideways towards the target
_BASE_COMMAND = {"lin_vel_x": 0.5, "lin_vel_y": 0.0, "ang_vel_yaw": 0.0, "gait_phase": 0.5, "gait_offset": 0.0,
                 "gait_bound": 0.0, "gait_frequency": 3.0, "body_height": 0.0, "body_pitch": 0.0,
                 "stance_width": 0.25, "foot_swing_height": 0.08, "terminate": 0.0}
SIDE_SPEED = 0.5   # |vy| of the demonstration; +y is the robot's left


class ColourChoiceTask:
    """Two coloured squares, one in each half of the image, on a grey floor; the instruction "go to the
    {colour}" names one; the right command steps sideways towards it (vy = +0.5 left, -0.5 right).

    Each window is a short clip: the squares drift by up to a pixel per frame (what a walking camera
    sees), a random number of leading frames is padding (episode start). With ``success_ratio`` < 1 a
    share of rows carry the WRONG side (a failed episode: success 0), the rest are demonstrations
    (success 1, reward 1 on the episode's last frame)."""

    def __init__(self, image_size: int = 32, history: int = 6, seed: int = 0, success_ratio: float = 1.0,
                 episode_frames: int = 8, gamma: float = 0.98):
        if image_size < 12:
            raise ValueError(f"ColourChoiceTask image_size={image_size}; must be >= 12")
        self.image_size = (int(image_size), int(image_size))
        self.history = int(history)
        self.colours = list(PALETTE)
        self.instructions = [f"go to the {c}" for c in self.colours]
        self.settings = {"task": "synthetic:colour_choice",
                         "camera": {"name": "front", "height": int(image_size), "width": int(image_size)},
                         "image_every": 10, "control_hz": 50}
        self.success_ratio, self.episode_frames, self.gamma = float(success_ratio), int(episode_frames), float(gamma)
        self._rng = np.random.default_rng(seed)
        self._base = np.array([_BASE_COMMAND[n] for n in HL_COMMAND_NAMES], np.float32)
        self._vy = HL_COMMAND_NAMES.index("lin_vel_y")

    def render(self, left: np.ndarray, right: np.ndarray, frames: int) -> np.ndarray:
        """(B,) colour ids of the left/right squares -> uint8 (B, frames, H, W, 3) clips."""
        b, s = left.shape[0], self.image_size[0]
        rng = self._rng
        img = np.full((b, frames, s, s, 3), 110, np.uint8)
        img[:, :, : s // 3] = (150, 170, 200)                                 # sky band
        side = max(3, s // 5)
        palette = np.array([PALETTE[c] for c in self.colours], np.uint8)
        y0 = rng.integers(s // 3, s - side, size=b)
        for half, ids in ((0, left), (1, right)):
            x0 = rng.integers(0, s // 2 - side, size=b) + half * (s // 2)
            drift = rng.integers(-1, 2, size=(b, frames)).cumsum(1)
            for i in range(b):
                for f in range(frames):
                    x = int(np.clip(x0[i] + drift[i, f], half * (s // 2), (half + 1) * (s // 2) - side))
                    img[i, f, y0[i]:y0[i] + side, x:x + side] = palette[ids[i]]
        return img

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        b, t, rng = int(batch_size), self.history, self._rng
        k = len(self.colours)
        left = rng.integers(0, k, size=b)
        right = (left + rng.integers(1, k, size=b)) % k                       # a different colour
        target_left = rng.random(b) < 0.5
        instruction = np.where(target_left, left, right)
        frames = self.render(left, right, t + 1)
        n_real = rng.integers(1, t + 1, size=b)                               # real frames up to t
        pos = np.arange(t + 1)[None]
        step = rng.integers(0, self.episode_frames, size=b)                   # frame index within the episode
        last = step == self.episode_frames - 1
        mask = pos >= (t - n_real[:, None])
        mask[:, t] = ~last                                                    # no frame t+1 after the end
        frames[~mask] = 0
        success = rng.random(b) < self.success_ratio
        action = np.repeat(self._base[None], b, 0)
        go_left = np.where(success, target_left, ~target_left)
        action[:, self._vy] = np.where(go_left, SIDE_SPEED, -SIDE_SPEED)
        reward = (last & success).astype(np.float32)
        mc = success * self.gamma ** (self.episode_frames - 1 - step)
        return {"frames": torch.from_numpy(frames), "frame_mask": torch.from_numpy(mask),
                "instruction": torch.from_numpy(instruction.astype(np.int64)),
                "action": torch.from_numpy(action), "reward": torch.from_numpy(reward),
                "discount": torch.full((b,), self.gamma), "mc_return": torch.from_numpy(mc.astype(np.float32)),
                "success": torch.from_numpy(success.astype(np.float32)),
                "done": torch.from_numpy(last & ~success), "last": torch.from_numpy(last),
                "target_left": torch.from_numpy(target_left)}
