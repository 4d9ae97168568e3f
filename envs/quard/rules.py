"""Success and failure rules of the QUARD families, on batched numpy state (checked every step).

Facts (seed 003 / the public QUARD task code): go_to, go_avoid: base within 1.0 m (xy) of the target;
stop: within 1.0 m of the moving target ball; distinguish: the target within +-5 degrees of the heading
or |dy| < 0.2 m; go_through: within 1.0 m of the point 1 m past the named tunnel; limits 20 s (15 s
go_through). Ours adds what the public code leaves out:

- go_avoid fails on any contact between the robot and the obstacle (``obstacle_collision``);
- every family fails when the robot first meets the distractor by the family's own success rule
  (``wrong_target``): within 1.0 m of the other object / ball, facing or lining up with the other
  letter, through the other tunnel or within 1.0 m of the point behind it; if the target and the
  distractor satisfy the rule at the same step, the nearer one decides;
- go_through counts only when the base has passed through the named tunnel (inside its 1 m x 0.9 m
  footprint at some step) before reaching the goal point;
- stop counts only while the ball is still at least ``STOP_MEET_X`` = 1 m ahead of the spawn (the
  robot went to meet it); a ball that rolls past that line un-met is ``missed``. Without this a robot
  standing still succeeds, since the ball rolls by at |y| ~ 0.75 m < 1 m. The other ball likewise
  counts as met only while it is ahead of that line (it stands at x ~ 3 m, except in a swapped-instruction
  scene, where it is the one rolling past: ``families.swap_instruction``).

Physics failures (fall, base collision, non-finite) come from the env's terminations and rank first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from quadforge.envs.quard.instructions import FAMILIES
from quadforge.envs.quard.objects import TUNNEL_LENGTH, TUNNEL_WIDTH

OUTCOMES = ("running", "success", "timeout", "wrong_target", "obstacle_collision", "missed", "fall",
            "base_collision", "non_finite")
OUTCOME_CODE = {name: i for i, name in enumerate(OUTCOMES)}
FAMILY_CODE = {name: i for i, name in enumerate(FAMILIES)}
SUCCESS_RADIUS = 1.0                      # m
HEADING_TOLERANCE = math.radians(5.0)     # distinguish
LINEUP_TOLERANCE = 0.2                    # m, distinguish |dy|
STOP_MEET_X = 1.0                         # m ahead of the spawn
TIME_LIMIT_S = {"go_to": 20.0, "go_avoid": 20.0, "stop": 20.0, "distinguish": 20.0, "go_through": 15.0}
_GO_THROUGH, _STOP, _DISTINGUISH = FAMILY_CODE["go_through"], FAMILY_CODE["stop"], FAMILY_CODE["distinguish"]


@dataclass
class RuleState:
    """One step of N envs, xy relative to each env's spawn point (m), yaw in rad."""

    family: np.ndarray          # (N,) int, FAMILY_CODE
    base_xy: np.ndarray         # (N, 2)
    yaw: np.ndarray             # (N,)
    target_xy: np.ndarray       # (N, 2) the point to reach / face (the ball's current position for stop)
    distractor_xy: np.ndarray   # (N, 2)
    through_named: np.ndarray   # (N,) bool: the base has been inside the named tunnel (go_through)
    through_other: np.ndarray   # (N,) bool: ... inside the other tunnel
    obstacle_contact: np.ndarray  # (N,) bool: robot touching the obstacle this step
    time_s: np.ndarray          # (N,) episode time after this step


def inside_tunnel(base_xy: np.ndarray, centre_xy: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """(N,) bool: the base point lies in the tunnel's footprint (axis along x)."""
    d = np.abs(base_xy - centre_xy)
    return (d[:, 0] < TUNNEL_LENGTH / 2 - margin) & (d[:, 1] < TUNNEL_WIDTH / 2 - margin)


def _wrap(a: np.ndarray) -> np.ndarray:
    return (a + np.pi) % (2 * np.pi) - np.pi


def _faces(base_xy: np.ndarray, yaw: np.ndarray, point: np.ndarray) -> np.ndarray:
    """distinguish's rule for one box: within +-5 deg of the heading, or lined up (|dy| < 0.2 m)."""
    rel = point - base_xy
    bearing = np.arctan2(rel[:, 1], rel[:, 0])
    return (np.abs(_wrap(bearing - yaw)) <= HEADING_TOLERANCE) | (np.abs(rel[:, 1]) < LINEUP_TOLERANCE)


def judge(s: RuleState) -> np.ndarray:
    """(N,) int outcome codes of the task rules (0 = still running); physics failures are the caller's."""
    fam = np.asarray(s.family)
    d_target = np.linalg.norm(s.target_xy - s.base_xy, axis=1)
    d_other = np.linalg.norm(s.distractor_xy - s.base_xy, axis=1)
    reach = d_target < SUCCESS_RADIUS
    reach_other = d_other < SUCCESS_RADIUS
    # distinguish: facing / lining up instead of reaching
    dist = fam == _DISTINGUISH
    if dist.any():
        reach = np.where(dist, _faces(s.base_xy, s.yaw, s.target_xy), reach)
        reach_other = np.where(dist, _faces(s.base_xy, s.yaw, s.distractor_xy), reach_other)
    # go_through: the goal counts only through the named tunnel; the other tunnel is a wrong target
    thr = fam == _GO_THROUGH
    reach = np.where(thr, reach & s.through_named, reach)
    reach_other = np.where(thr, (reach_other & ~s.through_named) | (s.through_other & ~s.through_named), reach_other)
    # stop: meet the ball while it is still ahead of the meeting line
    stop = fam == _STOP
    ahead = s.target_xy[:, 0] >= STOP_MEET_X
    reach = np.where(stop, reach & ahead, reach)
    reach_other = np.where(stop, reach_other & (s.distractor_xy[:, 0] >= STOP_MEET_X), reach_other)
    missed = stop & ~ahead & ~reach

    both = reach & reach_other
    nearer = d_target <= d_other
    success = reach & (~both | nearer)
    wrong = reach_other & ~success
    limits = np.array([TIME_LIMIT_S[f] for f in FAMILIES])[fam]
    timeout = s.time_s >= limits - 1e-9

    out = np.zeros(len(fam), dtype=np.int64)
    # priority (first wins): obstacle collision, wrong target, success, missed, timeout
    for mask, name in ((timeout, "timeout"), (missed, "missed"), (success, "success"), (wrong, "wrong_target"),
                       (np.asarray(s.obstacle_contact, dtype=bool), "obstacle_collision")):
        out = np.where(mask, OUTCOME_CODE[name], out)
    return out
