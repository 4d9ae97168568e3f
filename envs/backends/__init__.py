"""Physics backends behind ``envs.backends.base.PhysicsBackend``: the registry, the one place each lives.

A backend is one registered ``BackendSpec``: its name, where its class lives (imported on first use, so
an optional extra such as mujoco-warp never loads for another backend's user), the capabilities it has
beyond the protocol, and the device kinds it runs on. Callers ask for capabilities
(``missing_capabilities``), never for backend names; ``make_backend(name, cfg)`` builds one.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
from dataclasses import dataclass, field

from quadforge.envs.backends.base import RESET_RECOMPUTE, BackendConfig, PhysicsBackend, WarpConfig

# What a backend may offer beyond the PhysicsBackend protocol, and what each means.
CAPABILITIES = {
    "scene_addon": "builds BackendConfig.scene_addon (task objects and their sensors) into its scene",
    "set_mocap": "places the scene's mocap bodies per env (set_mocap)",
    "sensor_columns": "reads a scene addon's sensordata columns per env (sensor_columns)",
    "cameras": "renders batched camera frames (make_camera)",
}


@dataclass(frozen=True)
class BackendSpec:
    name: str
    target: str                       # "module:Class", built as Class(BackendConfig)
    help: str
    capabilities: frozenset[str] = field(default_factory=frozenset)
    devices: tuple[str, ...] = ("cpu",)   # device kinds it runs on ("cpu", "cuda")
    requires: tuple[str, ...] = ()        # optional modules it imports (beyond the project's requirements)

    def installed(self) -> bool:
        """Whether every module in ``requires`` is importable here; imports nothing."""
        try:
            return all(importlib.util.find_spec(m) is not None for m in self.requires)
        except (ImportError, ValueError):   # a module set to None in sys.modules
            return False

    def build(self, cfg: BackendConfig) -> PhysicsBackend:
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)(cfg)


BACKENDS: dict[str, BackendSpec] = {}
# Designed for (the protocol fits them) but not written yet.
PLANNED = {
    "isaacgym": "an adapter wrapping a legged_gym / Isaac Gym environment",
}


def register_backend(spec: BackendSpec) -> None:
    unknown = sorted(set(spec.capabilities) - set(CAPABILITIES))
    if unknown:
        raise ValueError(f"backend {spec.name!r}: unknown capabilities {unknown}; known: {', '.join(CAPABILITIES)}")
    if spec.name in BACKENDS:
        raise ValueError(f"backend {spec.name!r} is already registered")
    BACKENDS[spec.name] = spec


register_backend(BackendSpec(
    "mujoco_cpu", "quadforge.envs.backends.mujoco_cpu:MujocoCpuBackend",
    "native MuJoCo on CPU threads (default)", frozenset(CAPABILITIES), ("cpu",)))
# needs the optional extra quadforge[gpu] (mujoco-warp); without it building it is a one-line ImportError
register_backend(BackendSpec(
    "mujoco_warp", "quadforge.envs.backends.mujoco_warp:MujocoWarpBackend",
    "MuJoCo Warp on a GPU, or Warp's CPU device; needs quadforge[gpu]", frozenset(CAPABILITIES), ("cpu", "cuda"),
    requires=("mujoco_warp", "warp")))


def backend_spec(name: str) -> BackendSpec:
    """The registered backend ``name``; NotImplementedError for a planned one, ValueError for an unknown one."""
    if name in BACKENDS:
        return BACKENDS[name]
    if name in PLANNED:
        raise NotImplementedError(f"backend {name!r} is planned, not implemented yet: {PLANNED[name]}; "
                                  f"available backends: {', '.join(BACKENDS)}")
    raise ValueError(f"unknown backend {name!r}; allowed backends: {', '.join(BACKENDS)} "
                     f"(planned: {', '.join(PLANNED)})")


def missing_capabilities(name: str, needed) -> list[str]:
    """The capabilities of ``needed`` that backend ``name`` lacks (empty: it has them all)."""
    have = backend_spec(name).capabilities
    return [c for c in needed if c not in have]


def require_capabilities(name: str, needed, what: str) -> None:
    """NotImplementedError naming what backend ``name`` lacks for ``what`` and which backends have it all."""
    missing = missing_capabilities(name, needed)
    if missing:
        able = [b for b, s in BACKENDS.items() if set(needed) <= s.capabilities]
        raise NotImplementedError(f"{what}: needs backend capabilities {', '.join(needed)}; "
                                  f"backend {name!r} lacks {', '.join(missing)} "
                                  f"(backends that have them: {', '.join(able) or 'none'})")


def make_backend(name: str, cfg: BackendConfig) -> PhysicsBackend:
    """The named backend built from ``cfg``; ValueError naming the allowed names for an unknown one."""
    return backend_spec(name).build(cfg)


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backend`` and the MuJoCo Warp options, for every command that builds an env."""
    parser.add_argument("--backend", default="mujoco_cpu", choices=list(BACKENDS),
                        help="physics backend: " + "; ".join(f"{s.name} ({s.help})" for s in BACKENDS.values()))
    parser.add_argument("--warp-device", default=None, help="mujoco_warp: Warp device, e.g. cuda:0 or cpu "
                                                            "(default: the first GPU, else cpu)")
    parser.add_argument("--warp-nconmax", type=int, default=None,
                        help="mujoco_warp: contacts per world (default: measured from the scene)")
    parser.add_argument("--warp-njmax", type=int, default=None,
                        help="mujoco_warp: constraint rows per world (default: measured from the scene)")
    parser.add_argument("--warp-solver-iterations", type=int, default=None,
                        help="mujoco_warp: Newton iterations per physics step (default: the scene's, 100)")
    parser.add_argument("--warp-ls-iterations", type=int, default=None,
                        help="mujoco_warp: line-search iterations per Newton step (default: the scene's, 50)")
    parser.add_argument("--warp-reset-recompute", default=None, choices=list(RESET_RECOMPUTE),
                        help="mujoco_warp: what a reset recomputes for the reset worlds: forward (every sensor, as "
                             "mujoco_cpu) or step1 (poses and velocities; contact forces and torques read zero "
                             "until the next step); default: step1 on a GPU, forward on Warp's CPU device")


def backend_from_args(args: argparse.Namespace) -> tuple[str, WarpConfig]:
    """(backend name, WarpConfig) from the arguments ``add_backend_arguments`` added; a ``--warp-*`` option
    given with another backend is refused (it would be ignored without a word)."""
    name = getattr(args, "backend", "mujoco_cpu")
    given = [f"--{k.replace('_', '-')}" for k, v in vars(args).items() if k.startswith("warp_") and v is not None]
    if given and name != "mujoco_warp":
        raise ValueError(f"{', '.join(sorted(given))}: option(s) of --backend mujoco_warp; this run's backend is "
                         f"{name}: drop them or add --backend mujoco_warp")
    return name, WarpConfig(
        device=getattr(args, "warp_device", None), nconmax=getattr(args, "warp_nconmax", None),
        njmax=getattr(args, "warp_njmax", None),
        solver_iterations=getattr(args, "warp_solver_iterations", None),
        ls_iterations=getattr(args, "warp_ls_iterations", None),
        reset_recompute=getattr(args, "warp_reset_recompute", None))
