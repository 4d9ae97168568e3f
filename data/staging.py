"""Collectors' write path: one immutable staging file per episode, made visible by an atomic rename.

A staging file is ``<store>/staging/<episode_id>.episode``: the magic line ``QFEPISODE1``, an 8-byte
little-endian header length, a JSON header ``{"info": {...}, "features": {name: {dtype, shape,
offset}}}`` and then each feature's raw C-order bytes (64-byte aligned). The header alone tells
compaction every feature's dtype and shape, and the data loads as zero-copy numpy views - npz's
per-member zip and header parsing cost more than the copy itself. It is written under a dot-prefixed
temp name, fsynced, renamed into place and the directory fsynced, so a reader (the compactor) sees
either the whole file or nothing. Episode ids are ``<collector_id>-<counter:08d>``; a writer resumes
its counter after the highest id of its collector already in the store or staged.

A write that fails (the disk full) removes its temp file and raises ``JobFailed`` naming the store; a
temp file left by a killed writer (``staging/.tmp-<episode_id>-<pid>.episode``) is a *partial write*:
every writer holds its collector's lock ``staging/.writer-<collector_id>.lock`` while it writes, so a
partial write whose collector's lock is free has no writer left. The collector's next writer and every
compaction remove those (``remove_partial_writes``); ``dataset validate`` reports them.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from quadforge.data.images import frame_stride_of
from quadforge.data.integrity import crc_rows
from quadforge.data.locks import is_held
from quadforge.data.schema import check_episode, spec_for
from quadforge.errors import JobFailed, is_write_failure, os_reason
from quadforge.typed_values import is_flag, is_whole

STAGING_DIR = "staging"
QUARANTINE_DIR = "quarantine"
SUFFIX = ".episode"
MAGIC = b"QFEPISODE1\n"
_ALIGN = 64
# not starting with "." : staging and compaction skip hidden files (a writer's temp files and locks), so
# the episodes of such a collector would never be merged
COLLECTOR_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.]*(-[A-Za-z0-9_.]+)*$")
COLLECTOR_ID_RULE = "letters, digits, '_', '.', '-', starting with a letter, digit or '_'"
TMP_PREFIX = ".tmp-"
# .tmp-<collector_id>-<counter>-<pid>.episode
_PARTIAL_RE = re.compile(r"^\.tmp-(?P<collector>.+)-\d+-\d+\.episode$")


def staging_dir(store_path: str | Path) -> Path:
    return Path(store_path) / STAGING_DIR


def list_staged(store_path: str | Path) -> list[Path]:
    """Complete staging files in the deterministic order compaction consumes them (by name)."""
    d = staging_dir(store_path)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.suffix == SUFFIX and not p.name.startswith("."))


def quarantine_staged(store_path: str | Path, path: Path, reason: str) -> Path:
    """Move a staging file that cannot be merged to ``<store>/quarantine/`` (never deleted: it may be
    the only copy of an episode), with the reason in ``<name>.reason.txt`` beside it."""
    qdir = Path(store_path) / QUARANTINE_DIR
    qdir.mkdir(parents=True, exist_ok=True)
    target = qdir / path.name
    k = 1
    while target.exists():
        target = qdir / f"{path.stem}.{k}{path.suffix}"
        k += 1
    os.replace(path, target)
    target.with_name(target.name + ".reason.txt").write_text(reason.strip() + "\n")
    fsync_dir(qdir)
    fsync_dir(path.parent)
    return target


def list_quarantined(store_path: str | Path) -> list[tuple[Path, str]]:
    """(file, reason) of every staging file compaction set aside."""
    qdir = Path(store_path) / QUARANTINE_DIR
    if not qdir.is_dir():
        return []
    out = []
    for p in sorted(qdir.iterdir()):
        if p.name.endswith(".reason.txt") or p.name.startswith("."):
            continue
        reason_file = p.with_name(p.name + ".reason.txt")
        try:
            reason = reason_file.read_text().strip()
        except (OSError, UnicodeDecodeError):
            reason = "reason unknown"
        out.append((p, reason))
    return out


def writer_lock_path(store_path: str | Path, collector_id: str) -> Path:
    """The flock a collector's writer holds while it writes (``data.locks``)."""
    return staging_dir(store_path) / f".writer-{collector_id}.lock"


def partial_writes(store_path: str | Path, collector_id: str | None = None) -> list[Path]:
    """Temp files of staging writes not (yet) renamed into place: ``collector_id``'s, or everyone's."""
    d = staging_dir(store_path)
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.iterdir()):
        m = _PARTIAL_RE.match(p.name)
        if m and (collector_id is None or m["collector"] == collector_id):
            out.append(p)
    return out


def abandoned_partial_writes(store_path: str | Path) -> list[Path]:
    """Partial writes whose collector has no live writer (its lock is free): leftovers of a killed or
    failed write, safe to remove. A live writer's temp file is never listed."""
    out = []
    for p in partial_writes(store_path):
        collector = _PARTIAL_RE.match(p.name)["collector"]
        if not is_held(writer_lock_path(store_path, collector)):
            out.append(p)
    return out


def remove_partial_writes(paths: list[Path]) -> list[Path]:
    """Delete these partial writes (none of them is an episode: the rename never happened)."""
    for p in paths:
        p.unlink(missing_ok=True)
    if paths:
        fsync_dir(paths[0].parent)
    return paths


def episode_id_of(path: Path) -> str:
    return path.stem


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ValueError(f"episode info value {value!r} ({type(value).__name__}) is not JSON-able")


def _cast(name: str, value: np.ndarray, where: str, stride: int) -> np.ndarray:
    return np.ascontiguousarray(value, dtype=spec_for(name, value, where, stride).dtype)


# info keys the episode table stores as typed columns (data.compaction._episode_row), with what each takes:
# compaction casts them (bool(), int(), float()), and a cast hides a wrong value - bool("no") is True
INFO_FLAGS = ("success", "terminated")
INFO_WHOLE = ("terrain_level", "seed", "instruction_index")
INFO_NUMBERS = ("return", "cmd_vx", "cmd_vy", "cmd_wz", "control_dt")
# ... and the text columns (str() would store terrain_type=3 as "3", a type no filter or report knows)
INFO_TEXT = ("task", "failure_reason", "terrain_type", "gait", "policy_id")


def info_type_problem(info: Mapping[str, Any], where: str) -> str | None:
    """Why a typed info key's value would not survive its column's cast, or None."""
    for key in INFO_FLAGS:
        if key in info and not is_flag(info[key]):
            return f"{where}: info {key!r}={info[key]!r} must be True or False (or 0/1)"
    for key in INFO_WHOLE:
        if key in info and not is_whole(info[key]):
            return f"{where}: info {key!r}={info[key]!r} must be a whole number"
    for key in INFO_NUMBERS:
        value = info.get(key, 0.0)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            return f"{where}: info {key!r}={value!r} must be a number"
    for key in INFO_TEXT:
        if key in info and not isinstance(info[key], str):
            return f"{where}: info {key!r}={info[key]!r} must be text (a str)"
    if info.get("instruction") is not None and not isinstance(info["instruction"], str):
        return f"{where}: info 'instruction'={info['instruction']!r} must be text (a str) or None"
    if "label" in info and not isinstance(info["label"], Mapping):
        return f"{where}: info 'label'={info['label']!r:.80} must be a dict (the labelling rule's record)"
    return None


def _check_info(info: Mapping[str, Any], where: str, features: Mapping[str, np.ndarray]) -> None:
    """Per-episode metadata with a fixed shape: typed keys of their type, task parameters a dict,
    instructions index -> text."""
    problem = info_type_problem(info, where)
    if problem:
        raise ValueError(problem)
    params = info.get("task_params")
    if params is not None and not isinstance(params, Mapping):
        raise ValueError(f"{where}: task_params must be a dict (family, target, colours, ...), "
                         f"got {type(params).__name__}")
    table = info.get("instructions")
    if table is not None:
        if not isinstance(table, Mapping) or not all(str(k).lstrip("-").isdigit() and isinstance(v, str)
                                                     for k, v in table.items()):
            raise ValueError(f"{where}: instructions must map the per-step instruction indices to their text "
                             f"({{'3': 'go to the red cube, ...'}}), got {table!r:.200}")
    if "instruction" in features:   # compaction rewrites the indices into the store's table: it needs the texts
        used = sorted(int(v) for v in np.unique(np.asarray(features["instruction"])) if v != -1)
        missing = [u for u in used if str(u) not in (table or {})]
        if missing:
            raise ValueError(f"{where}: per-step instruction indices {missing[:10]} have no text in info "
                             f"'instructions' ({{index: text}}, e.g. from the env's instruction_table)")


def write_episode_file(path: Path, arrays: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> None:
    """Write arrays + info in the staging format, durably (fsync); no validation here."""
    layout, offset = {}, 0
    for name, a in arrays.items():
        # a CRC32C per array: a staging file damaged on disk is refused (and quarantined), not merged
        layout[name] = {"dtype": a.dtype.str, "shape": list(a.shape), "offset": offset, "crc32c": crc_rows(a)}
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    header = json.dumps({"info": info, "features": layout}).encode()
    header += b" " * (-(len(MAGIC) + 8 + len(header)) % _ALIGN)   # data starts aligned
    with open(path, "wb") as f:
        f.write(MAGIC + len(header).to_bytes(8, "little") + header)
        for name, a in arrays.items():
            f.write(np.ascontiguousarray(a).tobytes())
            f.write(b"\0" * (-a.nbytes % _ALIGN))
        f.flush()
        os.fsync(f.fileno())


def _parse_header(raw: bytes, path: Path) -> tuple[dict[str, Any], dict[str, Any], int]:
    if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 8:
        raise ValueError(f"staging file {path}: not a staging episode (bad magic)")
    n = int.from_bytes(raw[len(MAGIC):len(MAGIC) + 8], "little")
    start = len(MAGIC) + 8
    if len(raw) < start + n:
        raise ValueError(f"staging file {path}: truncated header")
    try:
        head = json.loads(raw[start:start + n])
        if not isinstance(head["info"], dict) or not isinstance(head["features"], dict):
            raise ValueError("info and features must be JSON objects")
        return head["info"], head["features"], start + n
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"staging file {path}: corrupt header ({err})") from err


def read_staged_header(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], np.dtype]], dict[str, Any]]:
    """(name -> (shape, dtype)) and the info of a staging file, reading only its header."""
    try:
        with open(path, "rb") as f:
            raw = f.read(len(MAGIC) + 8)
            if raw.startswith(MAGIC) and len(raw) == len(MAGIC) + 8:
                # no more than the file holds: a damaged length field must not ask for exabytes
                rest = os.fstat(f.fileno()).st_size - len(raw)
                raw += f.read(min(int.from_bytes(raw[len(MAGIC):], "little"), rest))
    except OSError as err:
        raise ValueError(f"staging file {path}: unreadable ({err})") from err
    info, feats, _ = _parse_header(raw, path)
    try:
        out = {k: (tuple(int(n) for n in v["shape"]), np.dtype(v["dtype"])) for k, v in feats.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"staging file {path}: corrupt header ({type(err).__name__}: {err})") from err
    if not isinstance(info, dict) or any(not shape or min(shape) < 0 for shape, _ in out.values()):
        raise ValueError(f"staging file {path}: corrupt header (info or shapes)")
    return out, info


def read_staged(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Load one staging file (read-only zero-copy views); a damaged one is a ValueError naming it."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ValueError(f"staging file {path}: unreadable ({err})") from err
    info, feats, data_start = _parse_header(raw, path)
    out = {}
    for name, f in feats.items():
        try:
            dtype, shape = np.dtype(f["dtype"]), tuple(int(n) for n in f["shape"])
            lo = data_start + int(f["offset"])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"staging file {path}: corrupt header ({type(err).__name__}: {err})") from err
        if not shape or min(shape) < 0 or lo < data_start:
            raise ValueError(f"staging file {path}: corrupt header (feature {name!r})")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if lo + nbytes > len(raw):
            raise ValueError(f"staging file {path}: truncated data (feature {name!r})")
        out[name] = np.frombuffer(raw, dtype=dtype, count=nbytes // dtype.itemsize, offset=lo).reshape(shape)
        if "crc32c" in f and crc_rows(out[name]) != int(f["crc32c"]):
            raise ValueError(f"staging file {path}: feature {name!r} fails its CRC32C checksum (damaged on disk)")
    return out, info


def write_staging_file(store_path: str | Path, episode_id: str, collector_id: str,
                       episode: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> Path:
    """Validate, then write ``<store>/staging/<episode_id>.episode`` via temp + fsync + atomic rename."""
    where = f"episode {episode_id}"
    stride = frame_stride_of(info, where)
    length = check_episode(episode, where, stride)
    _check_info(info, where, episode)
    arrays = {name: _cast(name, np.asarray(v), where, stride) for name, v in episode.items()}
    full_info = dict(_jsonable(dict(info)))
    full_info.update(episode_id=episode_id, collector_id=collector_id, length=length)
    d = staging_dir(store_path)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"{episode_id}{SUFFIX}"
    tmp = d / f"{TMP_PREFIX}{episode_id}-{os.getpid()}{SUFFIX}"
    try:
        write_episode_file(tmp, arrays, full_info)
        os.replace(tmp, final)
        fsync_dir(d)
    except OSError as err:
        tmp.unlink(missing_ok=True)   # a partial episode is nothing; leaving it would only hold disk space
        if is_write_failure(err):
            raise JobFailed(f"{Path(store_path)}: staging episode {episode_id} failed: {os_reason(err)}; the store's "
                            f"committed episodes and the episodes already staged are intact; free space and "
                            f"rerun the same command: it resumes after the last staged episode") from err
        raise
    return final
