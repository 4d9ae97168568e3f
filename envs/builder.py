"""The one env builder: ``make_env(robot, terrain, task, overrides, ...)`` for every caller.

``terrain`` is a ``--terrain`` spec (``envs.terrain.terrain_config``); ``task`` the name of a registered
task; ``overrides`` dotted ``EnvConfig`` paths set through the one typed setter
(``quadforge.overrides.apply_overrides``), e.g. ``{"commands.resample": False, "episode_length_s": 4.0}``.

A task is a small function registered by name that turns the default ``EnvConfig`` into the task's
(command distribution, rewards, terminations, extra observation terms). Adding one is a
``register_task(name, configure, help, default_policy=...)`` call in the module that implements it (a name
inside a registered prefix, or taken, is refused). A family of tasks whose
names follow another registry (``quard:<family>``: one per registered QUARD family) registers a prefix
instead: ``register_task_prefix(prefix, resolve, names)``, ``resolve(name)`` making the ``Task``.

Typed callers pass typed values: ``terrain`` may be a built ``TerrainConfig`` (or None: flat), and
``adjust`` is a function ``EnvConfig -> EnvConfig`` applied after the task's own ``configure`` (a job's
settings, e.g. collection's episode length and pushes, set with ``dataclasses.replace``); ``overrides``
are for dotted ``key=value`` strings from a command line.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from quadforge.envs.backends.base import WarpConfig
from quadforge.envs.config import EnvConfig
from quadforge.envs.terrain import TerrainConfig, terrain_config
from quadforge.envs.vec_env import LeggedEnv
from quadforge.overrides import apply_overrides


@dataclass(frozen=True)
class Task:
    name: str
    configure: Callable[[EnvConfig], EnvConfig]   # default config -> the task's config
    help: str
    make: Callable[..., LeggedEnv] | None = None  # the env of a task with its own class (QUARD): make(cfg, **options)
    default_policy: str = "gait"                  # the policy spec a job runs when none is named: one that can succeed here

    @property
    def own_env(self) -> bool:
        """Whether the task builds its own env class (``make``, e.g. QUARD's), which alone takes ``task_options``."""
        return self.make is not None


@dataclass(frozen=True)
class TaskPrefix:
    resolve: Callable[[str], Task]            # a name with this prefix -> its Task (ValueError when unknown)
    names: Callable[[], tuple[str, ...]]      # every name it resolves now


TASKS: dict[str, Task] = {}
TASK_PREFIXES: dict[str, TaskPrefix] = {}
# Task-name prefix -> the module that registers those tasks when imported (imported on first use, so a
# task family's optional heavy parts never load for another's user), e.g. {"quard": "quadforge.envs.quard.tasks"}.
TASK_MODULES: dict[str, str] = {"quard": "quadforge.envs.quard.tasks"}


def register_task(name: str, configure: Callable[[EnvConfig], EnvConfig], help: str,
                  make: Callable[..., LeggedEnv] | None = None, default_policy: str = "gait") -> None:
    """Task ``name`` (see the module doc); ``default_policy`` is the policy spec a job runs on it when none is
    named. A name taken by a task, or inside a task prefix (``quard:...``, whose tasks that prefix names), is refused."""
    prefix = name.partition(":")[0]
    if ":" in name and (prefix in TASK_PREFIXES or prefix in TASK_MODULES):
        raise ValueError(f"register_task({name!r}): the prefix {prefix + ':'!r} belongs to the task family "
                         f"registered with register_task_prefix; choose a name outside it")
    if name in TASKS:
        raise ValueError(f"register_task({name!r}): task {name!r} is already registered")
    TASKS[name] = Task(name, configure, help, make, default_policy)


def register_task_prefix(prefix: str, resolve: Callable[[str], Task], names: Callable[[], tuple[str, ...]]) -> None:
    """Tasks named ``prefix:...`` are made by ``resolve(name)`` (see the module doc)."""
    if prefix in TASK_PREFIXES:
        raise ValueError(f"task prefix {prefix!r} is already registered")
    taken = [n for n in TASKS if n.startswith(prefix + ":")]
    if taken:
        raise ValueError(f"task prefix {prefix!r}: the registered tasks {taken} are inside it")
    TASK_PREFIXES[prefix] = TaskPrefix(resolve, names)


def task_names() -> tuple[str, ...]:
    """Every registered task now, the prefixed ones too (their modules, ``TASK_MODULES``, imported first)."""
    for prefix, module in TASK_MODULES.items():
        if prefix not in TASK_PREFIXES:
            importlib.import_module(module)
    return tuple(TASKS) + tuple(n for p in TASK_PREFIXES.values() for n in p.names())


def get_task(name: str) -> Task:
    """The registered task ``name`` (its module imported on first use); a one-line error naming the allowed."""
    prefix = name.partition(":")[0]
    if name not in TASKS and prefix not in TASK_PREFIXES and prefix in TASK_MODULES:
        importlib.import_module(TASK_MODULES[prefix])
    if name in TASKS:
        return TASKS[name]
    if prefix in TASK_PREFIXES and ":" in name:
        return TASK_PREFIXES[prefix].resolve(name)
    raise ValueError(f"--task={name!r} is unknown; allowed: {', '.join(task_names())}")


register_task("locomotion", lambda cfg: cfg,
              "legged_gym velocity tracking: joystick commands resampled, its rewards and terminations")


def make_env_config(robot: str = "go1", terrain: str | TerrainConfig | None = "flat", task: str = "locomotion",
                    num_envs: int = 16, seed: int = 0, num_threads: int | None = 1,
                    overrides: Mapping[str, Any] | None = None, one_column_per_type: bool = False,
                    terrain_grid: Mapping[str, Any] | None = None, backend: str = "mujoco_cpu",
                    warp: WarpConfig | None = None, adjust: Callable[[EnvConfig], EnvConfig] | None = None
                    ) -> EnvConfig:
    """The ``EnvConfig`` of (robot, terrain, task, adjust, overrides); see the module doc. ``terrain`` is a
    ``--terrain`` spec or a built ``TerrainConfig`` (None: flat); ``backend`` names the physics backend
    (``envs.backends.BACKENDS``), ``warp`` the mujoco_warp options."""
    configure = get_task(task).configure
    cfg = EnvConfig.flat(robot=robot, num_envs=num_envs, seed=seed)
    if isinstance(terrain, str):
        cfg.terrain = terrain_config(terrain, one_column_per_type, **dict(terrain_grid or {}))
    elif one_column_per_type or terrain_grid:
        raise ValueError("one_column_per_type and terrain_grid shape a --terrain spec; a built TerrainConfig "
                         "carries its own grid")
    else:
        cfg.terrain = terrain
    cfg.backend.num_threads = num_threads
    cfg.backend_name = backend
    if warp is not None:
        cfg.backend.warp = warp
    cfg = configure(cfg)
    if adjust is not None:
        cfg = adjust(cfg)
    return apply_overrides(cfg, dict(overrides or {}))


def make_env(robot: str = "go1", terrain: str | TerrainConfig | None = "flat", task: str = "locomotion",
             num_envs: int = 16, seed: int = 0, num_threads: int | None = 1,
             overrides: Mapping[str, Any] | None = None, one_column_per_type: bool = False,
             terrain_grid: Mapping[str, Any] | None = None, backend: str = "mujoco_cpu",
             warp: WarpConfig | None = None, task_options: Mapping[str, Any] | None = None,
             adjust: Callable[[EnvConfig], EnvConfig] | None = None) -> LeggedEnv:
    """A ``LeggedEnv`` of (robot, terrain, task, adjust, overrides) on the named physics backend (a ``QuardEnv``
    for ``quard:*`` tasks). ``task_options`` go to the task's own env class, beside its ``EnvConfig``
    (a QUARD task: ``QuardConfig`` fields such as ``{"images": False}``); a task without one takes none."""
    cfg = make_env_config(robot, terrain, task, num_envs, seed, num_threads, overrides, one_column_per_type,
                          terrain_grid, backend, warp, adjust)
    make = get_task(task).make
    if make is None:   # Task.own_env
        if task_options:
            raise ValueError(f"task {task!r} takes no task options; got {sorted(task_options)} "
                             f"(only tasks with their own env class, e.g. quard:*, do)")
        return LeggedEnv(cfg)
    return make(cfg, **dict(task_options or {}))
