"""Which terrain tile each env lives on: its (level, column), the tile origin it spawns at, its terrain
type, and legged_gym's terrain curriculum that moves it between levels at reset (``next_levels``).

The curriculum rule (``next_levels``, applied to the envs being reset): up one level if the robot walked
more than half a tile from its spawn point; otherwise down one level if it walked less than half the
distance its commands ask for over a whole episode (``LocomotionTask.asked_distance``: an episode that
ended early, a fall, counts the steps it did not run at its last command, as legged_gym's
|cmd| x episode length does); an env pushed past the top level is sent to a uniformly random level
(so solved envs keep sampling the whole range); levels never go below 0. Columns (terrain types) never
change under the curriculum.

With no terrain (``EnvConfig.terrain is None``) every env spawns at the world origin of a plane - each env
is its own MuJoCo world, so robots never meet - and the only type is "flat". Type indices are into
``envs.terrain.TERRAIN_TYPES``. ``TerrainConfig.flat()`` is a plane too, but with the tile grid's
origins and levels (useful for level sweeps of flat-ground skills).
"""
from __future__ import annotations

import torch

from quadforge.envs.config import EnvConfig
from quadforge.envs.step_log import PendingLog, match_table, read_logs
from quadforge.tensors import from_host
from quadforge.envs.terrain import TERRAIN_TYPES, generate


def next_levels(levels: torch.Tensor, distance: torch.Tensor, commanded_distance: torch.Tensor,
                num_levels: int, tile_size: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """The rule on its own: new levels (k,) for envs at ``levels`` (k,) that walked ``distance`` (k,)
    of ``commanded_distance`` (k,), the distance asked over a whole episode; ``generator`` (CPU) draws the
    random level past the top."""
    up = distance > tile_size / 2
    down = (distance < 0.5 * commanded_distance) & ~up
    levels = levels + up.long() - down.long()
    random_levels = from_host(torch.randint(0, num_levels, levels.shape, generator=generator), levels.device)
    return torch.where(levels >= num_levels, random_levels, levels.clamp(min=0))


class TerrainState:
    def __init__(self, cfg: EnvConfig, num_envs: int, gen: torch.Generator, device: torch.device):
        """``gen`` is a CPU generator (level draws are the same on any device)."""
        self.num_envs, self.device, self.gen = num_envs, device, gen
        self.levels = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.cols = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.type_idx = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.terrain = None
        self.use_curriculum = False
        # Type indices are global (into TERRAIN_TYPES) so every env and every store agrees on them.
        self.types: tuple[str, ...] = TERRAIN_TYPES
        if cfg.terrain is None:
            self.flat = True
            self.origins = torch.zeros(1, 1, 3, device=device)
            self.col_type_idx = torch.zeros(1, dtype=torch.long, device=device)  # "flat"
            return
        self.terrain = generate(cfg.terrain)
        self.flat = bool(self.terrain.is_plane)  # a plane: heights are 0, no lookups needed
        self.origins = torch.as_tensor(self.terrain.origins, dtype=torch.float32, device=device)
        self.col_type_idx = self.terrain.col_type_ids.to(device)
        self.tile_size = float(cfg.terrain.tile_size)
        num_levels, num_cols = self.origins.shape[:2]
        # legged_gym: columns spread evenly over the envs, start levels random in [0, max_init_level].
        self.cols = torch.div(torch.arange(num_envs, device=device) * num_cols, num_envs, rounding_mode="floor")
        if cfg.curriculum:
            top = min(cfg.max_init_terrain_level, num_levels - 1)
            self.levels = torch.randint(0, top + 1, (num_envs,), generator=gen).to(device)
            self.use_curriculum = True
        else:
            self.levels = torch.randint(0, num_levels, (num_envs,), generator=gen).to(device)
        self.type_idx = self.col_type_idx[self.cols]

    @property
    def num_levels(self) -> int:
        return self.origins.shape[0]

    def origins_of(self, env_ids: torch.Tensor) -> torch.Tensor:
        if self.terrain is None:
            return self.origins[0, 0].expand(env_ids.numel(), 3)
        return self.origins[self.levels[env_ids], self.cols[env_ids]]

    def set_levels(self, env_ids: torch.Tensor, levels, cols=None) -> None:
        """Move envs to (level, col) tiles; a scalar level/col applies to all; nothing changes on error."""
        levels = self._per_env(env_ids, levels, "levels", self.num_levels)
        cols = self._per_env(env_ids, cols, "cols", self.origins.shape[1]) if cols is not None else None
        self.levels[env_ids] = levels
        if cols is not None:
            self.cols[env_ids] = cols
            self.type_idx[env_ids] = self.col_type_idx[cols]

    def _per_env(self, env_ids: torch.Tensor, values, name: str, size: int) -> torch.Tensor:
        v = torch.as_tensor(values, device=self.device).reshape(-1)
        if v.dtype == torch.bool or v.is_floating_point() or v.is_complex():   # 1.5 would move to tile 1
            raise ValueError(f"set_terrain_levels: {name} must be integers; got dtype {v.dtype}")
        v = v.long()
        if v.numel() == 1:
            v = v.expand(env_ids.numel())
        if v.numel() != env_ids.numel():
            raise ValueError(f"set_terrain_levels: {v.numel()} {name} for {env_ids.numel()} envs; give one per env")
        if ((v < 0) | (v >= size)).any():
            raise ValueError(f"set_terrain_levels: {name} must lie in [0, {size - 1}]; got {v.tolist()}")
        return v

    def update_curriculum(self, env_ids: torch.Tensor, distance: torch.Tensor, commanded: torch.Tensor) -> None:
        if not self.use_curriculum or env_ids.numel() == 0:
            return
        self.levels[env_ids] = next_levels(self.levels[env_ids], distance, commanded, self.num_levels,
                                           self.tile_size, self.gen)

    def log(self) -> dict[str, float]:
        return read_logs([p for p in (self.pending_log(),) if p is not None])

    def pending_log(self) -> PendingLog | None:
        """``Curriculum/level/mean`` and the mean level per terrain type present, on the device
        (``envs.step_log``); None without a terrain."""
        if self.terrain is None:
            return None
        k = len(self.types)
        levels = self.levels.to(torch.float32)
        match = match_table(self.type_idx, k)                             # (N, types)
        sums, n = (match * levels.to(torch.float64)[:, None]).sum(dim=0), match.sum(dim=0)
        types = self.types

        def name(xs: list[float]) -> dict[str, float]:
            mean, sums_l, counts_l = xs[0], xs[1:k + 1], xs[k + 1:]
            out = {"Curriculum/level/mean": mean}
            out.update({f"Curriculum/level/{t}": s / c for t, s, c in zip(types, sums_l, counts_l) if c})
            return out
        return PendingLog(torch.cat([levels.mean().to(torch.float64).reshape(1), sums, n]), name)
