"""Terrain: validation, reachability of every type, purity, monotonic difficulty, MuJoCo agreement."""
from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

from quadforge.envs.terrain import (PLATFORM_HALF, TERRAIN_TYPES, TerrainConfig, assign_columns, generate,
                          obstacle_height_of, step_height_of)

SMALL = dict(num_levels=4, tile_size=4.0, border=1.0)


def _small_all_types(**kw):
    return TerrainConfig.of_types(TERRAIN_TYPES, **{**SMALL, "num_cols": len(TERRAIN_TYPES), **kw})


@pytest.mark.parametrize("kwargs, match", [
    (dict(proportions={"lava": 1.0}), r"proportions: unknown terrain type 'lava'; allowed types: flat, slope_up"),
    (dict(proportions={"flat": 0.5, "gaps": 0.4}), r"proportions sum to 0.9.*must sum to 1 \(tolerance 1e-6\)"),
    (dict(proportions={"flat": 1.5, "gaps": -0.5}), r"proportions\['gaps'\] = -0.5; proportions must be >= 0"),
    (dict(num_levels=0), r"num_levels = 0; allowed: an integer >= 1"),
    (dict(proportions={"flat": 0.5, "gaps": 0.5}, num_cols=1), r"num_cols = 1; allowed: an integer >= 2"),
    (dict(horizontal_scale=0.0), r"horizontal_scale = 0.0; allowed: a number > 0"),
])
def test_bad_config_is_a_one_line_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        TerrainConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_sum_tolerance_is_1e_6():
    TerrainConfig(proportions={"flat": 0.5, "gaps": 0.5 + 5e-7})
    with pytest.raises(ValueError):
        TerrainConfig(proportions={"flat": 0.5, "gaps": 0.5 + 5e-6})


def test_every_type_is_reachable():
    assert set(assign_columns(TerrainConfig.mixed().proportions, 20)) == set(TERRAIN_TYPES)
    # a tiny share still gets its column (legged_gym's gaps/stones could never be reached)
    cols = assign_columns({"stairs_up": 0.98, "gaps": 0.01, "stepping_stones": 0.01}, 20)
    assert len(cols) == 20 and cols.count("gaps") == 1 and cols.count("stepping_stones") == 1
    # counts follow the proportions
    cols = assign_columns({"flat": 0.25, "obstacles": 0.75}, 20)
    assert cols.count("flat") == 5 and cols.count("obstacles") == 15
    t = generate(_small_all_types())
    assert t.col_types == TERRAIN_TYPES
    assert [TERRAIN_TYPES[i] for i in t.col_type_ids.tolist()] == list(TERRAIN_TYPES)


def test_generate_is_pure_and_seeded():
    cfg = _small_all_types()
    a, b = generate(cfg), generate(_small_all_types())
    assert a.heights.dtype == np.float32 and np.array_equal(a.heights, b.heights)
    assert torch.equal(a.origins, b.origins)
    c = generate(_small_all_types(seed=1))
    for col, kind in enumerate(TERRAIN_TYPES):
        same = np.array_equal(a.tile(2, col), c.tile(2, col))
        assert same == (kind not in ("rough_slope", "obstacles")), kind


def test_heights_are_quantised_and_tiles_are_in_place():
    cfg = _small_all_types()
    t = generate(cfg)
    nx, ny = t.heights.shape
    n = round(cfg.tile_size / cfg.horizontal_scale)
    b = round(cfg.border / cfg.horizontal_scale)
    assert (nx, ny) == (2 * b + cfg.num_levels * n + 1, 2 * b + cfg.num_cols * n + 1)
    q = t.heights / cfg.vertical_scale
    assert np.allclose(q, np.round(q), atol=1e-3)
    assert (t.heights[:b] == 0).all() and (t.heights[:, -b:] == 0).all()  # flat border
    # tile centres: symmetric grid around the origin, tile_size apart, spawn on the platform
    xy = t.origins[..., :2]
    torch.testing.assert_close(xy.mean(dim=(0, 1)), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(xy[1:, :, 0] - xy[:-1, :, 0], torch.full((3, 9), cfg.tile_size), atol=1e-5, rtol=0)
    torch.testing.assert_close(xy[:, 1:, 1] - xy[:, :-1, 1], torch.full((4, 8), cfg.tile_size), atol=1e-5, rtol=0)
    for kind in ("stairs_up", "stairs_down", "slope_up", "gaps", "stepping_stones", "obstacles"):
        col = TERRAIN_TYPES.index(kind)
        for level in range(cfg.num_levels):
            o = t.origins[level, col]
            # the platform around the spawn point is flat at the origin's height
            ring = o[:2] + torch.tensor([[0.0, 0.0], [0.9, 0.0], [-0.9, 0.5], [0.3, -0.9]])
            torch.testing.assert_close(t.height_at(ring), o[2].expand(4), atol=1e-6, rtol=0)


def _measure(kind: str, tile: np.ndarray, h: float) -> float:
    """A per-type difficulty measure read off the heights alone."""
    n = tile.shape[0]
    c = n // 2
    p = round(PLATFORM_HALF / h)
    outer = np.ones_like(tile, dtype=bool)
    outer[c - p + 1: c + p, c - p + 1: c + p] = False
    if kind in ("slope_up", "slope_down"):
        return float(np.abs(np.diff(tile[c, :c - p])).mean() / h)     # mean slope along a ray out
    if kind in ("stairs_up", "stairs_down"):
        return float(np.abs(np.diff(tile, axis=0)).max())             # step height
    if kind == "stepping_stones":
        return float((tile[outer] < -0.5).mean())                     # pit fraction
    if kind == "gaps":
        return float((tile[c, c:] < -0.5).sum() * h)                  # gap width along a ray out
    return float(np.abs(tile).max())                                  # rough/obstacles/flat: max |height|


def test_difficulty_is_monotonic_in_level_for_every_type():
    cfg = TerrainConfig.of_types(TERRAIN_TYPES, num_levels=10, num_cols=9, border=0.0)
    t = generate(cfg)
    h = cfg.horizontal_scale
    for col, kind in enumerate(t.col_types):
        m = [_measure(kind, t.tile(level, col).astype(np.float64), h) for level in range(cfg.num_levels)]
        assert all(b >= a - 1e-9 for a, b in zip(m, m[1:])), (kind, m)
        if kind != "flat":
            assert m[-1] > m[0], (kind, m)
        else:
            assert m == [0.0] * cfg.num_levels
    # the figures themselves (difficulty d = level / (num_levels - 1))
    stairs = TERRAIN_TYPES.index("stairs_up")
    for level in (0, 4, 9):
        d = level / 9
        assert _measure("stairs_up", t.tile(level, stairs), h) == pytest.approx(step_height_of(d), abs=1e-4)
        obst = t.tile(level, TERRAIN_TYPES.index("obstacles"))
        assert np.abs(obst).max() == pytest.approx(obstacle_height_of(d), abs=cfg.vertical_scale / 2 + 1e-6)
    slope = _measure("slope_down", t.tile(9, TERRAIN_TYPES.index("slope_down")).astype(np.float64), h)
    assert slope == pytest.approx(0.4, abs=0.01)
    # up = the robot climbs walking out of the centre; down = it descends
    up, down = t.tile(9, TERRAIN_TYPES.index("stairs_up")), t.tile(9, TERRAIN_TYPES.index("stairs_down"))
    assert up[40, 40] < up[40, 0] and down[40, 40] > down[40, 0]


def test_height_at_interpolates_vertices():
    cfg = _small_all_types()
    t = generate(cfg)
    nx, ny = t.heights.shape
    g = torch.Generator().manual_seed(0)
    i = torch.randint(0, nx, (500,), generator=g)
    j = torch.randint(0, ny, (500,), generator=g)
    xy = torch.stack(((i - (nx - 1) / 2) * cfg.horizontal_scale, (j - (ny - 1) / 2) * cfg.horizontal_scale), -1)
    torch.testing.assert_close(t.height_at(xy), torch.from_numpy(t.heights[i.numpy(), j.numpy()]), atol=1e-6, rtol=0)
    assert t.height_at(xy.view(10, 50, 2)).shape == (10, 50)
    far = torch.tensor([[1e3, 1e3], [-1e3, 0.0]])
    assert torch.equal(t.height_at(far), torch.zeros(2))  # outside: the (flat) border's edge


def test_mujoco_hfield_agrees_with_height_at_under_mj_ray():
    t = generate(_small_all_types(seed=3))
    hf = t.mujoco_hfield()
    nx, ny = t.heights.shape
    assert (hf.nrow, hf.ncol) == (ny, nx) and hf.data.shape == (nx * ny,)
    assert hf.data.dtype == np.float32 and hf.data.min() == 0.0 and hf.data.max() == 1.0
    spec = mujoco.MjSpec()
    hf.add_to(spec)
    m = spec.compile()
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    rng = np.random.default_rng(0)
    rx, ry = hf.size[0], hf.size[1]
    pts = np.stack([rng.uniform(-rx, rx, 400), rng.uniform(-ry, ry, 400)], -1)
    top = float(t.heights.max()) + 1.0
    geomid = np.array([-1], dtype=np.int32)
    hits = []
    for x, y in pts:
        dist = mujoco.mj_ray(m, d, np.array([x, y, top]), np.array([0.0, 0.0, -1.0]), None, 1, -1, geomid)
        assert dist >= 0 and geomid[0] == 0
        hits.append(top - dist)
    expected = t.height_at(torch.from_numpy(pts).float()).double().numpy()
    np.testing.assert_allclose(np.array(hits), expected, atol=2e-5)


def test_flat_plane_config():
    cfg = TerrainConfig.flat(num_levels=2, num_cols=3, border=0.0)
    t = generate(cfg)
    assert t.is_plane and t.col_types == ("flat",) * 3
    assert not t.heights.any() and not t.origins[..., 2].any()
    assert torch.equal(t.height_at(torch.randn(7, 2)), torch.zeros(7))
