"""Success and failure rules of the QUARD families, on batched numpy state (checked every step).

The shared rule (seed 003 / the public QUARD task code): the base within 1.0 m (xy) of the target; each
family may replace it (``Family.rule``: distinguish faces the box, go_through must pass through the
named tunnel, stop meets the ball while it is ahead - the family modules under ``envs/quard/family/``
say what and why) and has its own time limit (``Family.time_limit_s``). Ours adds what the public code
leaves out:

- any contact between the robot and the obstacle fails (``obstacle_collision``);
- every family fails when the robot first meets the distractor by the family's own success rule
  (``wrong_target``); if the target and the distractor satisfy the rule at the same step, the nearer
  one decides.

Physics failures (fall, base collision, non-finite) come from the env's terminations and rank first.
"""
from __future__ import annotations

import numpy as np

from quadforge.envs.quard.families import all_families, family_of_code
from quadforge.envs.quard.family.base import SUCCESS_RADIUS, RuleState  # noqa: F401  (the rules' vocabulary)
from quadforge.envs.quard.objects import TUNNEL_LENGTH, TUNNEL_WIDTH

OUTCOMES = ("running", "success", "timeout", "wrong_target", "obstacle_collision", "missed", "fall",
            "base_collision", "non_finite")
OUTCOME_CODE = {name: i for i, name in enumerate(OUTCOMES)}


def inside_tunnel(base_xy: np.ndarray, centre_xy: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """(N,) bool: the base point lies in the tunnel's footprint (axis along x)."""
    d = np.abs(base_xy - centre_xy)
    return (d[:, 0] < TUNNEL_LENGTH / 2 - margin) & (d[:, 1] < TUNNEL_WIDTH / 2 - margin)


def judge(s: RuleState) -> np.ndarray:
    """(N,) int outcome codes of the task rules (0 = still running); physics failures are the caller's."""
    fam = np.asarray(s.family)
    d_target = np.linalg.norm(s.target_xy - s.base_xy, axis=1)
    d_other = np.linalg.norm(s.distractor_xy - s.base_xy, axis=1)
    reach = d_target < SUCCESS_RADIUS
    reach_other = d_other < SUCCESS_RADIUS
    missed = np.zeros(len(fam), dtype=bool)
    for code in np.unique(fam):                # each family's own rule on its rows
        rule = family_of_code(code).rule
        if rule is not None:
            rows = fam == code
            r, ro, m = rule(s, reach, reach_other)
            reach, reach_other = np.where(rows, r, reach), np.where(rows, ro, reach_other)
            if m is not None:
                missed |= rows & m

    both = reach & reach_other
    nearer = d_target <= d_other
    success = reach & (~both | nearer)
    wrong = reach_other & ~success
    limits = np.array([f.time_limit_s for f in all_families()])[fam]
    timeout = s.time_s >= limits - 1e-9

    out = np.zeros(len(fam), dtype=np.int64)
    # priority (first wins): obstacle collision, wrong target, success, missed, timeout
    for mask, name in ((timeout, "timeout"), (missed, "missed"), (success, "success"), (wrong, "wrong_target"),
                       (np.asarray(s.obstacle_contact, dtype=bool), "obstacle_collision")):
        out = np.where(mask, OUTCOME_CODE[name], out)
    return out
