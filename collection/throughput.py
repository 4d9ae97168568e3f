"""What recording costs: the env stepping the gait expert alone vs the full collection at the same N.

``measure`` builds one env and one gait controller and alternates two timed blocks of ``steps``
control steps each, ``repeats`` times (interleaving spreads the shared machine's noise over both):

- ``env``: ``env.step(policy.act(env.terms))``, nothing kept;
- ``collect``: the ``Rollout`` loop with recording on, every finished episode written durably through
  ``StagingWriter`` (into a temporary store) by the ``BackgroundWriter`` thread, as ``quadforge
  collect`` does; the block's clock stops when the last episode is on disk.

Episodes are cut to ``episode_s`` so several finish (and are written) inside a block. The ratio of the
median rates is the number to watch (the target is >= 0.85). ``quadforge bench store`` reports it.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

import torch

from quadforge.collection.background_writer import BackgroundWriter
from quadforge.collection.collect import CollectConfig, build_env, build_policy
from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.data.writer import StagingWriter


def _env_and_policy(num_envs: int, robot: str, terrain: str | None, episode_s: float, seed: int) -> tuple[Any, Any]:
    cfg = CollectConfig(out="", episodes=1, robot=robot, terrain=terrain or "flat", num_envs=num_envs,
                        max_episode_s=episode_s, seed=seed)
    env = build_env(cfg, seed)
    return env, build_policy(cfg, env)


def measure(num_envs: int, steps: int, robot: str = "go1", terrain: str | None = None, repeats: int = 3,
            episode_s: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """Env-steps per second of the bare env loop and of the full collection, and their ratio."""
    if steps < 1 or num_envs < 1 or repeats < 1:
        raise ValueError(f"measure: num_envs={num_envs}, steps={steps}, repeats={repeats}; each must be >= 1")
    env, policy = _env_and_policy(num_envs, robot, terrain, episode_s, seed)
    env_rates, collect_rates, written = [], [], 0
    try:
        with tempfile.TemporaryDirectory(prefix="quadforge-throughput-") as tmp:
            writer = StagingWriter(tmp, "bench")
            rollout = Rollout(env, policy, RolloutConfig(seed=seed))  # buffers allocated once, as in a job
            for _ in range(repeats):
                policy.reset(torch.arange(num_envs))
                t0 = time.perf_counter()
                for _ in range(steps):
                    env.step(policy.act(env.terms))
                env_rates.append(steps * num_envs / (time.perf_counter() - t0))

                t0 = time.perf_counter()
                with BackgroundWriter(writer) as background:
                    for episode in rollout.episodes(max_steps=steps):
                        background.submit(episode.features, episode.info)
                        written += 1
                # the block ends when its episodes are on disk: writes are counted, not hidden
                collect_rates.append(steps * num_envs / (time.perf_counter() - t0))
    finally:
        env.close()
    env_rate, collect_rate = statistics.median(env_rates), statistics.median(collect_rates)
    return {"num_envs": num_envs, "steps": steps, "repeats": repeats, "robot": robot, "terrain": terrain or "flat",
            "env_steps_per_s": env_rate, "collect_steps_per_s": collect_rate, "ratio": collect_rate / env_rate,
            "episodes_written": written}
