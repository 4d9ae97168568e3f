"""The labelling rule: every finished episode is a success or a failure with one named reason.

Reasons are checked in priority order; the first that applies wins:

1. ``non_finite``      the physics went non-finite (the env terminated the episode for it)
2. ``fall``            the env terminated it for a bad orientation or a base too low
3. ``base_collision``  the env terminated it for a base/thigh contact
4. ``tracking_error``  mean |v_xy - cmd_xy| > ``max_lin_vel_error`` or mean |w_z - cmd_wz| >
                       ``max_ang_vel_error``
5. ``no_progress``     displacement < ``min_progress_fraction`` x the commanded displacement, checked
                       only when the commanded displacement is at least ``min_commanded_displacement``

else ``success``. The thresholds (a ``LabelRule``) are stored with every episode, and ``label`` returns
the numbers it compared, so a label can always be re-derived or audited later.

Why these numbers:

- 0.35 m/s linear, 0.5 rad/s yaw: legged_gym scores tracking with exp(-e^2 / 0.25), a 0.5 m/s (rad/s)
  length scale. A mean error of 0.35 m/s keeps only exp(-0.49) = 61 % of the tracking reward and is a
  third of the +-1 m/s joystick range: a robot that far off is not doing what it was told. Yaw uses
  the reward's own scale, 0.5 rad/s (exp(-1) = 37 %), because yaw tracking is looser on every expert
  (legged_gym weights it half as much).
- 0.5 of the commanded displacement: legged_gym's curriculum demotes a robot that covered less than
  half its commanded distance; the same bar here calls the episode "no progress".
- The commanded displacement is the straight-line distance the *ideal* robot would end up from its
  start when it follows the commanded velocities exactly, heading turning with the commanded yaw rate
  (``commanded_displacement``, computed by the rollout from the recorded commands). Using it instead
  of the commanded path length keeps turning and circling commands fair: a robot told to walk a full
  circle should end where it started. Below 0.5 m (standing, turning on the spot, short episodes) the
  ratio is dominated by drift and is not checked.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from quadforge.envs.quard.rules import OUTCOMES  # a QUARD task's outcome codes
from quadforge.envs.terminations import TERMINATION_REASONS  # the env's code table

# Failure reasons in priority order; "success" is the label when none applies.
FAILURE_REASONS = ("non_finite", "fall", "base_collision", "tracking_error", "no_progress")
# A task with its own success rule (QUARD, ``envs.quard.rules``) labels by its outcome instead of
# tracking; these are its failure reasons besides the physics ones above.
TASK_FAILURE_REASONS = ("timeout", "wrong_target", "obstacle_collision", "missed")
# Env termination reasons that are failures in themselves (``envs.terminations.TERMINATION_REASONS``).
_TERMINAL_FAILURES = ("non_finite", "fall", "base_collision")
_NON_FAILING_TERMINATIONS = ("none", "time_out")


@dataclass(frozen=True)
class LabelRule:
    max_lin_vel_error: float = 0.35       # m/s, mean |v_xy - cmd_xy| over the episode
    max_ang_vel_error: float = 0.5        # rad/s, mean |w_z - cmd_wz|
    min_progress_fraction: float = 0.5    # of the commanded displacement
    min_commanded_displacement: float = 0.5  # m; below it no_progress is not checked
    version: int = 1

    def __post_init__(self) -> None:
        for name in ("max_lin_vel_error", "max_ang_vel_error", "min_commanded_displacement"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"LabelRule.{name}={value!r}; must be a finite number > 0")
        if not 0.0 <= self.min_progress_fraction <= 1.0:
            raise ValueError(f"LabelRule.min_progress_fraction={self.min_progress_fraction!r}; must be in [0, 1]")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LabelRule":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown LabelRule fields {sorted(unknown)}; allowed: {sorted(cls.__dataclass_fields__)}")
        return cls(**d)


def termination_name(reason: int | str) -> str:
    """The name of an env termination reason given as its name or as its integer code."""
    if isinstance(reason, str):
        return reason
    code = int(reason)
    if not 0 <= code < len(TERMINATION_REASONS):
        raise ValueError(f"termination_reason code {code}; allowed: 0..{len(TERMINATION_REASONS) - 1} "
                         f"({', '.join(TERMINATION_REASONS)})")
    return TERMINATION_REASONS[code]


def _number(info: Mapping[str, Any], key: str) -> float:
    if key not in info:
        raise ValueError(f"episode info lacks {key!r}; the labelling rule needs it (got {sorted(info)})")
    return float(info[key])


def label(info: Mapping[str, Any], rule: LabelRule = LabelRule()) -> tuple[bool, str, dict[str, float]]:
    """(success, reason, numbers) for one finished episode's info.

    ``info`` carries the env's ``extras["episode_end"]`` entries for the episode (``termination_reason``
    as a name or code, ``lin_vel_error``, ``ang_vel_error``, ``distance``) and
    ``commanded_displacement`` (m) - or, if absent, ``commanded_distance``, the path length.
    ``reason`` is "success" or one of ``FAILURE_REASONS``.
    """
    if "quard_outcome" in info:
        return _task_label(info)
    termination = termination_name(info.get("termination_reason", "none"))
    if termination not in _TERMINAL_FAILURES + _NON_FAILING_TERMINATIONS:
        raise ValueError(f"termination_reason {termination!r}; allowed: {_NON_FAILING_TERMINATIONS + _TERMINAL_FAILURES}")
    lin_err = _number(info, "lin_vel_error")
    ang_err = _number(info, "ang_vel_error")
    distance = _number(info, "distance")
    target_key = "commanded_displacement" if "commanded_displacement" in info else "commanded_distance"
    target = _number(info, target_key)
    numbers = {"lin_vel_error": lin_err, "ang_vel_error": ang_err, "distance": distance,
               "commanded_displacement": target,
               "progress": distance / target if target > 0 else float("nan")}

    if termination in _TERMINAL_FAILURES:
        return False, termination, numbers
    # A NaN error is itself a sign of broken physics the env did not catch.
    if not all(math.isfinite(v) for v in (lin_err, ang_err, distance, target)):
        return False, "non_finite", numbers
    if lin_err > rule.max_lin_vel_error or ang_err > rule.max_ang_vel_error:
        return False, "tracking_error", numbers
    if target >= rule.min_commanded_displacement and distance < rule.min_progress_fraction * target:
        return False, "no_progress", numbers
    return True, "success", numbers


def _task_label(info: Mapping[str, Any]) -> tuple[bool, str, dict[str, float]]:
    """A QUARD episode: its outcome (name or code into ``envs.quard.rules.OUTCOMES``) is the label."""
    outcome = info["quard_outcome"]
    if not isinstance(outcome, str):
        code = int(outcome)
        if not 0 <= code < len(OUTCOMES):
            raise ValueError(f"quard_outcome code {code}; allowed: 0..{len(OUTCOMES) - 1} ({', '.join(OUTCOMES)})")
        outcome = OUTCOMES[code]
    if outcome not in OUTCOMES or outcome == "running":
        raise ValueError(f"quard_outcome {outcome!r}; a finished episode has one of {OUTCOMES[1:]}")
    numbers = {k: float(info[k]) for k in ("time_to_success", "path_length", "obstacle_contacts") if k in info}
    return outcome == "success", outcome, numbers
