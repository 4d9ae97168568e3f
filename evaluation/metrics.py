"""Evaluation metrics: per-episode numbers from a rollout ``Episode`` and their summary per cell.

Per episode (``episode_metrics``):
- ``return``: the env's task reward summed over the episode (``extras["episode_end"]["return"]``);
- ``success``: the labelling rule of ``collection.labels`` (the rollout labels every episode);
- ``fall``: the episode ended with the robot down - a ``fall`` or a ``base_collision`` termination
  (``non_finite`` physics is counted apart, as ``non_finite``);
- ``lin_vel_error`` / ``ang_vel_error``: the env's mean |v_xy - cmd_xy| (m/s) and |w_z - cmd_wz| (rad/s);
- ``distance``: xy distance from the start (m);
- ``high_freq_energy``: action smoothness, the share of the action sequence's energy above
  ``SMOOTHNESS_CUTOFF_HZ`` (5 Hz at the 50 Hz control rate, i.e. above half of Nyquist): per joint, the
  mean-removed sequence's one-sided power spectrum (``numpy.fft.rfft``), energy above the cutoff over
  all energy, joints pooled. 0 is perfectly smooth; white noise gives about 0.8 (the share of
  frequency bins above 5 Hz). Undefined (NaN, skipped in means) for episodes shorter than
  ``MIN_SMOOTHNESS_STEPS`` or with constant actions.

``summarize`` reduces a list of per-episode dicts to means, a 95 % normal-approximation interval of the
success rate (Wilson) and counts; NaNs are skipped per metric.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping

import numpy as np

SMOOTHNESS_CUTOFF_HZ = 5.0
MIN_SMOOTHNESS_STEPS = 10
FALL_REASONS = ("fall", "base_collision")
MEAN_METRICS = ("return", "success", "fall", "non_finite", "lin_vel_error", "ang_vel_error", "distance",
                "length", "high_freq_energy")


def high_freq_energy(actions: np.ndarray, dt: float, cutoff_hz: float = SMOOTHNESS_CUTOFF_HZ) -> float:
    """Share of the energy of ``actions`` (T, A) above ``cutoff_hz`` for a control period ``dt`` (s)."""
    a = np.asarray(actions, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"actions must be (T, A); got shape {a.shape}")
    if not dt > 0:
        raise ValueError(f"dt={dt!r}; must be > 0 seconds")
    if a.shape[0] < MIN_SMOOTHNESS_STEPS:
        return float("nan")
    a = a - a.mean(axis=0, keepdims=True)
    power = np.abs(np.fft.rfft(a, axis=0)) ** 2          # (F, A)
    freqs = np.fft.rfftfreq(a.shape[0], d=dt)            # (F,)
    total = power.sum()
    if not total > 1e-12:
        return float("nan")
    return float(power[freqs > cutoff_hz].sum() / total)


def episode_metrics(info: Mapping[str, Any], actions: np.ndarray | None, dt: float) -> dict[str, Any]:
    """The numbers evaluation keeps for one finished episode (see the module doc)."""
    reason = str(info.get("termination_reason", "none"))
    return {
        "return": float(info.get("return", float("nan"))),
        "success": float(bool(info["success"])),
        "fall": float(reason in FALL_REASONS),
        "non_finite": float(reason == "non_finite"),
        "failure_reason": str(info.get("failure_reason", "none")),
        "lin_vel_error": float(info.get("lin_vel_error", float("nan"))),
        "ang_vel_error": float(info.get("ang_vel_error", float("nan"))),
        "distance": float(info.get("distance", float("nan"))),
        "length": int(info["length"]),
        "high_freq_energy": high_freq_energy(actions, dt) if actions is not None else float("nan"),
    }


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a success rate (sensible at the tiny counts used here)."""
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def fisher_exact_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p of Fisher's exact test that successes ``k1`` of ``n1`` and ``k2`` of ``n2`` come from one
    success rate: the probability, given the margins, of every table no likelier than the one observed
    (exact at the few episodes of an evaluation cell, where the normal approximation is not)."""
    if not (0 <= k1 <= n1 and 0 <= k2 <= n2):
        raise ValueError(f"fisher_exact_p: successes must lie in [0, episodes], got {k1}/{n1} and {k2}/{n2}")
    total, wins = n1 + n2, k1 + k2
    if total == 0 or n1 == 0 or n2 == 0:
        return 1.0

    def log_p(k: int) -> float:   # hypergeometric: k of the wins fall in the first sample
        return (math.lgamma(wins + 1) - math.lgamma(k + 1) - math.lgamma(wins - k + 1)
                + math.lgamma(total - wins + 1) - math.lgamma(n1 - k + 1) - math.lgamma(total - wins - n1 + k + 1)
                - math.lgamma(total + 1) + math.lgamma(n1 + 1) + math.lgamma(n2 + 1))

    observed = log_p(k1)
    support = range(max(0, wins - n2), min(wins, n1) + 1)
    # tables as likely as the observed one count in full (relative slack: lgamma's rounding)
    p = sum(math.exp(lp) for lp in map(log_p, support) if lp <= observed + 1e-7 * max(1.0, abs(observed)))
    return min(1.0, p)


def holm_significant(p_values: list[float], alpha: float = 0.05) -> list[bool]:
    """Which of the tests are significant at family-wise level ``alpha`` (Holm's step-down correction:
    a comparison of many cells finds some p below 0.05 by chance alone)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    out = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        out[i] = True
    return out


def episodes_for_power(p1: float, p2: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Evaluation episodes per row for a two-sided two-proportion z test at level ``alpha`` to detect
    success rates ``p1`` against ``p2`` with probability ``power`` (the normal approximation with unpooled
    variances: n = (z_{1-α/2} + z_power)² (p1(1-p1) + p2(1-p2)) / (p1 - p2)², rounded up)."""
    if not (0.0 < p1 < 1.0 and 0.0 < p2 < 1.0) or p1 == p2:
        raise ValueError(f"episodes_for_power: rates p1={p1}, p2={p2} must differ and lie in (0, 1)")
    if not (0.0 < alpha < 1.0 and 0.0 < power < 1.0):
        raise ValueError(f"episodes_for_power: alpha={alpha} and power={power} must lie in (0, 1)")
    quantile = statistics.NormalDist().inv_cdf
    z = quantile(1 - alpha / 2) + quantile(power)
    return math.ceil(z * z * (p1 * (1 - p1) + p2 * (1 - p2)) / (p1 - p2) ** 2)


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def summarize(episodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Means of ``MEAN_METRICS`` (NaNs skipped), return std, success interval, failure-reason counts."""
    eps = list(episodes)
    out: dict[str, Any] = {"episodes": len(eps)}
    for key in MEAN_METRICS:
        out[key] = _nanmean([float(e[key]) for e in eps])
    returns = [float(e["return"]) for e in eps if math.isfinite(float(e["return"]))]
    out["return_std"] = float(np.std(returns)) if returns else float("nan")
    successes = int(sum(e["success"] for e in eps))
    out["success_ci95"] = list(wilson_interval(successes, len(eps)))
    reasons: dict[str, int] = {}
    for e in eps:
        reasons[e["failure_reason"]] = reasons.get(e["failure_reason"], 0) + 1
    out["failure_reasons"] = dict(sorted(reasons.items()))
    return out
