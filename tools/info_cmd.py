"""`quadforge info`: what this machine can run, before a long job finds out.

One screen: the versions of the packages the platform stands on, the devices torch and Warp see, whether
the CPU camera has an OpenGL to render with, which optional parts are installed (MuJoCo Warp for the GPU
path, wordllama for the language half), and the registered backends, robots, tasks, models, policy kinds,
terrain types, reward terms and observation layouts, with whether each backend can run here. Every list
comes from its registry, read when asked. Nothing is built or compiled:
Warp is initialised only with ``--warp`` (its first initialisation loads the CUDA driver and takes a
second or two). ``--json PATH`` ('-': stdout) writes the same as JSON.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
from typing import Any

from quadforge.cli_flags import add_json, write_json

# the packages the platform stands on (required), then the optional ones and what each enables
REQUIRED = ("torch", "mujoco", "numpy", "zarr", "h5py", "rsl-rl-lib", "tensordict", "tensorboard")
OPTIONAL = {
    "warp-lang": "the mujoco_warp backend (GPU physics), with mujoco-warp",
    "mujoco-warp": "the mujoco_warp backend (GPU physics), with warp-lang",
    "wordllama": "instruction embeddings: the VLAs, QUARD evaluation and Table III",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warp", action="store_true",
                   help="also initialise Warp and list the devices it sees (loads the CUDA driver where there is one)")
    add_json(p, "the report")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_devices() -> dict[str, Any]:
    import torch
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "cuda": torch.cuda.is_available(), "gpus": []}
    if out["cuda"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["gpus"].append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2 ** 30, 1)})
    return out


def _warp_devices() -> list[str]:
    from quadforge.envs.backends.mujoco_warp import import_warp
    wp, _ = import_warp()
    wp.init()
    return [str(d) for d in wp.get_devices()]


def _rendering() -> dict[str, Any]:
    """MUJOCO_GL and whether MuJoCo offers the CPU camera an OpenGL context class under it (none is
    opened: a missing EGL or display shows only when the camera opens one)."""
    gl = os.environ.get("MUJOCO_GL")
    import mujoco
    return {"MUJOCO_GL": gl, "gl_context": hasattr(mujoco, "GLContext") and gl not in ("disable", "")}


def _registries() -> dict[str, Any]:
    from quadforge.envs.backends import BACKENDS, PLANNED
    from quadforge.envs.builder import task_names
    from quadforge.envs.rewards import REWARD_TERMS
    from quadforge.envs.robots import ROBOTS
    from quadforge.envs.terrain import TERRAIN_TYPES
    from quadforge.experts.registry import POLICY_KIND_MODULES, POLICY_KINDS
    from quadforge.layout import LAYOUTS
    from quadforge.models.registry import MODEL_SPECS
    for module in POLICY_KIND_MODULES.values():   # the lazily registered policy kinds register on import
        importlib.import_module(module)
    backends = {name: {"help": spec.help, "devices": list(spec.devices), "capabilities": sorted(spec.capabilities),
                       "installed": spec.installed()} for name, spec in BACKENDS.items()}
    models: dict[str, list[str]] = {}
    for name, inputs in MODEL_SPECS:
        models.setdefault(name, []).append(inputs)
    return {"backends": backends, "planned_backends": dict(PLANNED), "robots": list(ROBOTS),
            "tasks": list(task_names()), "models": models,
            "policy_kinds": {name: {"help": k.help, "takes_path": k.needs_path} for name, k in POLICY_KINDS.items()},
            "terrain_types": list(TERRAIN_TYPES), "reward_terms": list(REWARD_TERMS),
            "layouts": {name: layout.dim for name, layout in LAYOUTS.items()}}


def collect(warp: bool = False) -> dict[str, Any]:
    """The report as a dict (``run`` prints it)."""
    from quadforge import __version__
    from quadforge.tools.run_info import git_state
    report: dict[str, Any] = {
        "quadforge": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
        "cpus": os.cpu_count(), "git": git_state()["head"],
        "required": {d: _version(d) for d in REQUIRED},
        "optional": {d: {"version": _version(d), "enables": what} for d, what in OPTIONAL.items()},
        "torch": _torch_devices(), "rendering": _rendering(), **_registries(),
    }
    if warp:
        try:
            report["warp_devices"] = _warp_devices()
        except ImportError as err:
            report["warp_devices"] = f"not installed: {err}"
    return report


def _print(r: dict[str, Any]) -> None:
    print(f"quadforge {r['quadforge']} (git {str(r['git'])[:12]}), Python {r['python']}, {r['platform']}, {r['cpus']} CPUs")
    print("required: " + ", ".join(f"{d} {v or 'MISSING'}" for d, v in r["required"].items()))
    for d, o in r["optional"].items():
        print(f"optional: {d} {o['version'] or 'not installed'} - {o['enables']}")
    t = r["torch"]
    gpus = "; ".join(f"cuda:{g['index']} {g['name']} {g['memory_gib']} GiB" for g in t["gpus"]) or "none"
    print(f"torch: {t['threads']} threads, CUDA {'yes' if t['cuda'] else 'no'}, GPUs: {gpus}")
    if "warp_devices" in r:
        print(f"Warp devices: {r['warp_devices']}")
    gl = r["rendering"]
    if not gl["gl_context"]:
        camera = "no OpenGL for the CPU camera (headless: MUJOCO_GL=egl)"
    elif gl["MUJOCO_GL"] is None:
        camera = "the CPU camera opens MuJoCo's default OpenGL (GLFW: needs a display; headless: MUJOCO_GL=egl)"
    else:
        camera = "the CPU camera renders through it"
    print(f"rendering: MUJOCO_GL={gl['MUJOCO_GL'] or '(unset)'}: {camera}")
    for name, b in r["backends"].items():
        state = "installed here" if b["installed"] else "not installed here"
        print(f"backend {name}: {state}; devices {', '.join(b['devices'])}; {b['help']}")
    for name, why in r["planned_backends"].items():
        print(f"backend {name}: planned, not implemented ({why})")
    print("robots: " + ", ".join(r["robots"]))
    print("tasks: " + ", ".join(r["tasks"]))
    print("models: " + ", ".join(f"{n} ({'/'.join(i)})" for n, i in r["models"].items()))
    print("policy kinds: " + ", ".join(f"{n}{':PATH' if k['takes_path'] else ''}" for n, k in r["policy_kinds"].items()))
    print("terrain types: " + ", ".join(r["terrain_types"]))
    print("reward terms: " + ", ".join(r["reward_terms"]))
    print("layouts: " + ", ".join(f"{n} ({d})" for n, d in r["layouts"].items()))


def run(args: argparse.Namespace) -> int:
    report = collect(warp=args.warp)
    _print(report)   # on stderr with --json - (tools/cli.py), so stdout is the JSON alone
    write_json(args.json, report, indent=1)
    return 0
