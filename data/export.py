"""HDF5 export/import in robomimic's layout (robomimic 0.3's ``SequenceDataset`` reads it as it is).

```
/data                       attrs: total (steps), env_args (JSON: env_name, type, env_kwargs {robot,
                            control_dt, frame_stride}; robomimic cannot build this env, the args describe it),
                            and quadforge's own: format, schema, tasks, instructions (the instruction table),
                            cameras ({obs key: store feature}), frame_stride
/data/demo_<i>/obs/<key>    store episode i's raw observation terms, task_* terms and per-step instruction
                            index (T rows), and each camera under its own key (``front_rgb``) at one row
                            per step: step t carries the latest frame taken, frame t // frame_stride
/data/demo_<i>/next_obs/<key>   obs one step on (the last row repeats: the observation after an episode's
                            last step is not stored)
/data/demo_<i>/actions      (T, 12)   rewards (T,)   dones (T,) uint8, 1 at the last step (robomimic's convention)
/data/demo_<i>/states       (T, D) float32: every raw observation term concatenated (names in its attrs);
                            not a MuJoCo state - quadforge stores none, so robomimic cannot replay a demo
/data/demo_<i>/<other>      the remaining per-step features (joint_targets, terminated, time_outs, pushed, ...)
    attrs: num_samples, frame_stride (with images) and every episode-table column (label, extra,
    task_params as JSON strings)
/mask/<filter>              demo names: train / valid (the 90 / 10 episode split of data.episodes.split_episodes,
                            seed 0), success, failure, terrain_<type>
```
Import writes each demo as a staging file with its original episode id and compacts, keeping the
demo order, so export -> import -> export reproduces the file's contents bit for bit; files of the
first layout (``quadforge-robomimic-1``: frames every ``frame_stride`` steps under ``obs/images/``) still import.
"""
from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from quadforge.data.admission import check_store_accepts
from quadforge.data.compaction import compact
from quadforge.data.episodes import split_episodes
from quadforge.data.images import IMAGE_PREFIX, hold_frames, is_image, subsample
from quadforge.data.instructions import InstructionTable
from quadforge.data.locks import locked
from quadforge.data.schema import TASK_PREFIX
from quadforge.data.staging import COLLECTOR_ID_RE, COLLECTOR_ID_RULE, write_staging_file, writer_lock_path
from quadforge.data.writer import StagingWriter
from quadforge.data.episode_table import COLUMNS, DICT_COLUMNS
from quadforge.data.store import TrajectoryStore
from quadforge.terms import TERM_DIMS
from quadforge.output_paths import (check_output_dir, check_output_file, file_written_whole, is_hdf5_file,
                                   is_store_dir)
from quadforge.progress import progress_bar

FORMAT = "quadforge-robomimic-2"
FORMATS = ("quadforge-robomimic-1", FORMAT)      # what import reads
DERIVED_COLUMNS = ("start", "end", "length", "instruction_id")
VALID_FRACTION, SPLIT_SEED = 0.1, 0
# robomimic's EnvType.GYM_TYPE: the closest of its env types; robomimic cannot build this env
ROBOMIMIC_ENV_TYPE = 2


def _is_obs(name: str) -> bool:
    return name in TERM_DIMS or is_image(name) or name.startswith(TASK_PREFIX) or name == "instruction"


def obs_key(name: str) -> str:
    """A store feature's key under obs/: the feature itself, a camera without its images/ prefix."""
    return name[len(IMAGE_PREFIX):] if is_image(name) else name


def _env_args(store: TrajectoryStore) -> dict[str, Any]:
    kwargs = {"robot": store.schema.robot, "control_dt": store.schema.control_dt,
              "frame_stride": store.schema.frame_stride}
    return {"env_name": f"quadforge:{store.schema.robot or 'robot'}", "type": ROBOMIMIC_ENV_TYPE,
            "env_kwargs": kwargs, **kwargs}


def _masks(table, names: list[str]) -> dict[str, list[str]]:
    n = len(names)
    masks: dict[str, list[str]] = {"success": [], "failure": [],
                                   "train": [names[i] for i in split_episodes(n, "train", VALID_FRACTION, SPLIT_SEED)],
                                   "valid": [names[i] for i in split_episodes(n, "val", VALID_FRACTION, SPLIT_SEED)]}
    for i, name in enumerate(names):
        masks["success" if table["success"][i] else "failure"].append(name)
        masks.setdefault(f"terrain_{table['terrain_type'][i] or 'unknown'}", []).append(name)
    return masks


def _dataset(group, name: str, data: np.ndarray, compression: str | None):
    """Every dataset with HDF5's Fletcher-32 checksum per chunk: a reader (the import, h5py, robomimic) gets
    an error at a damaged chunk, never its bytes as data."""
    return group.create_dataset(name, data=data, compression=compression, fletcher32=True)


def _write_demo(d, store: TrajectoryStore, data: dict[str, np.ndarray], i: int, compression: str | None) -> None:
    table = store.episodes
    lo, hi = int(table["start"][i]), int(table["end"][i])
    n = hi - lo
    stride = store.schema.frame_stride or 1
    obs: dict[str, np.ndarray] = {}
    for feat in sorted(store.feature_names):
        if is_image(feat):
            f0 = int(store.frame_starts(feat)[i])
            frames = np.asarray(store.array(feat)[f0:f0 + int(store.frame_counts(feat)[i])])
            value = hold_frames(frames, n, stride)   # images are read episode by episode, never all at once
        else:
            value = data[feat][lo:hi]
        if _is_obs(feat):
            obs[obs_key(feat)] = value
        else:
            _dataset(d, feat, value, compression)
    for group, shift in (("obs", 0), ("next_obs", 1)):
        rows = np.minimum(np.arange(n) + shift, n - 1)
        for key in sorted(obs):
            _dataset(d, f"{group}/{key}", obs[key][rows] if shift else obs[key], compression)
    terms = [t for t in sorted(store.feature_names) if t in TERM_DIMS]
    states = _dataset(d, "states", np.concatenate([obs[t].reshape(n, -1) for t in terms], axis=1)
                      .astype(np.float32), compression)
    states.attrs["terms"] = json.dumps(terms)
    dones = np.zeros(n, dtype=np.uint8)
    dones[-1] = 1
    _dataset(d, "dones", dones, None)
    d.attrs["num_samples"] = n
    if store.image_features:
        d.attrs["frame_stride"] = stride
    for col in COLUMNS:
        v = table[col][i]
        v = v.item() if isinstance(v, np.generic) else v
        d.attrs[col] = json.dumps(v, sort_keys=True) if col in DICT_COLUMNS else v


def export_hdf5(store_path: str | Path, h5_path: str | Path, compression: str | None = None,
                progress: bool = False) -> int:
    """Write the whole store to ``h5_path`` in robomimic's layout; returns the number of demos.
    ``progress``: a bar (stderr, on a terminal) over the demos written."""
    import h5py
    # before reading a byte of the store; an existing file is replaced only if it is an earlier export
    out = check_output_file(h5_path, flag="export-hdf5 --output", owns=is_hdf5_file)
    store = TrajectoryStore.open(store_path)
    images = store.image_features
    data = store.load([n for n in store.feature_names if n not in images])   # per-step features in RAM
    table = store.episodes
    names = [f"demo_{i}" for i in range(len(table))]
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_written_whole(out, "export-hdf5 --output") as partial, h5py.File(partial, "w", track_order=True) as f:
        g = f.create_group("data", track_order=True)
        g.attrs["format"] = FORMAT
        g.attrs["total"] = store.num_steps
        g.attrs["schema"] = json.dumps(store.schema.to_dict(), sort_keys=True)
        g.attrs["tasks"] = json.dumps(store.tasks, sort_keys=True)
        g.attrs["env_args"] = json.dumps(_env_args(store), sort_keys=True)
        if store.instructions:
            g.attrs["instructions"] = json.dumps(store.instructions)
        if images:
            g.attrs["cameras"] = json.dumps({obs_key(c): c for c in images}, sort_keys=True)
            g.attrs["frame_stride"] = store.schema.frame_stride
        for i, name in enumerate(progress_bar(len(names), desc="export-hdf5", unit="demo", enabled=progress,
                                              iterable=names)):
            _write_demo(g.create_group(name, track_order=True), store, data, i, compression)
        m = f.create_group("mask", track_order=True)
        masks = _masks(table, names)
        for key in sorted(masks):
            _dataset(m, key, np.asarray(masks[key], dtype="S"), None)
    return len(table)


def _attr(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    return v.item() if isinstance(v, np.generic) else v


def import_hdf5(h5_path: str | Path, store_path: str | Path, collector_id: str | None = None) -> int:
    """Append the demos of an exported file to a store (created if absent); returns demos imported.
    ``collector_id``: stage every demo under this collector's next ids instead of its own (merging stores
    whose ids collide: two collections under the default ``main``), its own id kept as ``source_episode_id``
    in the episode's record; a demo whose id this collector already imported is skipped."""
    import h5py
    src = Path(h5_path)
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no such HDF5 file")
    if not h5py.is_hdf5(str(src)):
        raise ValueError(f"{src}: not an HDF5 file (no HDF5 signature); import-hdf5 reads files written by "
                         f"`quadforge dataset export-hdf5`")
    check_output_dir(store_path, "trajectory store", owns=is_store_dir, flag="import-hdf5 --store")
    if collector_id is not None and not COLLECTOR_ID_RE.match(str(collector_id)):
        raise ValueError(f"import-hdf5 --collector-id={collector_id!r} is invalid; allowed: {COLLECTOR_ID_RULE}")
    try:
        with h5py.File(src, "r") as f:
            if "data" not in f or _attr(f["data"].attrs.get("format")) not in FORMATS:
                raise ValueError(f"{src}: not a quadforge HDF5 export (want /data with format in {FORMATS})")
            env_args = json.loads(_attr(f["data"].attrs["env_args"]))
            cameras = json.loads(_attr(f["data"].attrs.get("cameras", "{}")))
            stride = int(_attr(f["data"].attrs.get("frame_stride", 1))) if cameras else None
            check_store_accepts(store_path, robot=env_args.get("robot"), control_dt=env_args.get("control_dt"),
                                frame_stride=stride, what=f"{src}")
    except (KeyError, OSError, TypeError) as err:
        raise ValueError(f"{src}: damaged or not a quadforge HDF5 export ({type(err).__name__}: {err})") from err
    Path(store_path).mkdir(parents=True, exist_ok=True)
    stored = _stored_episodes(store_path)
    known, known_rows = {row[0] for row in stored}, _known_rows(stored)
    imported = 0
    held: set[str] = set()
    # like a collector's writer, the import holds the writer lock of each collector id it stages under:
    # a compaction meanwhile then knows its temp files are live, and a running collector of that id refuses it
    with h5py.File(src, "r") as f, ExitStack() as writer_locks:
        writer = None if collector_id is None else writer_locks.enter_context(StagingWriter(store_path, collector_id))
        sources = set() if collector_id is None else _imported_sources(stored, collector_id)
        g = f["data"]
        env_args = json.loads(_attr(g.attrs["env_args"]))
        tasks = json.loads(_attr(g.attrs.get("tasks", "{}")))
        table = InstructionTable(json.loads(_attr(g.attrs.get("instructions", "[]"))))
        cameras = json.loads(_attr(g.attrs.get("cameras", "{}")))   # obs key -> store feature (layout 2)
        names = sorted(g.keys(), key=lambda k: int(k.split("_")[1]))
        last_id = ""
        for name in names:
            d = g[name]
            attrs = {k: _attr(v) for k, v in d.attrs.items()}
            eid = str(attrs["episode_id"])
            if writer is not None:
                if eid in sources:   # imported under this collector id before
                    continue
            elif eid in known:
                # the same id is the same episode (a re-import) - unless another store's ids collide
                # with this one's: skipping that would silently drop a different episode
                row, mine = known_rows.get(eid), _identity(int(attrs.get("num_samples", -1)),
                                                            int(attrs.get("seed", -1)), attrs.get("extra"))
                if row is not None and not _same_episode(row, mine):
                    raise ValueError(f"{src}: demo {name} has episode id {eid!r}, which {store_path} already holds "
                                     f"for a different episode (length {row[0]} vs {mine[0]}, seed {row[1]} vs "
                                     f"{mine[1]}, per-episode record {'equal' if row[2] == mine[2] else 'differs'}); "
                                     f"import into a new store, or under new ids with --collector-id NEW "
                                     f"(merging two stores collected under one id)")
                continue
            if writer is None and eid < last_id:  # compaction consumes staging files by name: keep the demo order
                compact(store_path)
            last_id = eid
            try:
                features = _demo_features(d, cameras)
            except OSError as err:   # a chunk failing its checksum, or a file cut short
                compact(store_path)   # what came before it is whole: merged, so a rerun starts after it
                raise ValueError(f"{src}: demo {name} is damaged ({err}); the {imported} demo(s) before it are in "
                                 f"{store_path}, and a rerun of this import skips them") from err
            info = {k: v for k, v in attrs.items() if k not in DERIVED_COLUMNS + DICT_COLUMNS + ("num_samples",)}
            info.update(json.loads(attrs.get("extra", "{}")))
            info["label"] = json.loads(attrs.get("label", "{}"))
            info["task_params"] = json.loads(attrs.get("task_params", "{}"))
            iid = int(attrs.get("instruction_id", -1))
            if 0 <= iid < len(table):
                info["instruction_text"] = table.texts[iid]
            if "instruction" in features:   # the export's numbering, translated back by compaction
                info["instructions"] = table.used_texts(features["instruction"])
            idx = int(info.pop("instruction_index", -1))
            task_instr = tasks.get(info.get("task", ""), [])
            if 0 <= idx < len(task_instr):
                info["instruction"] = task_instr[idx]
            else:
                info["instruction_index"] = idx
            text = info.pop("instruction_text", None)
            if text is not None:
                info["instruction"] = text
            info.update(robot=env_args.get("robot", ""), control_dt=env_args.get("control_dt", 0.02))
            if writer is not None:   # new ids follow the demo order: no reordering to guard against
                info["source_episode_id"] = eid
                writer.write_episode(features, info)
                imported += 1
                continue
            cid = str(attrs["collector_id"])
            if cid not in held:
                held.add(cid)
                writer_locks.enter_context(locked(writer_lock_path(store_path, cid), f"import-hdf5 writer {cid!r}",
                                                  hint="a collector of this id is writing to the store"))
            write_staging_file(store_path, eid, cid, features, info)
            imported += 1
    result = compact(store_path)
    if result.quarantined:
        raise ValueError(f"{src}: {len(result.quarantined)} demo(s) could not join {store_path} and were "
                         f"quarantined: {result.quarantined[:3]} (see the .reason.txt files)")
    return imported


def _identity(length: int, seed: int, extra) -> tuple[int, int, str | None]:
    """What tells two episodes under one id apart: length, the run's seed (shared by every episode of a
    collection run, so not enough alone) and the episode's own record (``extra``: its distances, tracking
    errors, env id, ... - floats no two episodes share), as canonical JSON; None where unknown."""
    if isinstance(extra, str):
        extra = json.loads(extra)
    return length, seed, None if extra is None else json.dumps(extra, sort_keys=True)


def _same_episode(a: tuple, b: tuple) -> bool:
    return all(x == y for x, y in zip(a, b) if x is not None and y is not None)


def _stored_episodes(store_path: str | Path) -> list[tuple[str, str, int, int, dict[str, Any], bool]]:
    """(episode id, collector id, length, run seed, record, staged) of every episode a store holds: the
    record is a committed episode's ``extra``, a staged one's info (its header: the data is not read)."""
    from quadforge.data.staging import list_staged, read_staged_header
    rows = []
    if (Path(store_path) / "manifest.json").is_file():
        t = TrajectoryStore.open(store_path).episodes
        rows += [(str(e), str(c), int(n), int(sd), x, False) for e, c, n, sd, x in
                 zip(t["episode_id"], t["collector_id"], t["length"], t["seed"], t["extra"])]
    for p in list_staged(store_path):
        _, info = read_staged_header(p)
        rows.append((p.stem, str(info.get("collector_id", "")), int(info.get("length", -1)),
                     int(info.get("seed", -1)), info, True))
    return rows


def _known_rows(stored: list[tuple]) -> dict[str, tuple[int, int, str | None]]:
    """``_identity`` of every stored episode, by id (a staged one's record is not yet its ``extra``: unknown)."""
    rows: dict[str, tuple[int, int, str | None]] = {}
    for eid, _, length, seed, record, staged in stored:
        rows.setdefault(eid, _identity(length, seed, None if staged else record))
    return rows


def _imported_sources(stored: list[tuple], collector_id: str) -> set[str]:
    """The ``source_episode_id`` of every stored episode of ``collector_id`` (an import under a new id)."""
    return {str(record["source_episode_id"]) for _, cid, _, _, record, _ in stored
            if cid == collector_id and "source_episode_id" in record}


def _walk(group, prefix: str = "") -> list[str]:
    """Dataset paths under an h5 group (images live one level deeper: images/<camera>)."""
    out = []
    for k in group.keys():
        item = group[k]
        if hasattr(item, "keys"):
            out += _walk(item, f"{prefix}{k}/")
        else:
            out.append(f"{prefix}{k}")
    return out


def _demo_features(d, cameras: dict[str, str]) -> dict[str, np.ndarray]:
    """A demo's store features: obs/ (cameras back to their recorded frames) and the per-step datasets;
    next_obs/, states and dones are derived on export."""
    features = {}
    for key in _walk(d["obs"]):
        value = np.asarray(d["obs"][key])
        if key in cameras:   # one row per step -> the frames taken, every frame_stride-th row
            features[cameras[key]] = subsample(value, int(d.attrs.get("frame_stride", 1)))
        else:
            features[key] = value
    features.update({k: np.asarray(d[k]) for k in d.keys() if k not in ("obs", "next_obs", "dones", "states")})
    return features
