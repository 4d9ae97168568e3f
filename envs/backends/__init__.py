"""Physics backends behind ``envs.backends.base.PhysicsBackend``; ``make_backend(name, cfg)`` picks one."""
from __future__ import annotations

from quadforge.envs.backends.base import BackendConfig, PhysicsBackend

BACKENDS = ("mujoco_cpu",)
# Designed for (the protocol fits them) but not written yet.
PLANNED = {
    "mujoco_warp": "MuJoCo Warp (thousands of worlds on one NVIDIA GPU, same model files)",
    "isaacgym": "an adapter wrapping a legged_gym / Isaac Gym environment",
}


def make_backend(name: str, cfg: BackendConfig) -> PhysicsBackend:
    """The named backend built from ``cfg``; ValueError naming the allowed names for an unknown one."""
    if name == "mujoco_cpu":
        from quadforge.envs.backends.mujoco_cpu import MujocoCpuBackend

        return MujocoCpuBackend(cfg)
    if name in PLANNED:
        raise NotImplementedError(f"backend {name!r} is planned, not implemented yet: {PLANNED[name]}; "
                                  f"available backends: {', '.join(BACKENDS)}")
    raise ValueError(f"unknown backend {name!r}; allowed backends: {', '.join(BACKENDS)} "
                     f"(planned: {', '.join(PLANNED)})")
