"""A synthetic trajectory store of any size, written without simulation (the out-of-core benchmark's data).

Episodes come from ``data.synthetic`` (sensor-like signals, a success label, ``terminated`` on failed
episodes' last step); they are staged and compacted in blocks, so a 50M-step store is built through the
store's one writer (``data.compaction``) with at most one block of episodes in RAM or in staging.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

from quadforge.data.compaction import compact
from quadforge.data.synthetic import synthetic_episode, synthetic_info
from quadforge.data.writer import StagingWriter
from quadforge.layout import PROPRIO
from quadforge.seeding import numpy_rng

# what the sequence and Q-learning trainers read on the proprio layout, and no more: the benchmark's
# store then costs disk and write time only for what training touches
TRAINING_FEATURES = tuple(PROPRIO.term_names) + ("actions", "rewards", "terminated", "time_outs")


def write_synthetic_store(root: str | Path, num_steps: int, episode_length: int = 1000, seed: int = 0,
                          features: Iterable[str] = TRAINING_FEATURES, block_steps: int = 2_000_000,
                          log: Callable[[str], None] | None = None) -> float:
    """Write ``ceil(num_steps / episode_length)`` episodes of ``episode_length`` steps to ``root`` (a new
    or existing store; episodes already there count towards ``num_steps``, so an interrupted write
    resumes). Three episodes in four succeed. Returns the wall seconds taken."""
    if num_steps < 1 or episode_length < 1:
        raise ValueError(f"write_synthetic_store: num_steps={num_steps}, episode_length={episode_length}; both >= 1")
    t0 = time.perf_counter()
    features = tuple(features)
    episodes = -(-int(num_steps) // int(episode_length))
    per_block = max(1, int(block_steps) // int(episode_length))
    root = Path(root)
    with StagingWriter(root, "synthetic") as writer:
        done = writer.counter               # resumes after the episodes already written
        while done < episodes:
            stop = min(episodes, done + per_block)
            for i in range(done, stop):
                rng = numpy_rng(seed, f"synthetic_store/{i}")    # one stream per episode: resumable
                ok = i % 4 != 3
                writer.write_episode(synthetic_episode(rng, episode_length, ok, features), synthetic_info(i, ok))
            compact(root)
            done = stop
            if log:
                log(f"synthetic store {root}: {done * episode_length:,} of {episodes * episode_length:,} steps "
                    f"({time.perf_counter() - t0:.0f} s)")
    return time.perf_counter() - t0
