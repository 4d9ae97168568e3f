"""Which terrain tile each env lives on: its (level, column), the tile origin it spawns at, its terrain
type, and the curriculum that moves it between levels at reset (``envs.curriculum``).

With no terrain (``EnvConfig.terrain is None``) every env spawns at the world origin of a plane - each env
is its own MuJoCo world, so robots never meet - and the only type is "flat". ``TerrainConfig.flat()`` is a
plane too, but with the tile grid's origins and levels (useful for level sweeps of flat-ground skills).
"""
from __future__ import annotations

import torch

from envs.config import EnvConfig


class TerrainState:
    def __init__(self, cfg: EnvConfig, num_envs: int, gen: torch.Generator, device: torch.device):
        self.num_envs, self.device, self.gen = num_envs, device, gen
        self.levels = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.cols = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.type_idx = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.terrain = None
        self.curriculum = None
        if cfg.terrain is None:
            self.flat = True
            self.types: tuple[str, ...] = ("flat",)
            self.origins = torch.zeros(1, 1, 3, device=device)
            self.col_type_idx = torch.zeros(1, dtype=torch.long, device=device)
            return
        from envs.terrain import generate
        self.terrain = generate(cfg.terrain)
        self.flat = bool(self.terrain.is_plane)  # a plane: heights are 0, no lookups needed
        self.origins = torch.as_tensor(self.terrain.origins, dtype=torch.float32, device=device)
        col_types = tuple(self.terrain.col_types)
        self.types = tuple(dict.fromkeys(col_types))
        self.col_type_idx = torch.tensor([self.types.index(t) for t in col_types], dtype=torch.long, device=device)
        num_levels, num_cols = self.origins.shape[:2]
        # legged_gym: columns spread evenly over the envs, start levels random in [0, max_init_level].
        self.cols = torch.div(torch.arange(num_envs, device=device) * num_cols, num_envs, rounding_mode="floor")
        if cfg.curriculum:
            top = min(cfg.max_init_terrain_level, num_levels - 1)
            self.levels = torch.randint(0, top + 1, (num_envs,), generator=gen, device=device)
            self.curriculum = _make_curriculum(cfg, self)
        else:
            self.levels = torch.randint(0, num_levels, (num_envs,), generator=gen, device=device)
        self.type_idx = self.col_type_idx[self.cols]

    @property
    def num_levels(self) -> int:
        return self.origins.shape[0]

    def origins_of(self, env_ids: torch.Tensor) -> torch.Tensor:
        if self.terrain is None:
            return self.origins[0, 0].expand(env_ids.numel(), 3)
        return self.origins[self.levels[env_ids], self.cols[env_ids]]

    def set_levels(self, env_ids: torch.Tensor, levels, cols=None) -> None:
        levels = torch.as_tensor(levels, dtype=torch.long, device=self.device).reshape(-1)
        if levels.numel() == 1:
            levels = levels.expand(env_ids.numel())
        if ((levels < 0) | (levels >= self.num_levels)).any():
            raise ValueError(f"set_terrain_levels: levels must lie in [0, {self.num_levels - 1}]")
        self.levels[env_ids] = levels
        if cols is not None:
            cols = torch.as_tensor(cols, dtype=torch.long, device=self.device).reshape(-1)
            if cols.numel() == 1:
                cols = cols.expand(env_ids.numel())
            if ((cols < 0) | (cols >= self.origins.shape[1])).any():
                raise ValueError(f"set_terrain_levels: cols must lie in [0, {self.origins.shape[1] - 1}]")
            self.cols[env_ids] = cols
            self.type_idx[env_ids] = self.col_type_idx[cols]

    def update_curriculum(self, env_ids: torch.Tensor, distance: torch.Tensor, commanded: torch.Tensor) -> None:
        if self.curriculum is None:
            return
        self.levels[env_ids] = self.curriculum.update(env_ids, self.levels[env_ids], distance, commanded)

    def log(self) -> dict[str, float]:
        if self.terrain is None:
            return {}
        out = {"Curriculum/terrain_level": self.levels.to(torch.float32).mean().item()}
        for i, name in enumerate(self.types):
            m = self.type_idx == i
            if m.any():
                out[f"Curriculum/level_{name}"] = self.levels[m].to(torch.float32).mean().item()
        return out


def _make_curriculum(cfg: EnvConfig, state: TerrainState):
    raise NotImplementedError("terrain curriculum: waiting for envs.curriculum (team robots+terrain)")
