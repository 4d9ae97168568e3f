import numpy as np
import pytest
import torch

from quadforge.data.samplers import EpisodeArrays, TransitionSampler, WindowSampler
from quadforge.layout import LayoutTerm, ObsLayout, get_layout

torch.set_num_threads(1)


@pytest.fixture(autouse=True, params=["strided", "rows"])
def window_layout(request, monkeypatch):
    """Every test runs on both window layouts: they must give identical batches."""
    import quadforge.data.samplers as samplers
    monkeypatch.setattr(samplers, "WINDOW_LAYOUT", request.param)
    return request.param

# obs = [step value, 10 * step value] so every window entry says which step it came from
LAYOUT = ObsLayout("probe", (LayoutTerm("base_height"), LayoutTerm("friction", 10.0)))


def _arrays(lengths, success=None, terminated_last=None, terrain=None):
    """Episodes whose step s (global) has base_height = s + 1 and actions = -(s + 1)."""
    ends = np.cumsum(lengths)
    total = int(ends[-1])
    val = np.arange(1, total + 1, dtype=np.float32)
    terminated = np.zeros(total, dtype=bool)
    if terminated_last is not None:
        terminated[ends - 1] = terminated_last
    feats = {
        "base_height": val[:, None],
        "friction": val[:, None],
        "actions": -np.repeat(val[:, None], 12, axis=1),
        "rewards": np.ones(total, dtype=np.float32),
        "terminated": terminated,
    }
    info = {"success": np.asarray(success if success is not None else [True] * len(lengths)),
            "terrain_type": np.asarray(terrain if terrain is not None else ["flat"] * len(lengths)),
            "episode_id": np.asarray([f"c0-{i}" for i in range(len(lengths))])}
    return EpisodeArrays(feats, ends, info)


def test_window_padding_rule_exact_contents(window_layout):
    data = _arrays([3, 6])  # episode 0: global steps 0..2, episode 1: 3..8
    s = WindowSampler(data, LAYOUT, context=4, split="all")
    assert s.steps.strided == (window_layout == "strided")
    assert s.num_windows == 9
    b = s.batch_at(np.array([3, 4, 5, 7, 2]))  # ep1 t=0, t=1 (<n-1), t=2, t=4 (>=n-1), ep0 t=2
    obs, mask = b["obs"], b["mask"]
    assert obs.shape == (5, 4, 2) and b["actions"].shape == (5, 4, 12) and b["rtg"].shape == (5, 4, 1)
    # t = 0 of episode 1: only the last position is real, the rest zero-padded on the left
    assert mask[0].tolist() == [False, False, False, True]
    assert obs[0, :, 0].tolist() == [0, 0, 0, 4] and obs[0, :, 1].tolist() == [0, 0, 0, 40]
    # t = 1 (< n-1)
    assert mask[1].tolist() == [False, False, True, True]
    assert obs[1, :, 0].tolist() == [0, 0, 4, 5]
    assert b["actions"][1, :, 0].tolist() == [0, 0, -4, -5]
    assert b["timestep"][1].tolist() == [0, 0, 0, 1]
    # t = 4 (>= n-1): steps 1..4 of episode 1, never episode 0's steps
    assert mask[3].all() and obs[3, :, 0].tolist() == [5, 6, 7, 8]
    assert b["timestep"][3].tolist() == [1, 2, 3, 4]
    # rtg: undiscounted sum of rewards to the episode end (all rewards 1)
    assert b["rtg"][3, :, 0].tolist() == [5, 4, 3, 2]
    assert b["rtg"][0, :, 0].tolist() == [0, 0, 0, 6]
    # last step of episode 0 does not leak into episode 1
    assert obs[4, :, 0].tolist() == [0, 1, 2, 3] and b["rtg"][4, -1, 0] == 1
    assert b["episode_index"].tolist() == [1, 1, 1, 1, 0]
    assert obs.dtype == torch.float32 and mask.dtype == torch.bool and b["timestep"].dtype == torch.long


def test_every_step_is_a_window_end_once_per_epoch():
    data = _arrays([5, 7, 4])
    s = WindowSampler(data, LAYOUT, context=3, split="all", seed=3)
    last = torch.cat([b["obs"][:, -1, 0] for b in s.epoch(batch_size=4)])
    assert sorted(last.tolist()) == list(range(1, 17))
    again = torch.cat([b["obs"][:, -1, 0] for b in s.epoch(batch_size=4)])
    assert again.tolist() != last.tolist()  # a new epoch reshuffles
    s.set_epoch(0)
    assert torch.cat([b["obs"][:, -1, 0] for b in s.epoch(batch_size=4)]).tolist() == last.tolist()


def test_sharding_is_disjoint_across_ranks():
    data = _arrays([5, 7, 4, 9])
    seen = []
    for rank in range(3):
        s = WindowSampler(data, LAYOUT, context=2, split="all", seed=1, rank=rank, world_size=3)
        seen.append(torch.cat([b["obs"][:, -1, 0] for b in s.epoch(batch_size=5)]).tolist())
    assert all(len(x) == 25 // 3 for x in seen)
    flat = [v for x in seen for v in x]
    assert len(set(flat)) == len(flat)


def test_split_is_episode_level_and_seeded():
    data = _arrays([3] * 40)
    tr = WindowSampler(data, LAYOUT, context=2, split="train", val_fraction=0.25, seed=7)
    va = WindowSampler(data, LAYOUT, context=2, split="val", val_fraction=0.25, seed=7)
    assert set(tr.episode_indices).isdisjoint(va.episode_indices)
    assert len(tr.episode_indices) + len(va.episode_indices) == 40 and len(va.episode_indices) == 10
    again = WindowSampler(data, LAYOUT, context=2, split="val", val_fraction=0.25, seed=7)
    other = WindowSampler(data, LAYOUT, context=2, split="val", val_fraction=0.25, seed=8)
    assert again.episode_indices.tolist() == va.episode_indices.tolist()
    assert other.episode_indices.tolist() != va.episode_indices.tolist()
    # windows hold whole episodes: every val window's steps come from val episodes
    b = va.sample(64)
    assert set(b["episode_index"].tolist()) <= set(va.episode_indices.tolist())


def test_sample_is_seeded_and_filters_apply():
    data = _arrays([4, 4, 4, 4], success=[True, False, True, False],
                   terrain=["flat", "stairs_up", "stairs_up", "flat"])
    a = WindowSampler(data, LAYOUT, context=2, split="all", seed=5).sample(32)
    b = WindowSampler(data, LAYOUT, context=2, split="all", seed=5).sample(32)
    assert torch.equal(a["obs"], b["obs"])
    s = WindowSampler(data, LAYOUT, context=2, split="all", filters={"success_only": True})
    assert s.episode_indices.tolist() == [0, 2]
    s = WindowSampler(data, LAYOUT, context=2, split="all", filters={"terrain_types": ["stairs_up"],
                                                                      "success_only": True})
    assert s.episode_indices.tolist() == [2]
    s = WindowSampler(data, LAYOUT, context=2, split="all", filters={"terrain_types": "flat"})   # one name
    assert s.episode_indices.tolist() == [0, 3]
    with pytest.raises(ValueError, match="unknown sampler filters"):
        WindowSampler(data, LAYOUT, context=2, split="all", filters={"sucess_only": True})
    with pytest.raises(ValueError, match="no episodes left"):
        WindowSampler(data, LAYOUT, context=2, split="all", filters={"terrain_types": ["gaps"]})


def test_obs_stats_and_errors():
    data = _arrays([2, 2])
    s = WindowSampler(data, LAYOUT, context=1, split="all")
    mean, std = s.obs_stats()
    torch.testing.assert_close(mean, torch.tensor([2.5, 25.0]))
    torch.testing.assert_close(std, torch.tensor([np.std([1, 2, 3, 4]), 10 * np.std([1, 2, 3, 4])],
                                                 dtype=torch.float32))
    const = EpisodeArrays({k: np.zeros_like(v) for k, v in data.features.items()}, data.episode_ends)
    assert WindowSampler(const, LAYOUT, 1, split="all").obs_stats(std_floor=0.5)[1].tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="missing"):
        WindowSampler(data, get_layout("proprio"), context=2)
    with pytest.raises(ValueError, match="split"):
        WindowSampler(data, LAYOUT, context=2, split="test")
    with pytest.raises(ValueError, match="episode_ends"):
        EpisodeArrays(data.features, np.array([2, 5]))


def test_real_layout_matches_layout_build():
    rng = np.random.default_rng(0)
    from quadforge.layout import TERM_DIMS
    total = 30
    feats = {k: rng.normal(size=(total, d)).astype(np.float32) for k, d in TERM_DIMS.items()}
    feats["actions"] = rng.normal(size=(total, 12)).astype(np.float32)
    feats["rewards"] = rng.normal(size=total).astype(np.float32)
    layout = get_layout("legged_gym_235")
    s = WindowSampler(EpisodeArrays(feats, np.array([10, 30])), layout, context=5, split="all")
    b = s.batch_at(np.array([29]))
    want = layout.build({k: torch.from_numpy(v[25:30]) for k, v in feats.items()})
    torch.testing.assert_close(b["obs"][0], want)


def test_transition_targets_and_mc_return():
    # episode 0: 3 steps, success (time-out); episode 1: 4 steps, failure by a fall
    data = _arrays([3, 4], success=[True, False], terminated_last=[False, True])
    gamma = 0.5
    ts = TransitionSampler(data, LAYOUT, context=2, gamma=gamma, split="all")
    b = ts.batch_at(np.array([0, 2, 3, 6]))
    assert b["t"].tolist() == [0, 2, 0, 3]
    assert b["reward"].tolist() == [0, 1, 0, 0]
    assert b["done"].tolist() == [0, 0, 0, 1]
    assert b["last"].tolist() == [False, True, False, True]
    torch.testing.assert_close(b["mc_return"], torch.tensor([gamma ** 2, 1.0, 0.0, 0.0]))
    assert b["success"].tolist() == [1, 1, 0, 0] and b["episode_index"].tolist() == [0, 0, 1, 1]
    assert b["action"][:, 0].tolist() == [-1, -3, -4, -7]
    assert b["obs"][0, :, 0].tolist() == [0, 1] and b["next_obs"][0, :, 0].tolist() == [1, 2]
    assert b["next_obs"][2, :, 0].tolist() == [4, 5] and b["next_mask"][2].all()
    assert not b["next_obs"][1].any() and not b["next_obs"][3].any()  # no stored next step
    # dense rewards (all 1): mc_return = discounted sum to the end
    dense = TransitionSampler(data, LAYOUT, context=2, gamma=gamma, reward="dense", split="all")
    torch.testing.assert_close(dense.batch_at(np.array([3]))["mc_return"], torch.tensor([1 + .5 + .25 + .125]))
    # n-step: reward sums gamma^k r over the next n steps, cut at the episode end
    n3 = TransitionSampler(data, LAYOUT, context=1, gamma=gamma, reward="dense", n_step=3, split="all")
    b3 = n3.batch_at(np.array([3, 5]))
    torch.testing.assert_close(b3["reward"], torch.tensor([1.75, 1.5]))
    torch.testing.assert_close(b3["discount"], torch.tensor([0.125, 0.25]))
    assert b3["next_obs"][0, 0, 0] == 7 and b3["done"].tolist() == [0, 1]


def test_transition_success_ratio_and_sharding():
    data = _arrays([10] * 8, success=[True, False] * 4, terminated_last=[False, True] * 4)
    ts = TransitionSampler(data, LAYOUT, context=2, split="all", success_ratio=0.75, seed=0)
    b = ts.sample(400)
    assert b["success"].sum().item() == 300
    only = TransitionSampler(data, LAYOUT, context=2, split="all", success_only=True)
    assert only.sample(50)["success"].all()
    r0 = TransitionSampler(data, LAYOUT, context=2, split="all", rank=0, world_size=2, seed=1)
    r1 = TransitionSampler(data, LAYOUT, context=2, split="all", rank=1, world_size=2, seed=1)
    s0 = set(r0.sample(500)["obs"][:, -1, 0].tolist())
    s1 = set(r1.sample(500)["obs"][:, -1, 0].tolist())
    assert s0.isdisjoint(s1)
    with pytest.raises(ValueError, match="failed episodes"):
        TransitionSampler(data, LAYOUT, context=2, split="all", success_only=True, success_ratio=0.5)
    with pytest.raises(ValueError, match="rank 60 of 100 has no transitions"):
        TransitionSampler(_arrays([4]), LAYOUT, context=2, split="all", rank=60, world_size=100)
    with pytest.raises(ValueError, match="batch_size=0"):
        next(WindowSampler(data, LAYOUT, context=2, split="all").epoch(0))
