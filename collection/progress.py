"""Progress of a collection job: a tqdm bar over episodes with steps/s and the success ratio.

The same tally serves one process (fed episode by episode) and the Ray driver (fed the workers'
running totals), so both show the same numbers.
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from tqdm import tqdm


@dataclass
class Tally:
    episodes: int = 0
    steps: int = 0
    successes: int = 0
    reasons: Counter = field(default_factory=Counter)

    def add(self, info: Mapping[str, Any]) -> None:
        self.episodes += 1
        self.steps += int(info["length"])
        self.successes += bool(info["success"])
        self.reasons[str(info["failure_reason"])] += 1

    def merge(self, other: "Tally") -> "Tally":
        return Tally(self.episodes + other.episodes, self.steps + other.steps,
                     self.successes + other.successes, self.reasons + other.reasons)

    @property
    def success_ratio(self) -> float:
        return self.successes / self.episodes if self.episodes else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "steps": self.steps, "successes": self.successes,
                "success_ratio": self.success_ratio, "reasons": dict(sorted(self.reasons.items()))}


class Progress:
    """A bar from ``done`` (already in the store) to ``target`` episodes."""

    def __init__(self, target: int, done: int, desc: str = "collect", enabled: bool = True) -> None:
        self.bar = tqdm(total=target, initial=done, desc=desc, unit="ep", disable=not enabled,
                        file=sys.stderr, dynamic_ncols=True, smoothing=0.1)
        self.shown = 0

    def update(self, tally: Tally, steps_per_s: float) -> None:
        """Show the run's totals: ``tally`` of episodes finished and the simulation rate (env-steps/s)."""
        self.bar.update(tally.episodes - self.shown)
        self.shown = tally.episodes
        self.bar.set_postfix(steps_s=f"{steps_per_s:,.0f}", success=f"{tally.success_ratio:.2f}", refresh=False)

    def close(self) -> None:
        self.bar.close()
