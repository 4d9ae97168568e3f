"""The one env builder: ``make_env(robot, terrain, task, overrides, ...)`` for every caller.

``terrain`` is a ``--terrain`` spec (``envs.terrain.terrain_config``); ``task`` the name of a registered
task; ``overrides`` dotted ``EnvConfig`` paths set through the one typed setter
(``quadforge.overrides.apply_overrides``), e.g. ``{"commands.resample": False, "episode_length_s": 4.0}``.

A task is a small function registered by name that turns the default ``EnvConfig`` into the task's
(command distribution, rewards, terminations, extra observation terms). Adding one is a
``register_task(name, configure, help)`` call in the module that implements it, e.g. ``quard:go_to``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from quadforge.envs.backends.base import WarpConfig
from quadforge.envs.config import EnvConfig
from quadforge.envs.terrain import terrain_config
from quadforge.envs.vec_env import LeggedEnv
from quadforge.overrides import apply_overrides


@dataclass(frozen=True)
class Task:
    name: str
    configure: Callable[[EnvConfig], EnvConfig]   # default config -> the task's config
    help: str
    make: Callable[..., LeggedEnv] | None = None  # the env of a task with its own class (QUARD): make(cfg, **options)


TASKS: dict[str, Task] = {}
# Task-name prefix -> the module that registers those tasks when imported (imported on first use, so a
# task family's optional heavy parts never load for another's user), e.g. {"quard": "quadforge.envs.tasks.quard"}.
TASK_MODULES: dict[str, str] = {"quard": "quadforge.envs.quard.tasks"}


def register_task(name: str, configure: Callable[[EnvConfig], EnvConfig], help: str,
                  make: Callable[..., LeggedEnv] | None = None) -> None:
    if name in TASKS:
        raise ValueError(f"task {name!r} is already registered")
    TASKS[name] = Task(name, configure, help, make)


register_task("locomotion", lambda cfg: cfg,
              "legged_gym velocity tracking: joystick commands resampled, its rewards and terminations")


def make_env_config(robot: str = "go1", terrain: str = "flat", task: str = "locomotion", num_envs: int = 16,
                    seed: int = 0, num_threads: int | None = 1, overrides: Mapping[str, Any] | None = None,
                    one_column_per_type: bool = False, terrain_grid: Mapping[str, Any] | None = None,
                    backend: str = "mujoco_cpu", warp: WarpConfig | None = None) -> EnvConfig:
    """The ``EnvConfig`` of (robot, terrain spec, task, overrides); see the module doc. ``backend`` names
    the physics backend (``envs.backends.BACKENDS``), ``warp`` the mujoco_warp options."""
    prefix = task.partition(":")[0]
    if task not in TASKS and prefix in TASK_MODULES:
        importlib.import_module(TASK_MODULES[prefix])
    if task not in TASKS:
        raise ValueError(f"--task={task!r} is unknown; allowed: {', '.join(TASKS)}")
    cfg = EnvConfig.flat(robot=robot, num_envs=num_envs, seed=seed)
    cfg.terrain = terrain_config(terrain, one_column_per_type, **dict(terrain_grid or {}))
    cfg.backend.num_threads = num_threads
    cfg.backend_name = backend
    if warp is not None:
        cfg.backend.warp = warp
    cfg = TASKS[task].configure(cfg)
    return apply_overrides(cfg, dict(overrides or {}))


def make_env(robot: str = "go1", terrain: str = "flat", task: str = "locomotion", num_envs: int = 16,
             seed: int = 0, num_threads: int | None = 1, overrides: Mapping[str, Any] | None = None,
             one_column_per_type: bool = False, terrain_grid: Mapping[str, Any] | None = None,
             backend: str = "mujoco_cpu", warp: WarpConfig | None = None,
             task_options: Mapping[str, Any] | None = None) -> LeggedEnv:
    """A ``LeggedEnv`` of (robot, terrain spec, task, overrides) on the named physics backend (a ``QuardEnv``
    for ``quard:*`` tasks). ``task_options`` go to the task's own env class, beside its ``EnvConfig``
    (a QUARD task: ``QuardConfig`` fields such as ``{"images": False}``); a task without one takes none."""
    cfg = make_env_config(robot, terrain, task, num_envs, seed, num_threads, overrides, one_column_per_type,
                          terrain_grid, backend, warp)
    make = TASKS[task].make
    if make is None:
        if task_options:
            raise ValueError(f"task {task!r} takes no task options; got {sorted(task_options)} "
                             f"(only tasks with their own env class, e.g. quard:*, do)")
        return LeggedEnv(cfg)
    return make(cfg, **dict(task_options or {}))
