"""Physics backends behind ``envs.backends.base.PhysicsBackend``; ``make_backend(name, cfg)`` picks one."""
from __future__ import annotations

import argparse

from quadforge.envs.backends.base import BackendConfig, PhysicsBackend, WarpConfig

# mujoco_warp needs the optional extra quadforge[gpu] (mujoco-warp); without it building it is an ImportError
BACKENDS = ("mujoco_cpu", "mujoco_warp")
# Designed for (the protocol fits them) but not written yet.
PLANNED = {
    "isaacgym": "an adapter wrapping a legged_gym / Isaac Gym environment",
}


def make_backend(name: str, cfg: BackendConfig) -> PhysicsBackend:
    """The named backend built from ``cfg``; ValueError naming the allowed names for an unknown one."""
    if name == "mujoco_cpu":
        from quadforge.envs.backends.mujoco_cpu import MujocoCpuBackend

        return MujocoCpuBackend(cfg)
    if name == "mujoco_warp":
        from quadforge.envs.backends.mujoco_warp import MujocoWarpBackend

        return MujocoWarpBackend(cfg)
    if name in PLANNED:
        raise NotImplementedError(f"backend {name!r} is planned, not implemented yet: {PLANNED[name]}; "
                                  f"available backends: {', '.join(BACKENDS)}")
    raise ValueError(f"unknown backend {name!r}; allowed backends: {', '.join(BACKENDS)} "
                     f"(planned: {', '.join(PLANNED)})")


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backend`` and the MuJoCo Warp options, for every command that builds an env."""
    parser.add_argument("--backend", default="mujoco_cpu", choices=BACKENDS,
                        help="physics backend: mujoco_cpu (default, native MuJoCo on CPU threads) or "
                             "mujoco_warp (MuJoCo Warp on a GPU, or Warp's CPU device; needs quadforge[gpu])")
    parser.add_argument("--warp-device", default=None, help="mujoco_warp: Warp device, e.g. cuda:0 or cpu "
                                                            "(default: the first GPU, else cpu)")
    parser.add_argument("--warp-nconmax", type=int, default=None,
                        help="mujoco_warp: contacts per world (default: sized from the terrain)")
    parser.add_argument("--warp-njmax", type=int, default=None,
                        help="mujoco_warp: constraint rows per world (default: sized from the terrain)")


def backend_from_args(args: argparse.Namespace) -> tuple[str, WarpConfig]:
    """(backend name, WarpConfig) from the arguments ``add_backend_arguments`` added."""
    return getattr(args, "backend", "mujoco_cpu"), WarpConfig(
        device=getattr(args, "warp_device", None), nconmax=getattr(args, "warp_nconmax", None),
        njmax=getattr(args, "warp_njmax", None))
