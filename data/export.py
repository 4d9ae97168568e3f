"""HDF5 export/import in a robomimic-like layout, for tools that expect it.

```
/data                      attrs: format, total, schema (JSON), tasks (JSON), env_args (JSON),
                           instructions (JSON list: the store's instruction table)
/data/demo_<i>/obs/<term>  raw observation terms of store episode i (T rows), its task_* terms and
                           per-step instruction index, and images/<camera> (its ceil(T / stride) frames;
                           frame j = step j * stride, the stride in the schema and the demo's frame_stride)
/data/demo_<i>/actions     (T, 12)          /data/demo_<i>/rewards (T,)
/data/demo_<i>/dones       (T,) uint8, 1 at the episode's last step (robomimic's convention)
/data/demo_<i>/<other>     the remaining per-step features (joint_targets, terminated, time_outs, ...)
    attrs: num_samples, frame_stride (with images) and every episode-table column (label, extra,
    task_params as JSON strings)
/mask/<filter>             demo names: success, failure, terrain_<type>
```
Import writes each demo as a staging file with its original episode id and compacts, keeping the
demo order, so export -> import -> export reproduces the file's contents bit for bit.
"""
from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from quadforge.data.admission import check_store_accepts
from quadforge.data.images import is_image
from quadforge.data.instructions import InstructionTable
from quadforge.data.schema import TASK_PREFIX
from quadforge.data.locks import locked
from quadforge.data.staging import write_staging_file, writer_lock_path
from quadforge.data.compaction import compact
from quadforge.data.store import COLUMNS, DICT_COLUMNS, TrajectoryStore
from quadforge.layout import TERM_DIMS
from quadforge.output_paths import check_output_dir, check_output_file, is_store_dir

FORMAT = "quadforge-robomimic-1"
DERIVED_COLUMNS = ("start", "end", "length", "instruction_id")


def _is_obs(name: str) -> bool:
    return name in TERM_DIMS or is_image(name) or name.startswith(TASK_PREFIX) or name == "instruction"


def export_hdf5(store_path: str | Path, h5_path: str | Path, compression: str | None = None) -> int:
    """Write the whole store to ``h5_path``; returns the number of demos."""
    import h5py
    out = check_output_file(h5_path, flag="export-hdf5 OUTPUT")   # before reading a byte of the store
    store = TrajectoryStore.open(store_path)
    # per-step features in RAM; images are read episode by episode from their chunks (they may not fit)
    images = store.image_features
    data = store.load([n for n in store.feature_names if n not in images])
    frame_lo = {name: store.frame_starts(name) for name in images}
    frame_n = {name: store.frame_counts(name) for name in images}
    table = store.episodes
    out.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(out, "w", track_order=True) as f:
        g = f.create_group("data", track_order=True)
        g.attrs["format"] = FORMAT
        g.attrs["total"] = store.num_steps
        g.attrs["schema"] = json.dumps(store.schema.to_dict(), sort_keys=True)
        g.attrs["tasks"] = json.dumps(store.tasks, sort_keys=True)
        g.attrs["env_args"] = json.dumps({"robot": store.schema.robot, "control_dt": store.schema.control_dt})
        if store.instructions:
            g.attrs["instructions"] = json.dumps(store.instructions)
        masks: dict[str, list[str]] = {"success": [], "failure": []}
        for i in range(len(table)):
            name = f"demo_{i}"
            lo, hi = int(table["start"][i]), int(table["end"][i])
            d = g.create_group(name, track_order=True)
            for feat in sorted(store.feature_names):
                key = f"obs/{feat}" if _is_obs(feat) else feat
                if feat in frame_lo:
                    f0 = int(frame_lo[feat][i])
                    value = np.asarray(store.array(feat)[f0:f0 + int(frame_n[feat][i])])
                else:
                    value = data[feat][lo:hi]
                d.create_dataset(key, data=value, compression=compression)
            dones = np.zeros(hi - lo, dtype=np.uint8)
            dones[-1] = 1
            d.create_dataset("dones", data=dones)
            d.attrs["num_samples"] = hi - lo
            if images:
                d.attrs["frame_stride"] = store.schema.frame_stride
            for col in COLUMNS:
                v = table[col][i]
                v = v.item() if isinstance(v, np.generic) else v
                d.attrs[col] = json.dumps(v, sort_keys=True) if col in DICT_COLUMNS else v
            masks["success" if table["success"][i] else "failure"].append(name)
            masks.setdefault(f"terrain_{table['terrain_type'][i] or 'unknown'}", []).append(name)
        m = f.create_group("mask", track_order=True)
        for key in sorted(masks):
            m.create_dataset(key, data=np.asarray(masks[key], dtype="S"))
    return len(table)


def _attr(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    return v.item() if isinstance(v, np.generic) else v


def import_hdf5(h5_path: str | Path, store_path: str | Path) -> int:
    """Append the demos of an exported file to a store (created if absent); returns demos imported."""
    import h5py
    src = Path(h5_path)
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no such HDF5 file")
    if not h5py.is_hdf5(str(src)):
        raise ValueError(f"{src}: not an HDF5 file (no HDF5 signature); import-hdf5 reads files written by "
                         f"`quadforge dataset export-hdf5`")
    check_output_dir(store_path, "trajectory store", owns=is_store_dir, flag="import-hdf5 --store")
    try:
        with h5py.File(src, "r") as f:
            if "data" not in f or _attr(f["data"].attrs.get("format")) != FORMAT:
                raise ValueError(f"{src}: not a quadforge HDF5 export (want /data with format={FORMAT!r})")
            env_args = json.loads(_attr(f["data"].attrs["env_args"]))
            check_store_accepts(store_path, robot=env_args.get("robot"), control_dt=env_args.get("control_dt"),
                                what=f"{src}")
    except (KeyError, OSError, TypeError) as err:
        raise ValueError(f"{src}: damaged or not a quadforge HDF5 export ({type(err).__name__}: {err})") from err
    Path(store_path).mkdir(parents=True, exist_ok=True)
    known = TrajectoryStore.existing_episode_ids(store_path)
    known_rows = _known_rows(store_path)
    imported = 0
    held: set[str] = set()
    # like a collector's writer, the import holds the writer lock of each collector id it stages under:
    # a compaction meanwhile then knows its temp files are live, and a running collector of that id refuses it
    with h5py.File(src, "r") as f, ExitStack() as writer_locks:
        g = f["data"]
        env_args = json.loads(_attr(g.attrs["env_args"]))
        tasks = json.loads(_attr(g.attrs.get("tasks", "{}")))
        table = InstructionTable(json.loads(_attr(g.attrs.get("instructions", "[]"))))
        names = sorted(g.keys(), key=lambda k: int(k.split("_")[1]))
        last_id = ""
        for name in names:
            d = g[name]
            attrs = {k: _attr(v) for k, v in d.attrs.items()}
            eid = str(attrs["episode_id"])
            if eid in known:
                # the same id is the same episode (a re-import) - unless another store's ids collide
                # with this one's: skipping that would silently drop a different episode
                row = known_rows.get(eid)
                if row is not None and row != (int(attrs.get("num_samples", -1)), int(attrs.get("seed", -1))):
                    raise ValueError(f"{src}: demo {name} has episode id {eid!r}, which {store_path} already holds "
                                     f"for a different episode (length, seed {row} vs "
                                     f"{(int(attrs.get('num_samples', -1)), int(attrs.get('seed', -1)))}); "
                                     f"import into a new store")
                continue
            if eid < last_id:  # compaction consumes staging files by name: keep the demo order
                compact(store_path)
            last_id = eid
            features = {k: np.asarray(d["obs"][k]) for k in _walk(d["obs"])}
            features.update({k: np.asarray(d[k]) for k in d.keys() if k not in ("obs", "dones")})
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


def _known_rows(store_path: str | Path) -> dict[str, tuple[int, int]]:
    """(length, seed) of every episode a store holds (committed or staged), by id."""
    from quadforge.data.staging import list_staged, read_staged_header
    rows: dict[str, tuple[int, int]] = {}
    if (Path(store_path) / "manifest.json").is_file():
        t = TrajectoryStore.open(store_path).episodes
        rows = {str(e): (int(n), int(sd)) for e, n, sd in zip(t["episode_id"], t["length"], t["seed"])}
    for p in list_staged(store_path):
        _, info = read_staged_header(p)
        rows.setdefault(p.stem, (int(info.get("length", -1)), int(info.get("seed", -1))))
    return rows


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
