"""Registers the ``quard:`` tasks with the env builder (``envs.builder.make_env``): ``quard:<family>`` for
every family registered in ``envs.quard.families`` (at any time: the names are resolved when asked) and
``quard:all``.

The builder imports this module on the first ``quard:`` task name. ``configure`` puts the QUARD
locomotion settings (``envs.quard.env.quard_env_config``: nominal physics, no pushes, calm start, the
env's own velocity commands zero, 20 s, no curriculum) onto the builder's config, keeping its robot,
terrain, envs, seed, threads and backend; ``make`` builds a ``QuardEnv`` with the default camera (64x64 RGB at
5 Hz) unless ``make_env(..., task_options=...)`` gives other ``QuardConfig`` fields (``{"images": False}``:
no camera, proprioception and task terms only); overrides of ``EnvConfig`` fields apply after
``configure`` as for any task.
"""
from __future__ import annotations

from dataclasses import fields, replace

from quadforge.envs.builder import Task, register_task_prefix
from quadforge.envs.config import EnvConfig
from quadforge.envs.quard.env import QuardConfig, QuardEnv, quard_env_config
from quadforge.envs.quard.families import get_family
from quadforge.envs.quard.instructions import quard_tasks, task_families


def _configure(cfg: EnvConfig) -> EnvConfig:
    q = quard_env_config(cfg.backend.robot, cfg.num_envs, cfg.seed, cfg.terrain)
    q.backend = replace(q.backend, num_threads=cfg.backend.num_threads, warp=cfg.backend.warp)
    q.backend_name = cfg.backend_name
    return q


def _task(name: str) -> Task:
    families = task_families(name)        # a one-line error naming the allowed families
    help = ("QUARD: a family drawn per episode" if name == "quard:all"
            else f"QUARD {families[0]}: \"{get_family(families[0]).template}, <speed> with a <gait> gait\"")
    return Task(name, _configure, help, make=lambda cfg, **options: _make(name, cfg, options),
                default_policy="quard_expert")


def _make(name: str, cfg: EnvConfig, options: dict) -> QuardEnv:
    """``QuardEnv`` of task ``name`` over ``cfg``; ``options`` are ``QuardConfig`` fields (``images``, ``colours``, ...)."""
    allowed = {f.name for f in fields(QuardConfig)} - {"task", "env"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"{name}: unknown task options {unknown}; allowed: {', '.join(sorted(allowed))}")
    return QuardEnv(QuardConfig(task=name, env=cfg, **options))


register_task_prefix("quard", _task, quard_tasks)
