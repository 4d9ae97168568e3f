"""The legged_gym terrain curriculum rule over (level, col) per env (``envs.tasks.terrain_levels``)."""
from __future__ import annotations

import pytest
import torch

from quadforge.envs.config import EnvConfig
from quadforge.envs.tasks.terrain_levels import TerrainState, next_levels
from quadforge.envs.terrain import TERRAIN_TYPES, TerrainConfig, generate
from quadforge.seeding import torch_generator

TERRAIN = TerrainConfig.of_types(TERRAIN_TYPES, num_levels=10, num_cols=9, tile_size=4.0, border=0.0)


@pytest.fixture(scope="module")
def terrain():
    return generate(TERRAIN)


def _state(num_envs: int, max_init_level: int = 5, seed: int = 0) -> TerrainState:
    """The env's terrain state with the curriculum on (what LeggedEnv builds)."""
    cfg = EnvConfig.rough(num_envs=num_envs, terrain=TERRAIN, max_init_terrain_level=max_init_level)
    return TerrainState(cfg, num_envs, torch_generator(seed, "terrain_curriculum"), torch.device("cpu"))


def test_initial_levels_and_columns():
    cur = _state(900, max_init_level=5, seed=0)
    assert cur.levels.shape == (900,) and cur.cols.shape == (900,)
    assert cur.levels.min() == 0 and cur.levels.max() == 5  # random in 0..max_init_level
    assert torch.bincount(cur.cols).tolist() == [100] * 9    # spread evenly over columns
    again = _state(900, max_init_level=5, seed=0)
    assert torch.equal(cur.levels, again.levels)
    assert not torch.equal(cur.levels, _state(900, 5, seed=1).levels)
    assert _state(50, max_init_level=0).levels.eq(0).all()
    assert _state(50, max_init_level=99).levels.max() <= 9


def test_update_rule():
    cur = _state(6, max_init_level=0, seed=0)
    cur.set_levels(torch.arange(6), torch.tensor([3, 3, 3, 0, 9, 5]), torch.arange(6))
    half_tile = TERRAIN.tile_size / 2
    ids = torch.tensor([0, 1, 2, 3, 4])
    cur.update_curriculum(ids,
                          torch.tensor([half_tile + 0.1, 1.0, 1.0, 0.0, half_tile + 1.0]),
                          torch.tensor([10.0, 1.5, 3.0, 5.0, 1.0]))
    # 0: walked > half a tile -> up; 1: >= half the commanded -> stays; 2: < half commanded -> down;
    # 3: down from 0 stays at 0; 4: up past the top -> a random level; 5: not reset -> untouched
    assert cur.levels[:4].tolist() == [4, 3, 2, 0]
    assert 0 <= cur.levels[4] < cur.num_levels
    assert cur.levels[5] == 5
    assert cur.cols.tolist() == list(range(6))  # the curriculum never changes columns


def test_past_top_goes_to_random_levels():
    cur = _state(500, seed=0)
    ids = torch.arange(500)
    cur.set_levels(ids, torch.full((500,), 9), cur.cols.clone())
    cur.update_curriculum(ids, torch.full((500,), 100.0), torch.zeros(500))
    assert set(cur.levels.tolist()) == set(range(10))


def test_origins_and_stats(terrain):
    cur = _state(18, seed=0)
    ids = torch.tensor([0, 7, 17])
    o = cur.origins_of(ids)
    assert o.shape == (3, 3)
    torch.testing.assert_close(o, torch.as_tensor(terrain.origins, dtype=torch.float32)[cur.levels[ids], cur.cols[ids]])
    assert cur.origins_of(torch.arange(18)).shape == (18, 3)
    cur.set_levels(torch.arange(18), torch.arange(18) % 10, torch.arange(18) // 2)
    stats = cur.log()
    assert stats["Curriculum/level/flat"] == pytest.approx(0.5)          # envs 0, 1 on levels 0, 1
    assert stats["Curriculum/level/gaps"] == pytest.approx((6 + 7) / 2)  # envs 16, 17
    assert stats["Curriculum/level/mean"] == pytest.approx((torch.arange(18) % 10).float().mean().item())
    assert set(stats) == {"Curriculum/level/mean", *(f"Curriculum/level/{t}" for t in TERRAIN_TYPES)}
    assert [TERRAIN_TYPES[i] for i in cur.type_idx[::2].tolist()] == list(TERRAIN_TYPES)


def test_bad_input():
    cur = _state(4)
    with pytest.raises(ValueError, match=r"levels must lie in \[0, 9\]"):
        cur.set_levels(torch.tensor([0]), torch.tensor([10]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"cols must lie in \[0, 8\]"):
        cur.set_levels(torch.tensor([0]), torch.tensor([0]), torch.tensor([-1]))
    with pytest.raises(ValueError, match="num_envs"):
        EnvConfig.rough(num_envs=0, terrain=TERRAIN).validate()


def test_next_levels_is_the_rule_alone():
    g = torch.Generator().manual_seed(0)
    out = next_levels(torch.tensor([0, 2, 2, 2, 9]), torch.tensor([0.0, 5.0, 2.0, 0.5, 5.0]),
                      torch.tensor([4.0, 0.0, 3.0, 3.0, 0.0]), num_levels=10, tile_size=8.0, generator=g)
    assert out[:4].tolist() == [0, 3, 2, 1] and 0 <= out[4] < 10


def test_an_episode_that_ends_early_is_asked_the_whole_episodes_distance():
    """legged_gym demotes a robot that walked less than half of |cmd| x episode length: one that fell after
    a second at its commanded speed goes down. The asked distance is the commanded integral so far plus
    the last command's speed over the steps the episode did not run; a full episode asks its integral."""
    from quadforge.envs.builder import make_env
    env = make_env("go1", "mixed", num_envs=3, seed=0, overrides={"curriculum": True})
    try:
        task, dt, full = env.task, env.dt, env.max_episode_length
        ids = torch.arange(3)
        task.ep_steps[:] = torch.tensor([int(round(1.0 / dt)), full, full + 3])
        task._cmd_speed[:] = torch.tensor([1.0, 1.0, 0.5])
        walked = torch.tensor([1.0, 1.0, 2.0])          # the integral of |cmd| over what each episode ran
        asked = task.asked_distance(ids, walked, full)
        torch.testing.assert_close(asked, torch.tensor([1.0 + (full * dt - 1.0), 1.0, 2.0]))
        # fell after 1 s having walked 0.8 m at 1 m/s: down a level (the integral alone kept it)
        levels = torch.tensor([5, 5, 5])
        moved = torch.tensor([0.8, 0.8, 1.1])
        assert next_levels(levels, moved, asked, 10, 8.0).tolist() == [4, 5, 5]
        assert next_levels(levels, moved, walked, 10, 8.0).tolist() == [5, 5, 5]
    finally:
        env.close()
