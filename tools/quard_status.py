"""`quadforge reproduce --stages quard --status`: where a QUARD-Auto run stands, without running anything.

A Table III run takes hours on a CPU and is resumed across sessions, so the first question on coming back
to one is what is done, what is left and how long the rest takes. The answer comes from the run's own
files: the plan of its last command (``OUT/run.json``; flags given with ``--status`` replace that command's,
so ``--status --train-steps 48000`` shows what a longer budget would run), each step's completeness
(``reproduce_quard.is_complete``, the test a run itself uses), a training's step and rate from its log
(``OUT/logs/<step>.log``, the trainer's ``step k/N ... samples_per_s=R`` lines), a collection's episodes.
The log's age says whether a step is being written now; this module starts and stops nothing.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from quadforge.tools.reproduce_quard import (TRAIN_STAGES, QuardConfig, Step, build_plan, given_fields, is_complete,
                                             quard_out, step_log_path, step_training, steps_to_run, store_episodes)

ACTIVE_S = 300.0   # a log written this recently belongs to a step that is running (a GeRM step logs every ~15 s)


@dataclass
class StepStatus:
    step: Step
    complete: bool
    detail: str
    left_s: float | None = None   # a training's seconds left at its log's rate (one core); None: unknown


def _age(path: Path, now: float, this_run: bool) -> str:
    """How long ago the log was written; "running" only when its last line is this run's (a copied or
    just-resumed log is new, but its last line is the earlier, shorter run's)."""
    s = max(0.0, now - path.stat().st_mtime)
    when = f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"
    return f"log written {when} ago" + (" (running)" if s < ACTIVE_S and this_run else "")


def _training_status(cfg: QuardConfig, step: Step, now: float) -> StepStatus:
    p, target, this_run = step_training(cfg.out, step)
    if p is None:
        return StepStatus(step, False, "not started" if target is None else f"not started, {target:,} steps")
    log = step_log_path(cfg.out, step)
    return StepStatus(step, False, f"{p.describe(target)}; {_age(log, now, this_run)}", p.left_s(target))


def run_status(cfg: QuardConfig, now: float | None = None) -> list[StepStatus]:
    """Every step of ``cfg``'s plan with its state; a run's own errors (a shorter budget than the one
    trained, ...) are raised as the run would raise them."""
    now = time.time() if now is None else now
    steps = build_plan(cfg)
    todo = {s.id for s in steps_to_run(cfg, steps)}
    rows = []
    for step in steps:
        if step.id not in todo:
            rows.append(StepStatus(step, True, "complete"))
        elif step.stage in TRAIN_STAGES:
            rows.append(_training_status(cfg, step, now))
        elif step.stage in ("demos", "auto"):
            have, want = store_episodes(step.output), int(step.meta["episodes"])
            rows.append(StepStatus(step, False, f"{have} of {want} episodes"))
        else:
            waits = [a for a in step.after if a in todo]
            again = is_complete(cfg, step)   # a finished evaluation whose training runs again
            rows.append(StepStatus(step, False, f"after {', '.join(waits)}" if waits else
                                   "runs again (its training changed)" if again else "ready"))
    return rows


def status_text(cfg: QuardConfig, rows: list[StepStatus]) -> str:
    width = max(len(r.step.id) for r in rows)
    started = (Path(cfg.out) / "run.json").exists()
    lines = [f"{cfg.out}: {sum(r.complete for r in rows)} of {len(rows)} steps complete"
             + ("" if started else " (no run there yet: the plan of the flags given)")]
    lines += [f"  {r.step.id:<{width}}  {'done' if r.complete else 'to run':<6}  {r.detail}" for r in rows]
    trainings = [r for r in rows if not r.complete and r.step.stage in TRAIN_STAGES]
    known = [r.left_s for r in trainings if r.left_s is not None]
    if trainings:
        lines.append(f"trainings left: {len(trainings)}" + (
            f"; {sum(known) / 3600:.1f} h of training on one core each for the {len(known)} with a rate in "
            f"their logs" if known else "") + " (with --jobs N, up to N run at once)")
    if not any(not r.complete for r in rows):
        lines.append("nothing to run: the report rebuilds with --report-only")
    return "\n".join(lines)


def config_of_run(out: str, given: dict[str, Any]) -> QuardConfig:
    """The config of the run's last command (``OUT/run.json``), with the flags given now in its place; the
    given flags alone where the run has not started."""
    path = Path(out) / "run.json"
    stored: dict[str, Any] = json.loads(path.read_text()).get("config", {}) if path.exists() else {}
    names = {f.name for f in fields(QuardConfig)}
    base = {k: tuple(v) if isinstance(v, list) else v for k, v in stored.items() if k in names}
    return QuardConfig(**{**base, **given, "out": out}).validate()


def run_from_args(args: argparse.Namespace, seeds: tuple[int, ...] | None) -> int:
    """``quadforge reproduce --stages quard --status``: print where ``--out`` stands; run and write nothing."""
    if args.report_only:
        raise ValueError("--report-only and --status: give one (--status runs nothing, --report-only rebuilds the report)")
    if args.pool:
        raise ValueError("--pool and --status: --pool belongs to --report-only; --status reads one run (--out)")
    cfg = config_of_run(quard_out(args), given_fields(args, seeds))
    print(status_text(cfg, run_status(cfg)))
    return 0
