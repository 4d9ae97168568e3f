"""The labelling rule on hand-built episode infos."""
import math

import pytest

from quadforge.collection.labels import FAILURE_REASONS, LabelRule, label


def info(**overrides):
    base = {"termination_reason": "time_out", "lin_vel_error": 0.1, "ang_vel_error": 0.1,
            "distance": 4.0, "commanded_displacement": 5.0}
    base.update(overrides)
    return base


def test_a_good_episode_is_a_success_with_its_numbers():
    ok, reason, numbers = label(info())
    assert ok and reason == "success"
    assert numbers["progress"] == pytest.approx(0.8)
    assert numbers["lin_vel_error"] == 0.1


@pytest.mark.parametrize("reason", ["non_finite", "fall", "base_collision"])
def test_env_terminations_are_failures_even_with_perfect_tracking(reason):
    assert label(info(termination_reason=reason))[:2] == (False, reason)


def test_priority_order_termination_beats_tracking_beats_progress():
    # everything wrong at once: the physics reason wins
    bad = info(termination_reason="fall", lin_vel_error=2.0, distance=0.0)
    assert label(bad)[1] == "fall"
    # no termination: tracking beats no_progress
    assert label(info(lin_vel_error=2.0, distance=0.0))[1] == "tracking_error"
    assert label(info(distance=0.0))[1] == "no_progress"
    assert FAILURE_REASONS == ("non_finite", "fall", "base_collision", "tracking_error", "no_progress")


def test_thresholds_are_strict_and_come_from_the_rule():
    rule = LabelRule()
    assert label(info(lin_vel_error=rule.max_lin_vel_error))[0]
    assert label(info(lin_vel_error=rule.max_lin_vel_error + 1e-6))[1] == "tracking_error"
    assert label(info(ang_vel_error=rule.max_ang_vel_error + 1e-6))[1] == "tracking_error"
    loose = LabelRule(max_lin_vel_error=1.0)
    assert label(info(lin_vel_error=0.9), loose)[0]


def test_no_progress_is_only_checked_for_a_meaningful_commanded_displacement():
    # standing / turning on the spot: commanded displacement below the bar, drift does not matter
    assert label(info(distance=0.0, commanded_displacement=0.3))[0]
    # exactly half is still progress, just under is not
    assert label(info(distance=2.5, commanded_displacement=5.0))[0]
    assert label(info(distance=2.49, commanded_displacement=5.0))[1] == "no_progress"


def test_falls_back_to_the_commanded_path_length():
    i = info(distance=1.0)
    del i["commanded_displacement"]
    i["commanded_distance"] = 4.0
    assert label(i)[1] == "no_progress"


def test_nan_numbers_are_non_finite():
    assert label(info(lin_vel_error=math.nan))[1] == "non_finite"


def test_integer_termination_codes_map_through_the_env_table():
    terminations = pytest.importorskip("quadforge.envs.terminations")
    code = terminations.TERMINATION_REASONS.index("fall")
    assert label(info(termination_reason=code))[1] == "fall"


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="lin_vel_error"):
        label({"termination_reason": "none", "ang_vel_error": 0, "distance": 0, "commanded_distance": 0})
    with pytest.raises(ValueError, match="termination_reason"):
        label(info(termination_reason="exploded"))
    with pytest.raises(ValueError, match="max_lin_vel_error"):
        LabelRule(max_lin_vel_error=-1)
    with pytest.raises(ValueError, match="unknown LabelRule fields"):
        LabelRule.from_dict({"bogus": 1})


def test_rule_round_trips_through_json_form():
    rule = LabelRule(min_progress_fraction=0.4)
    assert LabelRule.from_dict(rule.to_dict()) == rule
    assert '"min_progress_fraction": 0.4' in rule.to_json()
