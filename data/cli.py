"""`quadforge dataset info [--json [PATH]] | validate | compact | export-hdf5 | export-lerobot | import-hdf5`, each on
``--store PATH``."""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from quadforge.cli_flags import add_json, add_store, require, write_json

ACTIONS = ("info", "validate", "compact", "export-hdf5", "export-lerobot", "import-hdf5")
# The positional spellings each action accepted before the flag convention (docs/cli.md), in their old
# order: kept as deprecated aliases of the flags (`dataset export-hdf5 STORE OUT.h5`).
OLD_POSITIONALS: dict[str, tuple[tuple[str, str], ...]] = {
    "info": (("store", "--store"),), "validate": (("store", "--store"),), "compact": (("store", "--store"),),
    "export-hdf5": (("store", "--store"), ("output", "--output")),
    "export-lerobot": (),
    "import-hdf5": (("input", "--input"), ("store", "--store")),
}


def _old_positionals(p: argparse.ArgumentParser) -> None:
    p.add_argument("old_positionals", nargs="*", default=[], metavar="ARG", help=argparse.SUPPRESS)


def _store(p: argparse.ArgumentParser, what: str) -> None:
    add_store(p, what)
    _old_positionals(p)


def apply_old_positionals(args: argparse.Namespace) -> None:
    """Give each old positional to the next flag of its action that the command line left unset, with
    one deprecation warning; more positionals than that is a one-line error."""
    given = list(getattr(args, "old_positionals", None) or [])
    if not given:
        return
    names = OLD_POSITIONALS[args.action]
    unset = [(dest, flag) for dest, flag in names if getattr(args, dest, None) is None]
    if len(given) > len(unset):
        spelled = " ".join(f"{flag} {dest.upper()}" for dest, flag in names)
        raise ValueError(f"dataset {args.action}: unexpected argument(s) {given[len(unset):]}; use {spelled}")
    flags = []
    for value, (dest, flag) in zip(given, unset):
        setattr(args, dest, value)
        flags.append(flag)
    print(f"quadforge: warning: positional arguments of dataset {args.action} are deprecated; use "
          f"{' '.join(f + ' ...' for f in flags)}", file=sys.stderr)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("info", help="summary of a store: episodes, steps, features, success, terrains")
    _store(p, "the one to summarise")
    add_json(p, "the summary")
    p = sub.add_parser("validate", help="check every store invariant and every chunk's checksum; exit 1 if any "
                                        "is broken")
    _store(p, "the one to check")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--deep", action="store_true",
                       help="also check the values: finite, stats equal a recomputation (a full read)")
    level.add_argument("--quick", action="store_true",
                       help="metadata, digests and chunk files only: no chunk is read (seconds for any size)")
    level.add_argument("--no-values", action="store_true", help="the default (checksums, no value checks)")
    p = sub.add_parser("compact", help="append staged episodes to the store")
    _store(p, "the one to compact")
    p = sub.add_parser("export-lerobot", help="write the store as a LeRobot v3 dataset (parquet, PNG frames, "
                                              "instructions as tasks)")
    add_store(p, "the one to export")
    p.add_argument("--output", default=None, metavar="DIR", help="a new or empty folder for the dataset (required)")
    p.add_argument("--action", dest="action_kind", choices=("auto", "command", "joint"), default="auto",
                   help="the exported action: the 12-D high-level command (hl_commands), the joint actions, or "
                        "auto: the command when the store has it (default)")
    p = sub.add_parser("export-hdf5", help="write the store as robomimic HDF5 (SequenceDataset reads it)")
    _store(p, "the one to export")
    p.add_argument("--output", default=None, metavar="FILE", help="the HDF5 file to write (required)")
    p.add_argument("--compression", choices=("gzip", "lzf"), default=None, help="HDF5 compression (default none)")
    p = sub.add_parser("import-hdf5", help="append an exported HDF5 file's demos to a store")
    p.add_argument("--input", default=None, metavar="FILE", help="the HDF5 file to read (required)")
    _store(p, "appended to (created if missing)")
    p.add_argument("--collector-id", default=None, metavar="ID",
                   help="stage the demos under this collector's next ids, each keeping its own as source_episode_id "
                        "(to merge stores whose ids collide, e.g. two collections under the default 'main')")


def summary(store_path: str | Path) -> dict[str, Any]:
    from quadforge.data.staging import list_quarantined, list_staged
    from quadforge.data.store import TrajectoryStore
    store = TrajectoryStore.open(store_path)
    t = store.episodes
    success = t["success"]
    per_terrain: dict[str, dict[str, Any]] = {}
    for name in sorted(set(t["terrain_type"].tolist())):
        sel = t["terrain_type"] == name
        per_terrain[name or "unknown"] = {"episodes": int(sel.sum()), "success_rate": float(success[sel].mean())}
    return {
        "path": str(store.root), "generation": store.generation, "episodes": store.num_episodes,
        "steps": store.num_steps, "hours": store.num_steps * store.schema.control_dt / 3600.0,
        "robot": store.schema.robot, "control_rate_hz": store.schema.control_rate_hz,
        "format_version": int(store.manifest["format_version"]), "table_segments": len(store.table_files),
        "success_rate": float(success.mean()) if len(t) else 0.0,
        "failure_reasons": dict(Counter(t["failure_reason"].tolist())),
        "terrains": per_terrain,
        "policies": dict(Counter(t["policy_id"].tolist())),
        "tasks": dict(Counter(t["task"].tolist())),   # episodes per task, as policies and collectors count
        "instructions_per_task": {k: len(v) for k, v in store.tasks.items()},
        "collectors": dict(Counter(t["collector_id"].tolist())),
        "mean_length": float(t["length"].mean()) if len(t) else 0.0,
        "features": {k: {"dtype": v.dtype, "shape": list(v.shape)} for k, v in sorted(store.schema.features.items())},
        "staged": len(list_staged(store.root)),
        "quarantined": [{"file": str(p), "reason": r} for p, r in list_quarantined(store.root)],
        **_vision_summary(store),
    }


def _vision_summary(store: Any) -> dict[str, Any]:
    """Images (rate, frames, bytes per frame on disk), the instruction table and task families; empty for
    a store without any of them, so its summary stays what it was."""
    out: dict[str, Any] = {}
    images = {}
    for name in store.image_features:
        spec = store.schema.features[name]
        frames = int(store.manifest["lengths"][name])
        disk = sum(p.stat().st_size for p in (store.root / name).rglob("*") if p.is_file())
        images[name] = {"dtype": spec.dtype, "shape": list(spec.shape), "frame_stride": spec.stride,
                        "frame_rate_hz": store.schema.control_rate_hz / spec.stride, "frames": frames,
                        "bytes_per_frame_on_disk": disk / max(frames, 1),
                        "raw_bytes_per_frame": int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize}
    if images:
        out["images"] = images
    if store.instructions:
        out["instructions"] = len(store.instructions)
    families = Counter(str(p.get("family")) for p in store.episodes["task_params"] if p)
    if families:
        t = store.episodes
        out["families"] = {f: {"episodes": n, "success_rate": float(np.mean(
            [s for s, p in zip(t["success"], t["task_params"]) if p and str(p.get("family")) == f]))}
            for f, n in sorted(families.items())}
    return out


def _print_summary(s: dict[str, Any]) -> None:
    print(f"{s['path']}  generation {s['generation']}  robot {s['robot'] or '?'}  {s['control_rate_hz']:.0f} Hz")
    print(f"episodes {s['episodes']}  steps {s['steps']}  ({s['hours']:.2f} h)  mean length {s['mean_length']:.1f}"
          f"  success {100 * s['success_rate']:.1f}%  staged {s['staged']}")
    print("terrains: " + ", ".join(f"{k} {v['episodes']} ({100 * v['success_rate']:.0f}%)"
                                   for k, v in s["terrains"].items()))
    print("policies: " + ", ".join(f"{k or '?'} {v}" for k, v in s["policies"].items()))
    print("tasks: " + ", ".join(f"{k or '?'} {v}" for k, v in s["tasks"].items()))
    print("failure reasons: " + ", ".join(f"{k} {v}" for k, v in s["failure_reasons"].items()))
    print("features: " + ", ".join(f"{k}{tuple(v['shape'])}" for k, v in s["features"].items()))
    for name, im in s.get("images", {}).items():
        print(f"{name}: {im['dtype']}{tuple(im['shape'])} every {im['frame_stride']} steps "
              f"({im['frame_rate_hz']:g} Hz), {im['frames']} frames, {im['bytes_per_frame_on_disk']:.0f} B/frame "
              f"on disk ({im['raw_bytes_per_frame']} raw)")
    if "instructions" in s:
        print(f"instruction table: {s['instructions']} instructions")
    if "families" in s:
        print("families: " + ", ".join(f"{k} {v['episodes']} ({100 * v['success_rate']:.0f}%)"
                                       for k, v in s["families"].items()))
    for q in s["quarantined"]:
        print(f"WARNING: quarantined staging file {q['file']} (not merged): {q['reason']}")


def _warn_staged(store: str, action: str) -> None:
    """An export writes the committed episodes: say so when a collection left some staged, not merged."""
    from quadforge.data.staging import list_staged
    staged = len(list_staged(store))
    if staged:
        print(f"WARNING: {staged} staged episode(s) of {store} are not merged yet and not in this {action}: run "
              f"`quadforge dataset compact --store {store}` first to include them", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    apply_old_positionals(args)
    from quadforge.data.store import refuse_file_as_store
    refuse_file_as_store(require(args, "store", "--store"), f"dataset {args.action} --store")
    if args.action == "info":
        s = summary(args.store)
        _print_summary(s)            # on stderr with --json - (tools/cli.py), as every command's report
        write_json(args.json, s)
        return 0
    if args.action == "validate":
        from quadforge.data.validate import validate
        rep = validate(args.store, check_values=args.deep, checksums=not args.quick, progress=True)
        print(rep.text())
        return 0 if rep.ok else 1
    if args.action == "compact":
        from quadforge.data.compaction import compact
        r = compact(args.store, progress=True)
        print(f"generation {r.generation}: appended {len(r.appended)} episode(s), {r.steps} steps; "
              f"removed {len(r.skipped)} already-stored staging file(s); {r.seconds:.2f} s")
        for q in r.quarantined:
            print(f"WARNING: quarantined {q} (see {q}.reason.txt)")
        for partial in r.removed_partial:
            print(f"removed {partial} (a partial staging write of a writer that is gone: no episode)")
        return 0
    if args.action in ("export-hdf5", "export-lerobot"):
        _warn_staged(args.store, args.action)
    if args.action == "export-hdf5":
        require(args, "output", "--output")
        from quadforge.data.export import export_hdf5
        n = export_hdf5(args.store, args.output, compression=args.compression, progress=True)
        print(f"wrote {n} demos to {args.output}")
        return 0
    if args.action == "export-lerobot":
        require(args, "output", "--output")
        from quadforge.data.export_lerobot import export_lerobot
        info = export_lerobot(args.store, args.output, action=args.action_kind, progress=True)
        print(f"wrote {info['total_episodes']} episodes, {info['total_frames']} frames, {info['total_tasks']} tasks "
              f"to {args.output} (LeRobot {info['codebase_version']}, action = {info['quadforge']['action_feature']})")
        return 0
    if args.action == "import-hdf5":
        if Path(require(args, "input", "--input")).is_dir():   # not "no such HDF5 file": say what the path is
            raise ValueError(f"dataset import-hdf5 --input {args.input}: is a folder, not an HDF5 file; give the "
                             f".h5 file `quadforge dataset export-hdf5` wrote")
        from quadforge.data.export import import_hdf5
        n = import_hdf5(args.input, args.store, collector_id=args.collector_id)
        print(f"imported {n} demos into {args.store}")
        return 0
    raise ValueError(f"dataset action {args.action!r}; allowed: {ACTIONS}")
