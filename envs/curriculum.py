"""legged_gym's terrain curriculum: each env lives on one tile (level, col) and moves between levels at
reset by how far it walked.

Rule (applied in ``update`` to the envs being reset): up one level if the robot walked more than half a
tile from its spawn point; otherwise down one level if it walked less than half the distance its
commands asked for; an env pushed past the top level is sent to a uniformly random level (so solved
envs keep sampling the whole range); levels never go below 0. Columns (terrain types) never change
under the curriculum. Pure torch on the terrain's origins.
"""
from __future__ import annotations

import torch

from quadforge.envs.terrain import TERRAIN_TYPES, Terrain
from quadforge.seeding import torch_generator


def next_levels(levels: torch.Tensor, distance: torch.Tensor, commanded_distance: torch.Tensor,
                num_levels: int, tile_size: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """The rule on its own: new levels (k,) for envs at ``levels`` (k,) that walked ``distance`` (k,)
    of ``commanded_distance`` (k,); ``generator`` (CPU) draws the random level past the top."""
    up = distance > tile_size / 2
    down = (distance < 0.5 * commanded_distance) & ~up
    levels = levels + up.long() - down.long()
    random_levels = torch.randint(0, num_levels, levels.shape, generator=generator).to(levels.device)
    return torch.where(levels >= num_levels, random_levels, levels.clamp(min=0))


class TerrainCurriculum:
    def __init__(self, terrain: Terrain, num_envs: int, max_init_level: int = 5, seed: int = 0,
                 device: str | torch.device = "cpu"):
        if num_envs < 1:
            raise ValueError(f"TerrainCurriculum.num_envs = {num_envs}; allowed: an integer >= 1")
        if max_init_level < 0:
            raise ValueError(f"TerrainCurriculum.max_init_level = {max_init_level}; allowed: an integer >= 0")
        self.terrain = terrain
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.num_levels = terrain.num_levels
        self.num_cols = terrain.num_cols
        self.tile_size = terrain.cfg.tile_size
        self._gen = torch_generator(seed, "terrain_curriculum")  # CPU stream: same draws on any device
        self._origins = terrain.origins.to(self.device)
        self._col_type = terrain.col_type_ids.to(self.device)
        top = min(max_init_level, self.num_levels - 1)
        self.levels = torch.randint(0, top + 1, (num_envs,), generator=self._gen).to(self.device)
        # envs spread evenly over the columns, as legged_gym does
        self.cols = (torch.arange(num_envs) * self.num_cols // num_envs).to(self.device)

    def update(self, env_ids: torch.Tensor, distance: torch.Tensor, commanded_distance: torch.Tensor) -> None:
        """Move the given envs (k,) by the distance (k,) they walked vs. the distance (k,) commanded."""
        env_ids = env_ids.to(self.device)
        if env_ids.numel() == 0:
            return
        self.levels[env_ids] = next_levels(self.levels[env_ids], distance.to(self.device),
                                           commanded_distance.to(self.device), self.num_levels,
                                           self.tile_size, self._gen)

    def set(self, env_ids: torch.Tensor, levels: torch.Tensor, cols: torch.Tensor) -> None:
        """Place envs on given tiles (evaluation sweeps); ValueError for a tile off the grid."""
        levels, cols = levels.to(self.device).long(), cols.to(self.device).long()
        if levels.numel() and (levels.min() < 0 or levels.max() >= self.num_levels):
            raise ValueError(f"terrain levels must be in 0..{self.num_levels - 1}; got {levels.tolist()}")
        if cols.numel() and (cols.min() < 0 or cols.max() >= self.num_cols):
            raise ValueError(f"terrain cols must be in 0..{self.num_cols - 1}; got {cols.tolist()}")
        env_ids = env_ids.to(self.device)
        self.levels[env_ids] = levels
        self.cols[env_ids] = cols

    def origins(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Spawn points (k, 3) (world xyz, on the tile's platform) of the given envs (all if None)."""
        if env_ids is None:
            return self._origins[self.levels, self.cols]
        env_ids = env_ids.to(self.device)
        return self._origins[self.levels[env_ids], self.cols[env_ids]]

    @property
    def terrain_types(self) -> torch.Tensor:
        """(N,) long: each env's terrain type as an index into ``TERRAIN_TYPES``."""
        return self._col_type[self.cols]

    def stats(self) -> dict[str, float]:
        """Mean level per terrain type present (``Curriculum/level/<type>``) and overall."""
        out = {"Curriculum/level/mean": float(self.levels.float().mean())}
        types = self.terrain_types
        for idx, name in enumerate(TERRAIN_TYPES):
            mask = types == idx
            if bool(mask.any()):
                out[f"Curriculum/level/{name}"] = float(self.levels[mask].float().mean())
        return out
