"""legged_gym-style terrain: a grid of tiles (rows = difficulty levels, columns = terrain types) as one
heightfield with a flat border, generated purely from a seeded config.

Conventions (see docs/terrain.md):
- ``heights[i, j]`` is the height (m, float32) of the vertex at world ``x = (i - (nx-1)/2) * h``,
  ``y = (j - (ny-1)/2) * h`` with ``h = horizontal_scale``: the terrain is centred on the world origin,
  levels run along x, columns along y, and tile (level, col) is centred on ``origins[level, col]``.
- Difficulty ``d = level / (num_levels - 1)`` (0 for a single level), so the top level is d = 1.
- Every tile is a "pyramid" about its centre, where the robot spawns on a flat 2 m platform; the
  names say what the robot meets walking *out* of the tile: ``slope_up``/``stairs_up`` rise from the
  centre (the centre is a pit), ``slope_down``/``stairs_down`` fall from it (the centre is a summit).
- Between two vertices the surface is the same two triangles MuJoCo's hfield uses (split along the
  +x+y diagonal), so ``height_at`` equals the physics surface, not a bilinear approximation of it.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import torch

from quadforge.envs.fast_paths import cpu_arrays
from quadforge.seeding import numpy_rng
from quadforge.tensors import device_constant
from quadforge.terms import TERRAIN_TYPES  # noqa: F401  (named with the term catalogue; generated here)


PLATFORM_HALF = 1.0     # m, half-width of the flat spawn platform at every tile centre
# Types whose platform ends in a pit (gaps: a 1 m deep moat from r = PLATFORM_HALF, the surface falling
# from the vertex before it): spawned anywhere within +-spawn_xy of the centre, half the robots started with
# a foot over it (an audit, 2026-11-29: 34 of 64 Go1 envs). The env keeps their footprint on the platform
# (``LeggedEnv``'s spawn); other types' platform edges are a slope, a step or a bump, met anyway.
PIT_EDGED = frozenset({"gaps"})
STEP_WIDTH = 0.31       # m, stair tread (legged_gym)
PIT_DEPTH = 1.0         # m, depth of stepping-stone and gap pits
ROUGH_NOISE = 0.05      # m, +- uniform noise of rough slopes (legged_gym)
ROUGH_NOISE_SCALE = 0.2  # m, grid spacing the noise is drawn on before interpolation (legged_gym)
NUM_OBSTACLES = 20      # rectangles per obstacle tile (legged_gym)


# --- per-type difficulty formulas (d in [0, 1]) ---------------------------------------------------
def slope_of(d: float) -> float:
    return 0.4 * d                      # rise over run (legged_gym)


def step_height_of(d: float) -> float:
    return 0.05 + 0.18 * d              # m (legged_gym)


def obstacle_height_of(d: float) -> float:
    return 0.05 + 0.2 * d               # m (legged_gym)


def stone_size_of(d: float) -> float:
    return 1.5 - 1.2 * d                # m, square stones shrink 1.5 -> 0.3


def stone_gap_of(d: float) -> float:
    return 0.1 + 0.2 * d                # m, pits between stones widen 0.1 -> 0.3


def gap_width_of(d: float) -> float:
    return 0.1 + 0.4 * d                # m, moat around the platform widens 0.1 -> 0.5


@dataclass
class TerrainConfig:
    proportions: dict[str, float] = field(default_factory=lambda: {"flat": 1.0})
    num_levels: int = 10
    num_cols: int = 20
    tile_size: float = 8.0              # m, square tiles
    horizontal_scale: float = 0.1       # m per heightfield vertex
    vertical_scale: float = 0.005       # m, heights are quantised to this
    border: float = 10.0                # m of flat ground around the grid
    seed: int = 0
    plane: bool = False                 # True: a flat plane, the scene needs no heightfield

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        unknown = [k for k in self.proportions if k not in TERRAIN_TYPES]
        if unknown:
            raise ValueError(f"TerrainConfig.proportions: unknown terrain type {unknown[0]!r}; "
                             f"allowed types: {', '.join(TERRAIN_TYPES)}")
        negative = [k for k, v in self.proportions.items() if not v >= 0]
        if negative:
            raise ValueError(f"TerrainConfig.proportions[{negative[0]!r}] = {self.proportions[negative[0]]}; "
                             "proportions must be >= 0")
        total = sum(self.proportions.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"TerrainConfig.proportions sum to {total}; they must sum to 1 (tolerance 1e-6)")
        positive = sum(1 for v in self.proportions.values() if v > 0)
        for name, value, low in (("num_levels", self.num_levels, 1), ("num_cols", self.num_cols, positive)):
            if not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"TerrainConfig.{name} = {value!r}; allowed: an integer >= {low}"
                                 + (" (one column per type with a positive proportion)" if name == "num_cols" else ""))
        for name in ("tile_size", "horizontal_scale", "vertical_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TerrainConfig.{name} = {getattr(self, name)!r}; allowed: a number > 0")
        if not self.border >= 0:
            raise ValueError(f"TerrainConfig.border = {self.border!r}; allowed: a number >= 0")
        if self.tile_size < 2 * PLATFORM_HALF + 1.0 or self.tile_size < 10 * self.horizontal_scale:
            raise ValueError(f"TerrainConfig.tile_size = {self.tile_size}; allowed: >= {2 * PLATFORM_HALF + 1.0} m "
                             "(the spawn platform plus a margin) and >= 10 * horizontal_scale")

    @classmethod
    def flat(cls, **kw) -> "TerrainConfig":
        """A flat plane (no heightfield); the grid only lays out spawn origins."""
        return cls(proportions={"flat": 1.0}, plane=True, **kw)

    @classmethod
    def mixed(cls, **kw) -> "TerrainConfig":
        """legged_gym's rough mix with the types its generator could not reach added."""
        return cls(proportions={"flat": 0.05, "slope_up": 0.05, "slope_down": 0.05, "rough_slope": 0.1,
                                "stairs_up": 0.2, "stairs_down": 0.15, "obstacles": 0.2,
                                "stepping_stones": 0.1, "gaps": 0.1}, **kw)

    @classmethod
    def of_types(cls, types: Sequence[str], **kw) -> "TerrainConfig":
        """Equal proportions of the named types."""
        if not types:
            raise ValueError(f"TerrainConfig.of_types: no types given; allowed types: {', '.join(TERRAIN_TYPES)}")
        share = 1.0 / len(types)
        props: dict[str, float] = {}
        for t in types:
            props[t] = props.get(t, 0.0) + share
        kw.setdefault("num_cols", max(20, len(props)))
        return cls(proportions=props, **kw)

    def difficulty(self, level: int) -> float:
        return level / (self.num_levels - 1) if self.num_levels > 1 else 0.0


def assign_columns(proportions: Mapping[str, float], num_cols: int) -> tuple[str, ...]:
    """Column types by proportion (largest remainder), every positive type at least one column,
    grouped in ``TERRAIN_TYPES`` order."""
    types = [t for t in TERRAIN_TYPES if proportions.get(t, 0.0) > 0]
    counts = {t: 1 for t in types}
    spare = num_cols - len(types)
    # the rest by largest remainder of each type's share beyond its guaranteed column
    want = {t: max(proportions[t] * num_cols - 1, 0.0) for t in types}
    floors = {t: int(math.floor(want[t])) for t in types}
    total_floor = sum(floors.values())
    if total_floor > spare:  # can only happen through rounding at tiny num_cols; trim the largest
        for t in sorted(types, key=lambda t: -floors[t]):
            while total_floor > spare and floors[t] > 0:
                floors[t] -= 1
                total_floor -= 1
    for t in types:
        counts[t] += floors[t]
    left = spare - total_floor
    for t in sorted(types, key=lambda t: (-(want[t] - floors[t]), TERRAIN_TYPES.index(t)))[:left]:
        counts[t] += 1
    return tuple(t for t in types for _ in range(counts[t]))


# --- tiles -----------------------------------------------------------------------------------------
def _tile_coords(n: int, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Vertex coordinates (m) relative to the tile centre, (n, n) each; vertex n/2 is the centre."""
    c = (np.arange(n) - n // 2) * h
    return np.meshgrid(c, c, indexing="ij")


def _pyramid(x: np.ndarray, y: np.ndarray, half: float) -> np.ndarray:
    """Distance (m) inward from the tile edge, capped at the platform: 0 at the edge."""
    r = np.maximum(np.abs(x), np.abs(y))
    return half - np.maximum(r, PLATFORM_HALF)


def _slope(x, y, half, d, sign):
    return sign * slope_of(d) * np.clip(_pyramid(x, y, half), 0.0, None)


def _rough_slope(x, y, half, d, rng):
    base = _slope(x, y, half, d, +1.0)
    n = x.shape[0]
    h = x[1, 0] - x[0, 0]
    stride = max(int(round(ROUGH_NOISE_SCALE / h)), 1)
    coarse_n = (n - 1) // stride + 2
    coarse = rng.uniform(-ROUGH_NOISE, ROUGH_NOISE, size=(coarse_n, coarse_n))
    # bilinear upsampling of the coarse noise onto the tile's vertices
    u = np.arange(n) / stride
    i0 = np.minimum(np.floor(u).astype(int), coarse_n - 2)
    f = u - i0
    rows = coarse[i0] * (1 - f)[:, None] + coarse[i0 + 1] * f[:, None]
    noise = rows[:, i0] * (1 - f)[None, :] + rows[:, i0 + 1] * f[None, :]
    return base + noise


def _stairs(x, y, half, d, sign):
    inward = np.clip(_pyramid(x, y, half), 0.0, None)
    num_steps = int(math.floor((half - PLATFORM_HALF) / STEP_WIDTH))
    # ring k (k treads in from the edge) stands k steps high; the platform tops the last ring
    steps = np.minimum(np.floor(inward / STEP_WIDTH + 1e-9), num_steps)
    return sign * step_height_of(d) * steps


def _obstacles(x, y, half, d, rng):
    height = obstacle_height_of(d)
    out = np.zeros_like(x)
    n_rect = NUM_OBSTACLES
    sizes = rng.uniform(1.0, 2.0, size=(n_rect, 2))
    centres = rng.uniform(-half, half, size=(n_rect, 2))
    levels = rng.choice(np.array([-1.0, -0.5, 0.5, 1.0]), size=n_rect)
    # the last two rectangles carry the extremes, in the ring outside the platform, so the tile's max
    # |height| is the level's obstacle height (drawn last: nothing covers them)
    levels[-2:] = (-1.0, 1.0)
    ext = min(1.0, half - PLATFORM_HALF)
    for k in (-2, -1):
        side = rng.integers(4)
        t = rng.uniform(-half + ext / 2, half - ext / 2)
        edge = rng.uniform(PLATFORM_HALF + ext / 2, half - ext / 2)
        centres[k] = [(edge, t), (-edge, t), (t, edge), (t, -edge)][side]
        sizes[k] = (ext, ext)
    for (sx, sy), (cx, cy), lv in zip(sizes, centres, levels):
        inside = (np.abs(x - cx) <= sx / 2) & (np.abs(y - cy) <= sy / 2)
        out[inside] = lv * height
    out[np.maximum(np.abs(x), np.abs(y)) < PLATFORM_HALF] = 0.0
    return out


def _stepping_stones(x, y, half, d):
    h = x[1, 0] - x[0, 0]
    # whole vertices: stone and gap widths that fall between vertices would alias level to level
    size = max(int(round(stone_size_of(d) / h)), 1)
    gap = max(int(round(stone_gap_of(d) / h)), 1)
    p = int(round(PLATFORM_HALF / h))

    def on_stone(c: np.ndarray) -> np.ndarray:
        # rings of stones laid outward from the platform edge, mirrored about the centre
        k = np.abs(np.rint(c / h).astype(int)) - p
        return (k < 0) | (np.mod(k, size + gap) < size)

    out = np.where(on_stone(x) & on_stone(y), 0.0, -PIT_DEPTH)
    out[np.maximum(np.abs(x), np.abs(y)) < PLATFORM_HALF] = 0.0
    return out


def _gaps(x, y, half, d):
    r = np.maximum(np.abs(x), np.abs(y))
    moat = (r >= PLATFORM_HALF) & (r < PLATFORM_HALF + gap_width_of(d))
    return np.where(moat, -PIT_DEPTH, 0.0)


def make_tile(kind: str, d: float, n: int, h: float, rng: np.random.Generator) -> np.ndarray:
    """Heights (n, n) in metres of one tile of type ``kind`` at difficulty ``d`` (unquantised)."""
    x, y = _tile_coords(n, h)
    half = n * h / 2
    if kind == "flat":
        return np.zeros_like(x)
    if kind in ("slope_up", "slope_down"):
        return _slope(x, y, half, d, -1.0 if kind == "slope_up" else 1.0)
    if kind == "rough_slope":
        return _rough_slope(x, y, half, d, rng)
    if kind in ("stairs_up", "stairs_down"):
        return _stairs(x, y, half, d, -1.0 if kind == "stairs_up" else 1.0)
    if kind == "obstacles":
        return _obstacles(x, y, half, d, rng)
    if kind == "stepping_stones":
        return _stepping_stones(x, y, half, d)
    if kind == "gaps":
        return _gaps(x, y, half, d)
    raise ValueError(f"unknown terrain type {kind!r}; allowed types: {', '.join(TERRAIN_TYPES)}")


# --- the whole terrain -----------------------------------------------------------------------------
@dataclass(frozen=True)
class HField:
    """What a MuJoCo hfield asset + geom needs: vertex heights are ``pos[2] + data * size[2]``."""

    nrow: int                      # vertices along y (MuJoCo hfield rows run along y)
    ncol: int                      # vertices along x
    size: tuple[float, float, float, float]  # (radius_x, radius_y, elevation_z, base_z)
    data: np.ndarray               # (nrow * ncol,) float32 in [0, 1], row-major: row = y index
    pos: tuple[float, float, float]  # geom position (the hfield's lowest vertex height in z)

    def add_to(self, spec, name: str = "terrain"):
        """Add the hfield asset and a geom using it to a ``mujoco.MjSpec``; returns the geom."""
        import mujoco

        hf = spec.add_hfield()
        hf.name = name
        hf.nrow, hf.ncol = self.nrow, self.ncol
        hf.size = list(self.size)
        hf.userdata = self.data.tolist()
        geom = spec.worldbody.add_geom()
        geom.name = name
        geom.type = mujoco.mjtGeom.mjGEOM_HFIELD
        geom.hfieldname = name
        geom.pos = list(self.pos)
        return geom


@dataclass
class Terrain:
    cfg: TerrainConfig
    heights: np.ndarray            # (nx, ny) float32 m, x = levels axis, y = columns axis
    origins: torch.Tensor          # (num_levels, num_cols, 3) float32, spawn point at each tile centre
    col_types: tuple[str, ...]     # terrain type name of each column
    _device_heights: dict = field(default_factory=dict, repr=False)
    _scratch: dict = field(default_factory=dict, repr=False, compare=False)  # height_at_numpy's buffers

    @property
    def is_plane(self) -> bool:
        return self.cfg.plane

    @property
    def num_levels(self) -> int:
        return self.cfg.num_levels

    @property
    def num_cols(self) -> int:
        return self.cfg.num_cols

    @property
    def col_type_ids(self) -> torch.Tensor:
        """(num_cols,) long: index of each column's type in ``TERRAIN_TYPES``."""
        return torch.tensor([TERRAIN_TYPES.index(t) for t in self.col_types], dtype=torch.long)

    def tile(self, level: int, col: int) -> np.ndarray:
        """The (n, n) heights of one tile (a view)."""
        n = _tile_px(self.cfg)
        b = _border_px(self.cfg)
        return self.heights[b + level * n: b + (level + 1) * n, b + col * n: b + (col + 1) * n]

    def height_at(self, xy: torch.Tensor) -> torch.Tensor:
        """Terrain height (m) under world points (..., 2) -> (...), on MuJoCo's triangles; points
        outside the heightfield get the height of its nearest edge. On the CPU numpy evaluates the
        same elementwise arithmetic (``height_at_numpy``, bit for bit, tested) at a fraction of the
        per-call cost: the height scan looks up ~190 points per env every step."""
        arrays = cpu_arrays(xy)
        if arrays is not None:
            return torch.from_numpy(self.height_at_numpy(arrays[0]))
        return self.height_at_reference(xy)

    def height_at_reference(self, xy: torch.Tensor) -> torch.Tensor:
        """``height_at`` in torch (any device): the reference. Both coordinates go through each
        operation together (per-column bounds as (2,) tensors): the same arithmetic as one coordinate
        at a time, in fewer calls - on a GPU every call is a kernel launch, and an env step with resets
        looks the terrain up four times."""
        H = self._flat_heights(xy.device)   # (nx * ny,) row-major: vertex (i, j) at i * ny + j
        zero, centre, top, last, stride = self._grid_bounds(xy.device, H.dtype)
        ny = self.heights.shape[1]
        uv = (xy.to(H.dtype) / self.cfg.horizontal_scale + centre).clamp(min=zero, max=top)   # (..., 2)
        ij = uv.floor().clamp(max=last)     # whole numbers, exact in float
        f = uv - ij
        fu, fv = f.unbind(-1)
        # The cell splits along its (00, 11) diagonal into triangles (00, 10, 11) where fu >= fv and
        # (00, 01, 11) where fv > fu. Both read h00 + a (hm - h00) + b (h11 - hm) with a = max(fu, fv),
        # b = min(fu, fv) and hm the middle vertex, so three flat-index gathers (one strided `take`
        # each) replace four 2-D advanced indexings and the second triangle's arithmetic.
        k = (ij.long() * stride).sum(-1)
        h00 = H.take(k)
        hm = H.take(k + torch.where(fu >= fv, ny, 1))
        h11 = H.take(k + (ny + 1))
        return h00 + f.amax(-1) * (hm - h00) + f.amin(-1) * (h11 - hm)

    def _grid_bounds(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """(0, 0), the grid's centre ((nx - 1) / 2, (ny - 1) / 2), its last vertex (nx - 1, ny - 1) and
        last cell (nx - 2, ny - 2) in ``dtype``, and the flat index's strides (ny, 1): made once per device."""
        nx, ny = self.heights.shape
        return (device_constant((0.0, 0.0), dtype, device),
                device_constant(((nx - 1) / 2, (ny - 1) / 2), dtype, device),
                device_constant((float(nx - 1), float(ny - 1)), dtype, device),
                device_constant((float(nx - 2), float(ny - 2)), dtype, device),
                device_constant((ny, 1), torch.long, device))

    def height_at_numpy(self, xy: np.ndarray) -> np.ndarray:
        """``height_at_reference`` on numpy arrays: the same IEEE-rounded operations in the same order
        (torch turns the Python scalars into the float32 operands used here). The intermediates live
        in per-shape scratch buffers: with fresh ones the same arithmetic took 3.3 ms instead of
        0.65 ms at 256 x 188 points (measured side by side; the cost is the allocations', not the
        arithmetic's - at 64 x 188 the two are equal)."""
        H = self._flat_heights(torch.device("cpu")).numpy()
        nx, ny = self.heights.shape
        f32 = H.dtype.type
        s = self._scratch_for(xy.shape[:-1], H.dtype)
        u, v, i, j, k, k2 = s["u"], s["v"], s["i"], s["j"], s["k"], s["k2"]
        hs = f32(self.cfg.horizontal_scale)
        xy = xy.astype(H.dtype, copy=False)                        # torch casts before dividing too
        np.divide(xy[..., 0], hs, out=u, casting="same_kind")     # one column at a time: numpy is
        np.divide(xy[..., 1], hs, out=v, casting="same_kind")     # slow on a length-2 last axis
        u += f32((nx - 1) / 2)
        v += f32((ny - 1) / 2)
        np.clip(u, 0, nx - 1, out=u)
        np.clip(v, 0, ny - 1, out=v)
        np.minimum(np.floor(u, out=i), f32(nx - 2), out=i)
        np.minimum(np.floor(v, out=j), f32(ny - 2), out=j)
        fu, fv = np.subtract(u, i, out=u), np.subtract(v, j, out=v)
        np.copyto(k, i, casting="unsafe")                          # whole numbers: exact
        k *= ny
        np.copyto(k2, j, casting="unsafe")
        k += k2                                                    # k = i * ny + j
        h00 = H.take(k)                                            # the result's buffer: fresh
        lower = np.greater_equal(fu, fv, out=s["lower"])
        np.add(k, 1, out=k2)
        np.add(k2, ny - 1, out=k2, where=lower)                    # the middle vertex: k + ny or k + 1
        hm = H.take(k2, out=s["hm"], mode="clip")                 # (every index is in range)
        k += ny + 1
        h11 = H.take(k, out=s["h11"], mode="clip")
        a = np.maximum(fu, fv, out=s["a"])
        b = np.minimum(fu, fv, out=u)
        # h00 + a (hm - h00) + b (h11 - hm), evaluated in that order
        h11 -= hm
        h11 *= b
        hm -= h00
        hm *= a
        h00 += hm
        h00 += h11
        return h00

    def _scratch_for(self, shape: tuple[int, ...], dtype) -> dict[str, np.ndarray]:
        """``height_at_numpy``'s intermediates for this batch shape, per thread (no sharing)."""
        key = (threading.get_ident(), shape)
        got = self._scratch.get(key)
        if got is None:
            got = {name: np.empty(shape, dtype) for name in ("u", "v", "i", "j", "a", "hm", "h11")}
            got.update(k=np.empty(shape, np.int64), k2=np.empty(shape, np.int64), lower=np.empty(shape, bool))
            for stale in list(self._scratch)[:-3]:  # in use: the scan's shape, a reset's two; keep a few
                self._scratch.pop(stale, None)
            self._scratch[key] = got
        return got

    def _flat_heights(self, device: torch.device) -> torch.Tensor:
        key = str(device)
        if key not in self._device_heights:
            self._device_heights[key] = torch.as_tensor(self.heights, device=device).reshape(-1).contiguous()
        return self._device_heights[key]

    def mujoco_hfield(self, base_z: float = 1.0) -> HField:
        """The heightfield for MuJoCo, centred on the world origin (``base_z``: box depth below the
        lowest vertex)."""
        nx, ny = self.heights.shape
        lo, hi = float(self.heights.min()), float(self.heights.max())
        elevation = max(hi - lo, 1e-3)  # MuJoCo needs a positive elevation even when flat
        data = ((self.heights - lo) / elevation).T.astype(np.float32)  # (ny, nx): rows along y
        hs = self.cfg.horizontal_scale
        return HField(nrow=ny, ncol=nx, size=((nx - 1) * hs / 2, (ny - 1) * hs / 2, elevation, base_z),
                      data=np.ascontiguousarray(data).reshape(-1), pos=(0.0, 0.0, lo))


def _tile_px(cfg: TerrainConfig) -> int:
    return int(round(cfg.tile_size / cfg.horizontal_scale))


def _border_px(cfg: TerrainConfig) -> int:
    return int(round(cfg.border / cfg.horizontal_scale))


def generate(cfg: TerrainConfig) -> Terrain:
    """The terrain of ``cfg``: pure, the same config gives bit-identical heights."""
    cfg.validate()
    n, b = _tile_px(cfg), _border_px(cfg)
    hs = cfg.horizontal_scale
    col_types = assign_columns(cfg.proportions, cfg.num_cols)
    # one extra vertex closes the grid so it is symmetric about the origin
    nx, ny = 2 * b + cfg.num_levels * n + 1, 2 * b + cfg.num_cols * n + 1
    heights = np.zeros((nx, ny), dtype=np.float32)
    origins = np.zeros((cfg.num_levels, cfg.num_cols, 3), dtype=np.float32)
    c = n // 2
    p = int(round(PLATFORM_HALF / hs))
    for level in range(cfg.num_levels):
        d = cfg.difficulty(level)
        for col, kind in enumerate(col_types):
            if cfg.plane:
                tile = np.zeros((n, n))
            else:
                rng = numpy_rng(cfg.seed, f"terrain/{level}/{col}")
                tile = make_tile(kind, d, n, hs, rng)
            tile = np.round(tile / cfg.vertical_scale) * cfg.vertical_scale
            heights[b + level * n: b + (level + 1) * n, b + col * n: b + (col + 1) * n] = tile
            # spawn over the highest point of the platform (legged_gym: max of the central area)
            origins[level, col] = (b + level * n + c - (nx - 1) / 2) * hs, \
                (b + col * n + c - (ny - 1) / 2) * hs, tile[c - p + 1: c + p, c - p + 1: c + p].max()
    return Terrain(cfg=cfg, heights=heights, origins=torch.from_numpy(origins), col_types=col_types)


# --- the one terrain-spec parser (every --terrain flag) ------------------------------------------------
TERRAIN_SPEC_HELP = ("flat (a plane), plane_grid (a plane with a tile grid of spawn origins), mixed "
                     "(legged_gym's mix) or a comma list of terrain types: " + ", ".join(TERRAIN_TYPES))


def terrain_types(spec: str) -> list[str]:
    """The terrain types a spec names, in order, without repeats: ``mixed`` is every type."""
    spec = str(spec).strip()
    if spec == "mixed":
        return list(TERRAIN_TYPES)
    if spec == "plane_grid":
        return ["flat"]
    types = list(dict.fromkeys(t.strip() for t in spec.split(",") if t.strip()))
    unknown = [t for t in types if t not in TERRAIN_TYPES]
    if unknown or not types:
        raise ValueError(f"--terrain={spec!r}: unknown terrain types {unknown}; allowed: {TERRAIN_SPEC_HELP}")
    return types


def terrain_config(spec: str, one_column_per_type: bool = False, **grid) -> "TerrainConfig | None":
    """The ``EnvConfig.terrain`` of a ``--terrain`` spec.

    ``flat`` is a plane (None); ``plane_grid`` a plane with spawn tiles; ``mixed`` legged_gym's mix; a comma
    list equal shares of those types. ``one_column_per_type`` lays out one grid column per named type
    (``mixed``: every type; ``flat``: flat tiles), which evaluation needs to pin envs to cells. ``grid``
    are further ``TerrainConfig`` fields (``num_levels``, ``seed``, ...)."""
    spec = str(spec).strip()
    types = terrain_types(spec)   # validates every spec
    if one_column_per_type:
        return TerrainConfig.of_types(types, **{"num_cols": len(types), **grid})
    if spec == "flat":
        return None
    if spec == "plane_grid":
        return TerrainConfig.flat(**grid)
    if spec == "mixed":
        return TerrainConfig.mixed(**grid)
    return TerrainConfig.of_types(types, **grid)
