"""``quadforge dataset export-lerobot``: a store as a LeRobot v3 dataset (``codebase_version`` "v3.0").

What LeRobot's own ``LeRobotDataset(repo_id, root=DIR)`` reads, written with pyarrow alone (no lerobot
import here; ``tools/check_exports_external.py`` proves the layout with LeRobot's reader):

```
DIR/meta/info.json                               fps (the control rate), features, totals, file patterns
DIR/meta/tasks.parquet                           one row per task string (index) -> task_index
DIR/meta/stats.json                              mean/std/min/max/count of every numeric feature and camera
DIR/meta/episodes/chunk-000/file-000.parquet     per episode: episode_index, tasks, length,
                                                 dataset_from_index/to_index, data/chunk_index/file_index,
                                                 and quadforge's metadata (below)
DIR/data/chunk-CCC/file-FFF.parquet              one row per control step (files of ~100 MB)
```

Rows (one per step, ``fps`` = the store's control rate):
- ``observation.state``: the store's raw observation terms a deployed robot has, concatenated in schema
  order (names ``<term>.<entry>``); ``observation.environment_state``: the privileged ones
  (``quadforge.terms.PRIVILEGED_TERMS``: every ``task_*`` term, base height, height scan, friction, added
  mass), the same way; and each term on its own as ``observation.<term>``;
- ``observation.images.<camera>``: the camera frame as a PNG (LeRobot's ``image`` dtype, lossless); the
  store records a frame every ``frame_stride`` steps, so a step carries the latest frame taken (frame
  ``t // frame_stride``): new frames at the steps with ``t % frame_stride == 0`` (info.json says the stride);
- ``action``: the 12-D high-level command (``hl_commands``, what the VLAs output) or the joint
  ``actions`` (``--action command|joint``; ``auto`` takes the command when the store has it);
- ``next.reward``, ``next.done`` (the episode's last step), ``timestamp``, ``frame_index``,
  ``episode_index``, ``index``, ``task_index``.

Tasks are the episodes' instructions (the instruction table's text; a locomotion episode's skill
description); success, failure reason, the store's episode id, terrain, policy, seed, task parameters and
label are episode metadata columns of ``meta/episodes``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from quadforge.data.images import IMAGE_PREFIX, hold_frames
from quadforge.data.store import TrajectoryStore
from quadforge.terms import PRIVILEGED_TERMS, TERM_DIMS
from quadforge.output_paths import check_output_dir, folder_written_whole
from quadforge.progress import progress_bar

CODEBASE_VERSION = "v3.0"
ACTIONS = ("auto", "command", "joint")
CHUNKS_SIZE = 1000            # files per chunk folder (LeRobot's default)
DATA_FILE_MB = 100            # a data file is closed past this size (LeRobot's default)
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError("export-lerobot writes parquet with pyarrow: pip install 'quadforge[lerobot]' "
                          "(or pip install pyarrow)") from err
    return pa, pq


def action_feature(store: TrajectoryStore, action: str) -> str:
    """The store feature exported as ``action``."""
    if action not in ACTIONS:
        raise ValueError(f"--action {action!r}; allowed: {', '.join(ACTIONS)}")
    has_command = "hl_commands" in store.feature_names
    if action == "command" and not has_command:
        raise ValueError(f"--action command: {store.root} has no hl_commands (12-D high-level commands); its "
                         f"episodes were driven by a joint policy: use --action joint")
    return "hl_commands" if action == "command" or (action == "auto" and has_command) else "actions"


def camera_key(name: str) -> str:
    return "observation.images." + name[len(IMAGE_PREFIX):]


def _names(store: TrajectoryStore, name: str) -> list[str]:
    spec = store.schema.features[name]
    width = int(np.prod(spec.shape)) if spec.shape else 1
    return list(spec.names) if len(spec.names) == width else [f"{name}_{k}" for k in range(width)]


class _Layout:
    """Which store feature becomes which LeRobot feature, and the ``features`` block of info.json."""

    def __init__(self, store: TrajectoryStore, action: str):
        self.terms = [n for n in store.schema.features if n in TERM_DIMS]
        # LeRobot's split: what the robot itself senses, and what only the simulator knows (the task's
        # targets, the terrain under it, its mass and friction), which a policy trained on the state must not get
        self.vectors = {"observation.state": [t for t in self.terms if t not in PRIVILEGED_TERMS],
                        "observation.environment_state": [t for t in self.terms if t in PRIVILEGED_TERMS]}
        self.vectors = {key: terms for key, terms in self.vectors.items() if terms}
        self.cameras = list(store.image_features)
        self.action = action_feature(store, action)
        f32 = lambda shape, names: {"dtype": "float32", "shape": list(shape), "names": names}  # noqa: E731
        features: dict[str, Any] = {
            key: f32([sum(TERM_DIMS[t] for t in terms)], [f"{t}.{n}" for t in terms for n in _names(store, t)])
            for key, terms in self.vectors.items()}
        for t in self.terms:
            features[f"observation.{t}"] = f32([TERM_DIMS[t]], _names(store, t))
        for cam in self.cameras:
            spec = store.schema.features[cam]
            if spec.dtype != "uint8":   # depth: a float image, not a PNG
                features[camera_key(cam)] = f32(spec.shape, ["height", "width"])
            else:
                features[camera_key(cam)] = {"dtype": "image", "shape": list(spec.shape),
                                             "names": ["height", "width", "channels"]}
        features["action"] = f32([12], _names(store, self.action))
        features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
        features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
        features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
        for name in ("frame_index", "episode_index", "index", "task_index"):
            features[name] = {"dtype": "int64", "shape": [1], "names": None}
        self.features = features

    def arrow_schema(self, pa):
        fields = []
        for key, ft in self.features.items():
            if ft["dtype"] == "image":
                t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
            else:
                scalar = {"float32": pa.float32(), "int64": pa.int64(), "bool": pa.bool_()}[ft["dtype"]]
                t = scalar
                for n in reversed(ft["shape"] if ft["shape"] != [1] else []):
                    t = pa.list_(t, n)
            fields.append(pa.field(key, t))
        return pa.schema(fields)


def _png(frame: np.ndarray) -> bytes:
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _task_of(store: TrajectoryStore, i: int) -> str:
    """The episode's instruction (the task LeRobot conditions on); its task name when it has none."""
    text = store.instruction_text(i)
    if text:
        return text
    t = store.episodes
    task, idx = str(t["task"][i]), int(t["instruction_index"][i])
    listed = store.tasks.get(task, [])
    return listed[idx] if 0 <= idx < len(listed) else task


class _Stats:
    """Running sums for meta/stats.json (float64; cameras per channel in [0, 1], as LeRobot keeps them)."""

    def __init__(self):
        self.acc: dict[str, list] = {}

    def add(self, key: str, x: np.ndarray, axes: tuple[int, ...]) -> None:
        x = np.asarray(x, dtype=np.float64)
        s = [x.sum(axis=axes), (x * x).sum(axis=axes), x.min(axis=axes), x.max(axis=axes),
             int(np.prod([x.shape[a] for a in axes]))]
        if key not in self.acc:
            self.acc[key] = s
            return
        a = self.acc[key]
        self.acc[key] = [a[0] + s[0], a[1] + s[1], np.minimum(a[2], s[2]), np.maximum(a[3], s[3]), a[4] + s[4]]

    def to_json(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
        out = {}
        for key, (total, squares, lo, hi, n) in self.acc.items():
            mean = total / n
            std = np.sqrt(np.maximum(squares / n - mean * mean, 0.0))
            shape = shapes.get(key)
            fix = (lambda v: np.reshape(v, shape).tolist()) if shape else (lambda v: np.atleast_1d(v).tolist())
            out[key] = {"mean": fix(mean), "std": fix(std), "min": fix(lo), "max": fix(hi), "count": [n]}
        return out


def _episode_rows(store: TrajectoryStore, layout: _Layout, data: dict[str, np.ndarray], i: int,
                  first_index: int, task_index: int, stats: _Stats) -> dict[str, Any]:
    t = store.episodes
    lo, hi = int(t["start"][i]), int(t["end"][i])
    n = hi - lo
    stride = store.schema.frame_stride or 1
    cols: dict[str, Any] = {}
    for key, terms in layout.vectors.items():
        cols[key] = np.concatenate([data[term][lo:hi].reshape(n, -1) for term in terms], axis=1)
    for term in layout.terms:
        cols[f"observation.{term}"] = data[term][lo:hi].reshape(n, -1)
    for cam in layout.cameras:
        f0, k = int(store.frame_starts(cam)[i]), int(store.frame_counts(cam)[i])
        frames = np.asarray(store.array(cam)[f0:f0 + k])
        held = hold_frames(frames, n, stride)
        key = camera_key(cam)
        if frames.dtype == np.uint8:
            pngs = [_png(f) for f in frames]   # each frame encoded once, then held over its steps
            cols[key] = [{"bytes": pngs[s // stride], "path": None} for s in range(n)]
            stats.add(key, np.moveaxis(held, -1, 0) / 255.0, (1, 2, 3))
        else:
            cols[key] = held
            stats.add(key, held, (0,))
    cols["action"] = data[layout.action][lo:hi].reshape(n, -1)
    cols["next.reward"] = data["rewards"][lo:hi].astype(np.float32) if "rewards" in data else np.zeros(n, np.float32)
    done = np.zeros(n, dtype=bool)
    done[-1] = True
    cols["next.done"] = done
    steps = np.arange(n, dtype=np.int64)
    cols["timestamp"] = (steps * store.schema.control_dt).astype(np.float32)
    cols["frame_index"] = steps
    cols["episode_index"] = np.full(n, i, dtype=np.int64)
    cols["index"] = first_index + steps
    cols["task_index"] = np.full(n, task_index, dtype=np.int64)
    for key in (*layout.vectors, "action", "next.reward", *(f"observation.{x}" for x in layout.terms)):
        stats.add(key, np.asarray(cols[key]).reshape(n, -1) if key != "next.reward" else cols[key][:, None], (0,))
    return cols


def _arrow_table(pa, schema, cols: dict[str, Any]):
    arrays = []
    for field in schema:
        v = cols[field.name]
        if isinstance(v, np.ndarray) and v.ndim > 1 and not pa.types.is_fixed_size_list(field.type):
            v = v.reshape(len(v))   # a one-entry term (base_height, friction): LeRobot keeps shape [1] a scalar
        if isinstance(v, np.ndarray) and v.ndim > 1:   # fixed-size lists, nested for images
            flat = pa.array(v.reshape(-1))
            for size in reversed(v.shape[1:]):
                flat = pa.FixedSizeListArray.from_arrays(flat, size)
            arrays.append(flat.cast(field.type))
        else:
            arrays.append(pa.array(v, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


class _DataFiles:
    """data/chunk-CCC/file-FFF.parquet, a new file once the current one passes ``DATA_FILE_MB``."""

    def __init__(self, root: Path, pq, schema):
        self.root, self.pq, self.schema = root, pq, schema
        self.chunk, self.file, self.writer, self.path = 0, -1, None, None

    def _next(self) -> None:
        self.close()
        self.file += 1
        if self.file == CHUNKS_SIZE:
            self.chunk, self.file = self.chunk + 1, 0
        self.path = self.root / DATA_PATH.format(chunk_index=self.chunk, file_index=self.file)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = self.pq.ParquetWriter(self.path, self.schema, compression="snappy")

    def write(self, table) -> tuple[int, int]:
        if self.writer is None or self.path.stat().st_size > DATA_FILE_MB * (1 << 20):
            self._next()
        self.writer.write_table(table)
        return self.chunk, self.file

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _tasks_table(pa, tasks: list[str]):
    """meta/tasks.parquet as pandas writes a frame indexed by the task string (LeRobot reads it with pandas)."""
    meta = {"index_columns": ["task"], "column_indexes": [], "pandas_version": "2.2.0",
            "creator": {"library": "pyarrow", "version": pa.__version__},
            "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                         "numpy_type": "int64", "metadata": None},
                        {"name": "task", "field_name": "task", "pandas_type": "unicode",
                         "numpy_type": "object", "metadata": None}]}
    schema = pa.schema([("task_index", pa.int64()), ("task", pa.string())],
                       metadata={b"pandas": json.dumps(meta).encode()})
    return pa.Table.from_arrays([pa.array(range(len(tasks)), pa.int64()), pa.array(tasks, pa.string())],
                                schema=schema)


def _episode_metadata(store: TrajectoryStore, i: int) -> dict[str, Any]:
    t = store.episodes
    return {"success": bool(t["success"][i]), "failure_reason": str(t["failure_reason"][i]),
            "store_episode_id": str(t["episode_id"][i]), "terrain_type": str(t["terrain_type"][i]),
            "policy_id": str(t["policy_id"][i]), "seed": int(t["seed"][i]),
            "task_params": json.dumps(t["task_params"][i], sort_keys=True),
            "label": json.dumps(t["label"][i], sort_keys=True)}


def _episodes_table(pa, rows: list[dict[str, Any]]):
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    types = {"tasks": pa.list_(pa.string())}
    return pa.table({k: pa.array(v, type=types.get(k)) for k, v in cols.items()})


def export_lerobot(store_path: str | Path, out_dir: str | Path, action: str = "auto",
                   progress: bool = False) -> dict[str, Any]:
    """Write the store as a LeRobot v3 dataset in ``out_dir`` (a new or empty folder); returns info.json.
    ``progress``: a bar (stderr, on a terminal) over the episodes written."""
    pa, pq = _pyarrow()
    out = Path(out_dir)
    if (out / "meta" / "info.json").is_file():   # an earlier export: say so, not "not a LeRobot dataset"
        raise ValueError(f"export-lerobot --output {out}: holds an earlier LeRobot export; an export is written "
                         f"whole into a new or empty folder (no stale files of another): give a new --output")
    check_output_dir(out, "LeRobot dataset", flag="export-lerobot --output")   # new or empty: no stale files
    store = TrajectoryStore.open(store_path)
    if store.num_episodes == 0:
        raise ValueError(f"{store.root}: no episodes to export")
    fps = store.schema.control_rate_hz
    if abs(fps - round(fps)) > 1e-6:
        raise ValueError(f"{store.root}: control rate {fps:g} Hz; LeRobot needs whole frames per second")
    layout = _Layout(store, action)
    schema = layout.arrow_schema(pa)
    images = set(store.image_features)
    data = store.load([n for n in store.feature_names if n not in images])
    tasks: list[str] = []
    with folder_written_whole(out, "export-lerobot --output"):   # a failed export leaves no half dataset
        stats, files = _Stats(), _DataFiles(out, pq, schema)
        episode_rows, index = [], 0
        try:
            for i in progress_bar(store.num_episodes, desc="export-lerobot", unit="episode", enabled=progress,
                                  iterable=range(store.num_episodes)):
                task = _task_of(store, i)
                if task not in tasks:
                    tasks.append(task)
                cols = _episode_rows(store, layout, data, i, index, tasks.index(task), stats)
                n = len(cols["index"])
                chunk, file = files.write(_arrow_table(pa, schema, cols))
                episode_rows.append({"episode_index": i, "tasks": [task], "length": n,
                                     "data/chunk_index": chunk, "data/file_index": file,
                                     "dataset_from_index": index, "dataset_to_index": index + n,
                                     "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0,
                                     **_episode_metadata(store, i)})
                index += n
        finally:
            files.close()
        (out / "meta" / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(_episodes_table(pa, episode_rows), out / EPISODES_PATH)
        pq.write_table(_tasks_table(pa, tasks), out / "meta" / "tasks.parquet")
        shapes = {k: ((3, 1, 1) if v["dtype"] == "image" else None) for k, v in layout.features.items()}
        (out / "meta" / "stats.json").write_text(json.dumps(stats.to_json(shapes), indent=2))
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": store.schema.robot or None,
                "total_episodes": store.num_episodes, "total_frames": index, "total_tasks": len(tasks),
                "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": DATA_FILE_MB, "video_files_size_in_mb": 200,
                "fps": int(round(fps)), "splits": {"train": f"0:{store.num_episodes}"},
                "data_path": DATA_PATH, "video_path": None, "features": layout.features,
                "quadforge": {"store": store.root.name, "generation": store.generation,
                              "action_feature": layout.action, "frame_stride": store.schema.frame_stride,
                              "frames": "a step carries the latest camera frame: frame t // frame_stride, "
                                        "new at steps with t % frame_stride == 0"}}
        (out / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    return info
