"""Counterfactual (paired) demonstrations for the QUARD tasks (``quadforge collect --task quard:* --counterfactual R``).

A policy trained on one demonstration per scene can score well while ignoring the words: on the training
scenes something in the picture often tells the objects apart (the rolling ball, the panel on the line to
the target). The privileged expert can label any scene for any instruction, so this mode records, for the
same scene, the expert for each candidate target: the scene as drawn (its instruction names the target)
and, for a share ``R`` of the scenes, the same scene with the instruction naming the other candidate (the
other object, ball, letter box or tunnel: ``envs.quard.families.swap_instruction``, the env's
``swap_instruction`` option). Both episodes start from the same first frame with different instructions,
and the expert walks to different objects.

How the pairs are made without touching the env: QUARD draws the scene of env i's k-th episode from
``numpy_rng(seed, "quard/env{i}/episode{k}")``, so two envs built with the same seed and number of envs
lay out the same scenes, episode for episode. Phase 1 runs the original env and records its episodes,
drawing per scene (seeded) whether it gets a partner; phase 2 runs the swapped env with the same seed
until every chosen (env, episode) has finished there, and records exactly those (its other episodes are
simulated and dropped). Every episode's ``task_params`` carry ``env_id``, ``episode`` and ``seed``; the
partner has ``instruction_swapped`` and ``original_instruction`` (``pairs_of`` finds the pairs in a store).

The quota counts both halves: with ``R`` = 1 a 1,000-episode quota is 500 scenes, each recorded twice.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping

from quadforge.collection.background_writer import BackgroundWriter
from quadforge.collection.progress import Tally
from quadforge.collection.rollout import Rollout, RolloutConfig
from quadforge.data.admission import check_store_accepts
from quadforge.data.writer import StagingWriter
from quadforge.envs.builder import make_env
from quadforge.seeding import derive_seed, numpy_rng, seed_everything


def check_ratio(ratio: float, task: str, workers: int) -> None:
    """One line naming what is wrong with ``--counterfactual``."""
    if not 0.0 <= float(ratio) <= 1.0:
        raise ValueError(f"--counterfactual={ratio!r} is invalid; allowed: a share of scenes in [0, 1] "
                         f"(0: off, 1: every scene recorded for both candidates)")
    if ratio > 0 and not task.startswith("quard:"):
        raise ValueError(f"--counterfactual applies to the QUARD tasks (--task quard:...), not --task {task}")
    if ratio > 0 and workers:
        raise ValueError("--counterfactual collects in this process (its pairs need one env seed); "
                         "drop --workers")


def wants_partner(seed: int, env_id: int, episode: int, ratio: float) -> bool:
    """Whether scene (env_id, episode) of a run seeded ``seed`` is also recorded with the swapped
    instruction: a seeded draw per scene, so the choice does not depend on timing."""
    if ratio >= 1.0:
        return True
    if ratio <= 0.0:
        return False
    return bool(numpy_rng(seed, f"counterfactual/env{env_id}/episode{episode}").random() < ratio)


def scene_key(info: Mapping[str, Any]) -> tuple[int, int, int]:
    """(seed, env, episode) of a QUARD episode's info: the scene's identity."""
    p = info.get("task_params") or {}
    missing = [k for k in ("seed", "env_id", "episode") if k not in p]
    if missing:
        raise ValueError(f"episode info lacks task_params {missing}: not a QUARD episode (counterfactual pairs "
                         f"need the scene's seed, env and episode index)")
    return int(p["seed"]), int(p["env_id"]), int(p["episode"])


def pairs_of(params: Iterable[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """Indices (original, swapped) of the paired episodes among a store's ``task_params`` rows."""
    originals, swapped = {}, {}
    for i, p in enumerate(params):
        if not p or "episode" not in p:
            continue
        key = (int(p["seed"]), int(p["env_id"]), int(p["episode"]))
        (swapped if p.get("instruction_swapped") else originals)[key] = i
    return [(originals[k], swapped[k]) for k in sorted(swapped) if k in originals]


def _task_env(cfg: Any, seed: int, swapped: bool) -> Any:
    return make_env(cfg.robot, cfg.terrain, task=cfg.task, num_envs=cfg.num_envs, seed=seed,
                    num_threads=cfg.num_threads, backend=cfg.backend, warp=cfg.warp,
                    task_options={"images": cfg.images, "swap_instruction": swapped},
                    overrides=cfg.env_overrides())


def collect_paired_episodes(cfg: Any, collector_id: str, quota: int, make_policy: Callable[[Any, Any, int], Any],
                            on_episode: Callable[[Tally, float], None] | None = None) -> dict[str, Any]:
    """Collect ``quota`` episodes (originals and their partners) as ``collector_id`` into ``cfg.out``
    (``collection.collect.CollectConfig`` with ``counterfactual`` > 0); ``make_policy(cfg, env, seed)``
    builds the driving policy for each phase's env. Returns the run's summary with ``scenes`` and ``pairs``."""
    ratio = float(cfg.counterfactual)
    writer = StagingWriter(cfg.out, collector_id)
    run_seed = derive_seed(cfg.seed, f"collect:{collector_id}:{writer.counter}") % (2**31)
    seed_everything(run_seed)
    tally, env_steps = Tally(), 0
    wanted: dict[tuple[int, int, int], bool] = {}     # scene -> partner still to record
    t0 = time.perf_counter()
    info_extra = {"robot": cfg.robot, "terrain_spec": cfg.terrain, "seed": run_seed, "push_vel": cfg.push,
                  "collector_id": collector_id, "counterfactual_ratio": ratio}

    def run_phase(swapped: bool, background: BackgroundWriter) -> None:
        nonlocal env_steps
        env = _task_env(cfg, run_seed, swapped)
        try:
            check_store_accepts(cfg.out, robot=cfg.robot, control_dt=float(env.dt), what=f"collector {collector_id}")
            rollout = Rollout(env, make_policy(cfg, env, run_seed),
                              RolloutConfig(action_noise_std=cfg.action_noise, seed=run_seed,
                                            frame_stride=cfg.frame_stride, label_rule=cfg.label_rule),
                              info_extra={**info_extra, "control_dt": float(env.dt),
                                          "counterfactual_role": "swapped" if swapped else "original"})
            # a bound the run never reaches unless an env stops ending episodes (every episode times out)
            limit = max(1, quota) * int(env.max_episode_length) + 10 * int(env.max_episode_length)
            for episode in rollout.episodes(max_steps=limit):
                key = scene_key(episode.info)
                if swapped:
                    if not wanted.get(key):
                        continue                    # a scene without a partner, simulated only to reach the next
                    wanted[key] = False
                else:
                    wanted[key] = wants_partner(run_seed, key[1], key[2], ratio)
                if tally.episodes == 0:
                    check_store_accepts(cfg.out, features=episode.features, what=f"collector {collector_id}")
                background.submit(episode.features, episode.info)
                tally.add(episode.info)
                if on_episode is not None:
                    on_episode(tally, (env_steps + rollout.env_steps) / max(time.perf_counter() - t0, 1e-9))
                if swapped and not any(wanted.values()):
                    break
                if not swapped and tally.episodes + sum(wanted.values()) >= quota:
                    break
            env_steps += rollout.env_steps
            if swapped and any(wanted.values()):
                left = [k for k, v in wanted.items() if v]
                raise RuntimeError(f"counterfactual collection: {len(left)} partner scenes never finished in the "
                                   f"swapped env within {limit} steps (first: seed/env/episode {left[0]})")
        finally:
            close = getattr(env, "close", None)
            if close is not None:
                close()

    with BackgroundWriter(writer) as background:
        run_phase(False, background)
        pairs = sum(wanted.values())
        if pairs:
            run_phase(True, background)
    return {"collector_id": collector_id, "seed": run_seed, "seconds": time.perf_counter() - t0,
            "env_steps": env_steps, "scenes": len(wanted), "pairs": pairs, **tally.to_dict()}

