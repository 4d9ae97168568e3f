"""A training's progress read from its log: the last ``step k/N ... samples_per_s=R`` line the trainer
writes (training/loop.py), as "at step k of N, ~m min left at r steps/s".

One reader for the two places that report a long run's trainings: the QUARD loop's runner (a line every
few minutes while its steps run, so a run in a log file or under ``nohup`` shows it is alive) and
``reproduce --stages quard --status``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# "[germ] step 2550/24000 loss=... samples_per_s=54.49" (a validation line says "val step" and has no rate)
_PROGRESS = re.compile(r"\] step (\d+)/(\d+) .*?samples_per_s=([0-9.eE+-]+)")


@dataclass
class TrainingProgress:
    step: int            # the last step the log reports
    of: int              # the length that run was asked for
    steps_per_s: float | None   # its rate then (samples/s over the batch); None: the batch is not known

    def left_s(self, target: int) -> float | None:
        """Seconds to ``target`` steps at this rate; None without one."""
        return max(0, target - self.step) / self.steps_per_s if self.steps_per_s else None

    def describe(self, target: int) -> str:
        done = min(self.step, target)
        left = self.left_s(target)
        eta = f", ~{left / 60:.0f} min left at {self.steps_per_s:.1f} steps/s" if left is not None else ""
        return f"at step {done:,} of {target:,}{eta}"


def training_progress(log: Path, batch_size: int | None) -> TrainingProgress | None:
    """The last progress line of a training's log (a continued training's log holds every run's lines)."""
    if not log.exists():
        return None
    last = None
    with open(log, errors="replace") as fh:
        for line in fh:
            m = _PROGRESS.search(line)
            if m:
                last = m
    if last is None:
        return None
    return TrainingProgress(int(last[1]), int(last[2]), float(last[3]) / batch_size if batch_size else None)


def batch_size_of(argv: list[str]) -> int | None:
    """A ``quadforge train`` command's ``--batch-size``; None where its preset sets it (no time left is
    then given: the log's rate is in samples)."""
    return int(argv[argv.index("--batch-size") + 1]) if "--batch-size" in argv else None
