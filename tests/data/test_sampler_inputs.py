"""Sampler arguments that are wrong fail at construction with a one-line error naming what is wrong
(the layout, a feature's width, a filter value, a count), never a silent drop or truncation."""
import numpy as np
import pytest
import torch

from quadforge.data.samplers import EpisodeArrays, TransitionSampler, WindowSampler
from quadforge.layout import TERM_DIMS, get_layout

torch.set_num_threads(1)
PROPRIO = get_layout("proprio")


def _arrays(lengths=(10, 12, 9, 11), widths=None, action_width=12, **info):
    """Zero proprio features of the catalogue's widths (``widths`` overrides some), episode table ``info``."""
    ends = np.cumsum(lengths)
    total = int(ends[-1])
    dims = {**{n: TERM_DIMS[n] for n in PROPRIO.term_names}, **(widths or {})}
    feats = {n: np.zeros((total, d), np.float32) for n, d in dims.items()}
    feats.update(actions=np.zeros((total, action_width), np.float32), rewards=np.zeros(total, np.float32),
                 terminated=np.zeros(total, bool))
    n = len(lengths)
    table = {"success": np.array([True, False] * (n // 2) + [True] * (n % 2)),
             "episode_id": np.array([f"c0-{i:08d}" for i in range(n)]), **info}
    return EpisodeArrays(feats, ends, table)


@pytest.mark.parametrize("sampler", [WindowSampler, TransitionSampler])
def test_samplers_take_a_layout_name(sampler):
    by_name = sampler(_arrays(), "proprio", 4, split="all")
    by_layout = sampler(_arrays(), PROPRIO, 4, split="all")
    assert by_name.layout is PROPRIO
    torch.testing.assert_close(by_name.batch_at(np.arange(5))["obs"], by_layout.batch_at(np.arange(5))["obs"])
    with pytest.raises(ValueError, match="unknown observation layout 'proprioo'"):
        sampler(_arrays(), "proprioo", 4, split="all")
    with pytest.raises(ValueError, match=f"{sampler.__name__}: layout must be an ObsLayout or a layout name"):
        sampler(_arrays(), 61, 4, split="all")


@pytest.mark.parametrize("sampler", [WindowSampler, TransitionSampler])
@pytest.mark.parametrize("widths,match", [
    ({"dof_pos": 11}, r"feature 'dof_pos' has per-step shape \(11,\); layout 'proprio' needs \(12,\)"),
    ({"commands": 3}, r"feature 'commands' has per-step shape \(3,\); layout 'proprio' needs \(15,\)"),
])
def test_samplers_check_each_term_width(sampler, widths, match):
    """A (T, 11) dof_pos gave (B, n, 60) observations under the 61-D layout."""
    with pytest.raises(ValueError, match=f"{sampler.__name__}: {match}"):
        sampler(_arrays(widths=widths), PROPRIO, 4, split="all")


def test_window_sampler_checks_the_action_width():
    """(T, 8) actions gave 8-D actions to a trainer whose models predict 12; the transition sampler takes any
    width (GeRM's bins follow the data), but one vector per step."""
    with pytest.raises(ValueError, match=r"WindowSampler: feature 'actions' has per-step shape \(8,\); "
                                         r"the action feature needs \(12,\)"):
        WindowSampler(_arrays(action_width=8), PROPRIO, 4, split="all")
    assert TransitionSampler(_arrays(action_width=8), PROPRIO, 4, split="all").sample(3)["action"].shape == (3, 8)
    data = _arrays()
    data.features["actions"] = data.features["actions"][:, 0]
    with pytest.raises(ValueError, match=r"TransitionSampler: action feature 'actions' has shape \(42,\); need one"):
        TransitionSampler(data, PROPRIO, 4, split="all")


def _table_arrays():
    return _arrays(terrain_type=np.array(["flat", "obstacles", "flat", "gaps"]),
                   terrain_level=np.array([0, 1, 2, 1]), task=np.array(["locomotion"] * 4),
                   policy_id=np.array(["gait:trot", "gait:trot", "gait:pace", "gait:trot"]))


@pytest.mark.parametrize("filters,match", [
    ({"terrain_types": ["obstacle", "flat"]}, r"filter terrain_types: unknown terrain types \['obstacle'\]; registered"),
    ({"tasks": ["locomotoin"]}, r"filter tasks: \['locomotoin'\] match no episode of the source \(its values: \['locomotion'\]\)"),
    ({"policy_ids": ["gait:trot", "gait:bound"]}, r"filter policy_ids: \['gait:bound'\] match no episode"),
    ({"episode_ids": ["c0-00000009"]}, r"filter episode_ids: \['c0-00000009'\] match no episode"),
    ({"success_only": "no"}, r"filter success_only='no': must be True or False"),
    ({"failure_only": "yes"}, r"filter failure_only='yes': must be True or False"),
    ({"terrain_levels": ["0", "1"]}, r"filter terrain_levels: \['0', '1'\] are not whole numbers"),
    ({"terrain_levels": [0.5]}, r"filter terrain_levels: \[0.5\] are not whole numbers"),
])
@pytest.mark.parametrize("sampler", [WindowSampler, TransitionSampler])
def test_filter_values_that_select_nothing_are_named(sampler, filters, match):
    """A misspelt terrain type, task, policy or episode id was dropped silently; "no" was a truthy flag;
    string levels matched nothing and said only "no episodes left"."""
    with pytest.raises(ValueError, match=match):
        sampler(_table_arrays(), PROPRIO, 4, split="all", filters=filters)


def test_valid_filters_select_as_before():
    data = _table_arrays()
    def chosen(**filters):
        return WindowSampler(data, PROPRIO, 4, split="all", filters=filters).episode_indices.tolist()
    # a registered terrain type this source lacks is no error: it just selects nothing of it
    assert chosen(terrain_types=["flat", "stairs_up"]) == [0, 2]
    assert chosen(terrain_types="gaps") == [3]
    assert chosen(terrain_levels=[1]) == [1, 3] == chosen(terrain_levels=np.int64(1))
    assert chosen(success_only=True) == [0, 2] == chosen(success_only=np.bool_(True))
    assert chosen(success_only=False) == [0, 1, 2, 3] == chosen(failure_only=0)
    assert chosen(failure_only=True, policy_ids=["gait:trot"]) == [1, 3]


def test_counts_and_ends_are_whole_numbers():
    """sample(2.5) drew 2 windows and ends [20.7, 50.2] became [20, 50]: truncations said nothing."""
    data = _arrays()
    window, transition = WindowSampler(data, PROPRIO, 4, split="all"), TransitionSampler(data, PROPRIO, 4, split="all")
    for s in (window, transition):
        with pytest.raises(ValueError, match=r"sample: batch_size=2.5: must be a whole number, got float"):
            s.sample(2.5)
        with pytest.raises(ValueError, match=r"sample: batch_size=True: must be a whole number, got bool"):
            s.sample(True)
        assert len(s.sample(np.int64(3))["obs"]) == 3 == len(s.sample(3.0)["obs"])
    with pytest.raises(ValueError, match=r"epoch: batch_size=1.5: must be a whole number"):
        next(window.epoch(1.5))
    with pytest.raises(ValueError, match=r"WindowSampler: context=2.5: must be a whole number"):
        WindowSampler(data, PROPRIO, 2.5, split="all")
    with pytest.raises(ValueError, match=r"TransitionSampler: n_step=1.5: must be a whole number"):
        TransitionSampler(data, PROPRIO, 4, split="all", n_step=1.5)
    with pytest.raises(ValueError, match=r"WindowSampler: world_size=2.5: must be a whole number"):
        WindowSampler(data, PROPRIO, 4, split="all", world_size=2.5)
    feats = {"rewards": np.zeros(51, np.float32)}
    with pytest.raises(ValueError, match=r"EpisodeArrays: episode_ends: entry 0 is 20.7, not a whole number"):
        EpisodeArrays(feats, np.array([20.7, 51.0]))
    assert EpisodeArrays(feats, np.array([20.0, 51.0])).episode_ends.tolist() == [20, 51]
