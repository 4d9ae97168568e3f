"""Window and transition samplers over a trajectory store, in-memory ``EpisodeArrays`` or, out of core,
``StepShards`` (memory-mapped per-step shards of a store: ``data.step_shards``; of several stores as one:
``data.store_set.MultiStepShards``; pick with ``data.ram_budget.sampler_source``).

Both samplers select episodes once (seeded episode-level split, then filters), build the layout
vector of every selected step up front and lay the steps out so that every window is a block of
consecutive rows (see ``_SelectedSteps``). A batch is index arithmetic plus one block gather per
tensor - no Python loop per window.

Out of core the same samplers run on ``data.shard_steps.ShardSteps``: no per-step table, each batch gathered
from the shards; the same seed draws the same batches on either path.

Padding rule: the window ending at step t of an episode holds steps t-n+1..t; positions before the
episode's first step read the zero row (obs, actions, rtg = 0) and have mask False, on the LEFT.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np
import torch

from quadforge.data.episodes import (EpisodeArrays, as_episode_arrays, discounted_returns, select_episodes,
                           SPLITS)
from quadforge.data.shard_steps import ShardSteps, StridedPool
from quadforge.data.step_shards import ShardSource
from quadforge.data.schema import CATALOGUE
from quadforge.layout import TERM_DIMS, ObsLayout, as_layout
from quadforge.seeding import numpy_rng
from quadforge.typed_values import count, whole

__all__ = ["EpisodeArrays", "WindowSampler", "TransitionSampler", "SPLITS", "SeededSampler"]

# "auto": strided unless padding would more than double the table; tests force each layout
WINDOW_LAYOUT = "auto"


class _SelectedSteps:
    """The selected episodes' steps laid out for fast window reads.

    Strided layout (the default): one zero row, then per episode ``n - 1`` zero rows followed by its
    steps. The window ending at any step is then ``n`` consecutive rows - its left padding already
    zero - so a batch is one numpy fancy index over a sliding-window view (block copies, ~3x faster
    than a row gather). Start row 0 is an all-zero window. When the padding would more than double
    the table (long contexts over short episodes) it falls back to the row layout: a zero row then
    the steps, gathered row by row with ``index_select`` and padded windows pointing at row 0.
    """

    def __init__(self, data: EpisodeArrays, episodes: np.ndarray, layout: ObsLayout, action_feature: str,
                 context: int):
        self.episodes = episodes                                   # (E_sel,) indices into the source
        lengths = data.episode_lengths[episodes]
        self.lengths = lengths
        self.starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)  # compact starts
        self.num_steps = int(lengths.sum())
        # compact step i <-> source step source_index[i]
        shift = np.repeat(data.episode_starts[episodes] - self.starts, lengths)
        self.source_index = np.arange(self.num_steps, dtype=np.int64) + shift
        self.step_start = np.repeat(self.starts, lengths)          # (T,) compact start of the step's episode
        self.step_episode = np.repeat(np.arange(len(episodes)), lengths)  # (T,) position in `episodes`
        self.timestep = np.arange(self.num_steps, dtype=np.int64) - self.step_start

        self.context = n = int(context)
        pad = n - 1
        self.strided = (WINDOW_LAYOUT == "strided" or
                        (WINDOW_LAYOUT == "auto" and pad * len(episodes) <= max(self.num_steps, 4096)))
        # row of compact step i in the tables
        self.row = 1 + np.arange(self.num_steps, dtype=np.int64)
        if self.strided:
            self.row += pad * (self.step_episode + 1)
        self.num_rows = int(self.row[-1]) + 1

        terms = {name: torch.from_numpy(np.ascontiguousarray(data.features[name][self.source_index],
                                                             dtype=np.float32))
                 for name in layout.term_names}
        obs = layout.build(terms).numpy()                          # (T, D)
        acts = np.asarray(data.features[action_feature][self.source_index], dtype=np.float32)
        acts = acts.reshape(self.num_steps, -1)                    # (T, A)
        self.obs_moments = _moments(obs)
        self.action_moments = _moments(acts)
        self.obs = self.table(obs)                                 # (rows, D)
        self.actions = self.table(acts)                            # (rows, A)

    def table(self, x: np.ndarray) -> np.ndarray:
        """Per-step values (T, ...) placed in this layout, zeros elsewhere."""
        out = np.zeros((self.num_rows,) + x.shape[1:], dtype=x.dtype)
        out[self.row] = x
        return out

    def mask_timestep(self, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, n) mask and (B, n) within-episode timestep of the windows ending at compact ``ends``."""
        n = self.context
        back = np.arange(n - 1, -1, -1, dtype=np.int64)[None, :]   # steps before the window's end
        t = self.timestep[ends][:, None] - back
        mask = t >= 0
        return mask, np.where(mask, t, 0)

    def windows(self, table: np.ndarray, ends: np.ndarray, valid: np.ndarray | None = None) -> torch.Tensor:
        """(B, n, ...) windows of ``table`` ending at compact steps ``ends``; all zeros where not ``valid``."""
        n = self.context
        if self.strided:
            first = self.row[ends] - (n - 1)
            if valid is not None:
                first = np.where(valid, first, 0)
            view = np.lib.stride_tricks.as_strided(
                table, shape=(self.num_rows - n + 1, n) + table.shape[1:],
                strides=(table.strides[0],) + table.strides, writeable=False)
            return torch.from_numpy(view[first])
        idx = ends[:, None] + np.arange(1 - n, 1, dtype=np.int64)[None, :]
        ok = idx >= self.step_start[ends][:, None]
        if valid is not None:
            ok &= valid[:, None]
        flat = torch.from_numpy(np.where(ok, idx + 1, 0).reshape(-1))
        # index_select: ~10x faster than torch advanced indexing for row gathers
        return torch.from_numpy(table).index_select(0, flat).view((len(ends), n) + table.shape[1:])

    def rows(self, table: np.ndarray, steps: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(table[self.row[steps]])


def _source(source: Any, needed: list[str]) -> Any:
    """The samplers' data: a ``ShardSource`` as is (out of core), anything else loaded into RAM."""
    return source if isinstance(source, ShardSource) else as_episode_arrays(source, needed)


def _select_steps(data: Any, episodes: np.ndarray, layout: ObsLayout, action_feature: str, context: int):
    steps = ShardSteps if isinstance(data, ShardSource) else _SelectedSteps
    return steps(data, episodes, layout, action_feature, context)


BIN_FIT_ROWS = 4_000_000    # out of core, a bin fit sees at most this many sampled steps (RAM: every step)


class SeededSampler:
    """The random stream a sampler draws batches from, as a public API: ``rng`` (read it to checkpoint its
    state), ``reseed(name)`` (a stream of its own, derived from the sampler's seed and ``name``)."""

    seed: int
    _rng: np.random.Generator

    @property
    def rng(self) -> np.random.Generator:
        return self._rng

    def reseed(self, name: str) -> np.random.Generator:
        self._rng = numpy_rng(self.seed, name)
        return self._rng

    def binning_actions(self) -> np.ndarray:
        """(N, A) actions to fit action bins on: the selected steps' actions (in RAM all of them; out of core
        all up to ``BIN_FIT_ROWS``, a seeded sample of that many beyond). Not the RAM table's zero rows (the
        windows' left padding): a dimension that never reaches 0 (a gait frequency of 2-4 Hz) would get
        edges stretched to 0, and quantile bins would pile onto the padding's zeros."""
        steps = self.steps
        if isinstance(steps, ShardSteps):
            return steps.action_rows(BIN_FIT_ROWS, self.seed)
        return steps.actions[steps.row]


class _LayoutSampler(SeededSampler):
    """What the two layout-vector samplers share: the normalisation statistics of their selection."""

    layout: ObsLayout
    action_feature: str
    _episode_ids: Any                    # the source's episode_id column (None: it has none)

    def obs_stats(self, std_floor: float = 1e-2) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of the layout vector over the selected steps, each (D,); std >= std_floor. Non-finite
        ones (a NaN or inf in the data) are an error naming the feature: normalised by them, every input and
        so every loss is NaN, and a training would 'finish' with NaN weights."""
        return _stats(self._finite(self.steps.obs_moments, "observation"), std_floor)

    def action_stats(self, std_floor: float = 1e-2) -> tuple[torch.Tensor, torch.Tensor]:
        return _stats(self._finite(self.steps.action_moments, "action"), std_floor)

    def _finite(self, moments: tuple[np.ndarray, np.ndarray], kind: str) -> tuple[np.ndarray, np.ndarray]:
        bad = ~(np.isfinite(moments[0]) & np.isfinite(moments[1]))
        if not bad.any():
            return moments
        if kind == "observation":
            columns = np.repeat([t.name for t in self.layout.terms], [t.dim for t in self.layout.terms])
        else:
            columns = np.full(len(bad), self.action_feature)
        features = list(dict.fromkeys(columns[bad].tolist()))
        raise ValueError(f"{type(self).__name__}: the {kind} statistics are not finite: feature(s) {features} hold "
                         f"NaN or inf {self._where_nonfinite(kind, bad)}")

    def _where_nonfinite(self, kind: str, bad_columns: np.ndarray) -> str:
        """Which selected episodes hold the non-finite values, when the RAM tables make that cheap to say."""
        steps = self.steps
        if isinstance(steps, ShardSteps):   # no table in RAM: one pass over the store finds them
            return "(out of core: `quadforge dataset validate --deep --store STORE` lists the first bad step)"
        table = steps.obs if kind == "observation" else steps.actions
        rows = ~np.isfinite(table[steps.row][:, bad_columns]).all(axis=1)
        episodes = steps.episodes[np.unique(steps.step_episode[rows])]
        ids = self._episode_ids
        named = [str(ids[e]) for e in episodes[:10]] if ids is not None else episodes[:10].tolist()
        more = f" and {len(episodes) - 10} more" if len(episodes) > 10 else ""
        return f"in episode(s) {named}{more}; fix or drop them"


def _moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x64 = x.astype(np.float64)
    return x64.mean(axis=0), x64.std(axis=0)


def _check_widths(data: Any, layout: ObsLayout, action_feature: str, who: str, catalogue_actions: bool) -> None:
    """Each layout term's feature holds the catalogue's width, and the action feature the catalogue's (12;
    ``catalogue_actions=False``: any one vector per step - GeRM sizes its bins from the data): a (T, 11)
    ``dof_pos`` would otherwise build 60-D observations under a 61-D layout, and training fail mid-run
    without naming it. A store's shards need no look: its writer held every feature to the catalogue."""
    if isinstance(data, ShardSource):
        return
    expected = {name: (TERM_DIMS[name],) for name in layout.term_names}
    if catalogue_actions and action_feature in CATALOGUE:
        expected[action_feature] = CATALOGUE[action_feature].shape
    for name, shape in expected.items():
        got = tuple(np.shape(data.features[name])[1:])
        if got != shape:
            raise ValueError(f"{who}: feature {name!r} has per-step shape {got}; "
                             f"{'the action feature' if name == action_feature else f'layout {layout.name!r}'} "
                             f"needs {shape}")
    if not catalogue_actions and np.ndim(data.features[action_feature]) != 2:
        raise ValueError(f"{who}: action feature {action_feature!r} has shape {np.shape(data.features[action_feature])}; "
                         f"need one vector per step (T, A)")


def _check_context(context: int, who: str) -> None:
    count(context, f"{who}: context")


def check_success_pools(who: str, success_ratio: float | None, sizes: tuple[int, int], selection: str = "") -> None:
    """``success_ratio`` draws that share of each batch from successful episodes and the rest from failed
    ones: a share above zero needs its pool (``sizes``: successful, failed) non-empty. ``selection``
    says what was selected, for the message."""
    if success_ratio is None:
        return
    for name, size, share in (("successful", sizes[0], success_ratio), ("failed", sizes[1], 1.0 - success_ratio)):
        if share > 0 and size == 0:
            raise ValueError(f"{who}: success_ratio={success_ratio} needs {name} episodes; the selection "
                             f"{selection + ' ' if selection else ''}has none (train with the override "
                             f"success_ratio=None to sample its steps as they come)")


def _check_rank(rank: int, world_size: int, who: str) -> None:
    whole(rank, f"{who}: rank")
    whole(world_size, f"{who}: world_size")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"{who}: rank={rank}, world_size={world_size}; need 0 <= rank < world_size")


class WindowSampler(_LayoutSampler):
    """Context windows for sequence imitation (FCNet, Transformer, DC, StARformer, MLP with n=1).

    Every step of every selected episode is a window end. ``reward_feature=None`` drops ``rtg`` from
    the batch (for data without rewards).
    """

    def __init__(self, source: Any, layout: ObsLayout | str, context: int, split: str = "train",
                 val_fraction: float = 0.1, filters: Mapping[str, Any] | None = None, seed: int = 0,
                 rank: int = 0, world_size: int = 1, action_feature: str = "actions",
                 reward_feature: str | None = "rewards"):
        who = "WindowSampler"
        layout = as_layout(layout, who)
        _check_context(context, who)
        _check_rank(rank, world_size, who)
        needed = list(layout.term_names) + [action_feature] + ([reward_feature] if reward_feature else [])
        data = _source(source, needed)
        data.require(needed, who)
        _check_widths(data, layout, action_feature, who, catalogue_actions=True)
        self.layout, self.context, self.split = layout, int(context), split
        self.action_feature, self._episode_ids = action_feature, data.episode_info.get("episode_id")
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        self.steps = _select_steps(data, select_episodes(data, split, val_fraction, seed, filters, who),
                                   layout, action_feature, self.context)
        self.rtg: Any = None
        if reward_feature and isinstance(data, ShardSource):
            self.rtg = data.returns(reward_feature, 1.0)                             # (T_store,) mapped
        elif reward_feature:
            rewards = np.asarray(data.features[reward_feature], dtype=np.float64).reshape(-1)
            rtg = discounted_returns(rewards[self.steps.source_index],
                                     self.steps.starts + self.steps.lengths, 1.0)
            self.rtg = self.steps.table(rtg.astype(np.float32)[:, None])        # (rows, 1)
        self._rng = numpy_rng(self.seed, f"window_sampler/rank{self.rank}")
        self._epoch = 0

    # --- sizes ----------------------------------------------------------------------------------
    @property
    def num_windows(self) -> int:
        return self.steps.num_steps

    @property
    def num_episodes(self) -> int:
        return len(self.steps.episodes)

    @property
    def episode_indices(self) -> np.ndarray:
        """Indices (into the source's episode table) of the selected episodes."""
        return self.steps.episodes

    def __len__(self) -> int:
        return self.num_windows

    # --- batches --------------------------------------------------------------------------------
    def batch_at(self, ends: np.ndarray) -> dict[str, torch.Tensor]:
        """The windows ending at these compact step indices (0..num_windows-1)."""
        ends = np.asarray(ends, dtype=np.int64)
        s = self.steps
        mask, timestep = s.mask_timestep(ends)
        batch = {
            "obs": s.windows(s.obs, ends),                   # (B, n, D)
            "actions": s.windows(s.actions, ends),           # (B, n, A)
            "mask": torch.from_numpy(mask),                  # (B, n) bool
            "timestep": torch.from_numpy(timestep),          # (B, n) long
            "episode_index": torch.from_numpy(s.episodes[s.step_episode[ends]]),  # (B,)
        }
        if self.rtg is not None:
            batch["rtg"] = s.windows(self.rtg, ends)         # (B, n, 1)
        return batch

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """A uniformly random batch of windows (with replacement), from this rank's seeded stream."""
        return self.batch_at(self._rng.integers(0, self.num_windows, size=whole(batch_size, "sample: batch_size")))

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    def epoch(self, batch_size: int, drop_last: bool = False) -> Iterator[dict[str, torch.Tensor]]:
        """One shuffled pass over this rank's shard of the window ends.

        All ranks draw the same permutation (seed, epoch) and take disjoint strided shards of equal
        size (the remainder of num_windows / world_size is dropped), so DDP ranks step in lockstep.
        """
        batch_size = count(batch_size, "epoch: batch_size")
        perm = numpy_rng(self.seed, f"window_epoch/{self._epoch}").permutation(self.num_windows)
        self._epoch += 1
        usable = (self.num_windows // self.world_size) * self.world_size
        shard = perm[:usable][self.rank::self.world_size]
        stop = len(shard) - (len(shard) % batch_size if drop_last else 0)
        for i in range(0, stop, int(batch_size)):
            yield self.batch_at(shard[i:i + batch_size])


def _stats(moments: tuple[np.ndarray, np.ndarray], std_floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    mean, std = moments
    return (torch.from_numpy(mean.astype(np.float32)),
            torch.from_numpy(np.maximum(std, std_floor).astype(np.float32)))


REWARD_MODES = ("sparse", "dense")


class TransitionSampler(_LayoutSampler):
    """(context window, action, reward, next window) transitions for Q-learning (GeRM).

    ``reward="sparse"``: 1 at the last step of a successful episode, else 0 (GeRM / Q-Transformer);
    ``"dense"``: the stored ``rewards`` feature. ``n_step`` > 1 sums ``gamma^k r_{t+k}`` over the next
    n steps (cut at the episode end) and ``next_obs`` ends at ``t + n_step``; ``discount`` is
    ``gamma^m`` for the m steps summed, the factor to bootstrap with. ``last`` marks transitions whose
    next step is not stored (the episode ended): ``next_obs`` is zeros there, and ``done`` is 1 only if
    the episode terminated (a fall), not on a time-out.
    """

    def __init__(self, source: Any, layout: ObsLayout | str, context: int, gamma: float = 0.98,
                 reward: str = "sparse", success_only: bool = False, success_ratio: float | None = None,
                 n_step: int = 1, seed: int = 0, split: str = "train", val_fraction: float = 0.1,
                 filters: Mapping[str, Any] | None = None, rank: int = 0, world_size: int = 1,
                 action_feature: str = "actions"):
        who = "TransitionSampler"
        layout = as_layout(layout, who)
        _check_context(context, who)
        _check_rank(rank, world_size, who)
        if reward not in REWARD_MODES:
            raise ValueError(f"{who}: reward={reward!r}; allowed: {REWARD_MODES}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"{who}: gamma={gamma}; must be in (0, 1]")
        count(n_step, f"{who}: n_step")
        if success_ratio is not None and not 0.0 <= success_ratio <= 1.0:
            raise ValueError(f"{who}: success_ratio={success_ratio}; must be in [0, 1] or None")
        needed = list(layout.term_names) + [action_feature] + (["rewards"] if reward == "dense" else [])
        source_features = needed + ["terminated"]
        data = _source(source, source_features)
        data.require(needed, who)
        _check_widths(data, layout, action_feature, who, catalogue_actions=False)
        if "success" not in data.episode_info:
            raise ValueError(f"{who}: episode_info needs a 'success' column; have {sorted(data.episode_info)}")
        filters = dict(filters or {})
        if success_only:
            filters["success_only"] = True
        self.layout, self.context, self.gamma, self.n_step = layout, int(context), float(gamma), int(n_step)
        self.reward_mode = reward
        self.action_feature, self._episode_ids = action_feature, data.episode_info.get("episode_id")
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        steps = _select_steps(data, select_episodes(data, split, val_fraction, seed, filters, who),
                              layout, action_feature, self.context)
        self.steps = steps
        self.ep_success = data.episode_info["success"][steps.episodes].astype(bool)        # (E_sel,)
        self.ep_terminal = _episode_terminal(data, steps.episodes, who)                    # (E_sel,)
        self.success_ratio = success_ratio
        if isinstance(data, ShardSource):   # per-step rewards, returns and pools computed per batch
            kind = "sparse" if reward == "sparse" else "rewards"
            self.step_reward = steps.per_step(data.reward(kind))
            self.mc_return = steps.per_step(data.returns(kind, self.gamma))
            self._pools = tuple(StridedPool(steps.starts, steps.lengths, chosen, self.rank, self.world_size)
                                for chosen in (self.ep_success, ~self.ep_success))
            self._all = StridedPool(steps.starts, steps.lengths, np.ones(len(steps.episodes), bool), self.rank,
                                    self.world_size)
        else:
            self._table_steps(data, steps, reward)
        if len(self._all) == 0:
            raise ValueError(f"{who}: rank {rank} of {world_size} has no transitions ({steps.num_steps} selected "
                             f"steps in all); use fewer ranks or more data")
        check_success_pools(who, success_ratio, (self._pools[0].size, self._pools[1].size))
        self._rng = numpy_rng(self.seed, f"transition_sampler/rank{self.rank}")

    def _table_steps(self, data: EpisodeArrays, steps: _SelectedSteps, reward: str) -> None:
        """The RAM path: per-step rewards, returns and this rank's pools tabled for the selection."""
        ends = steps.starts + steps.lengths
        if reward == "sparse":
            r = np.zeros(steps.num_steps, dtype=np.float64)
            r[ends[self.ep_success] - 1] = 1.0
        else:
            r = np.asarray(data.features["rewards"], dtype=np.float64).reshape(-1)[steps.source_index]
        self.step_reward = r                                                               # (T,)
        self.mc_return = discounted_returns(r, ends, self.gamma)                           # (T,)
        step_success = self.ep_success[steps.step_episode]
        # this rank's pool of transition starts: a disjoint strided shard of the selected steps
        pool = np.arange(steps.num_steps, dtype=np.int64)[self.rank::self.world_size]
        self._pools = (pool[step_success[pool]], pool[~step_success[pool]])
        self._all = pool

    def __len__(self) -> int:
        return len(self._all)

    def _draw(self, batch_size: int) -> np.ndarray:
        if self.success_ratio is None:
            return self._all[self._rng.integers(0, len(self._all), size=batch_size)]
        n_succ = int(round(batch_size * self.success_ratio))
        succ, fail = self._pools
        parts = [succ[self._rng.integers(0, len(succ), size=n_succ)] if n_succ else succ[:0],
                 fail[self._rng.integers(0, len(fail), size=batch_size - n_succ)] if batch_size - n_succ
                 else fail[:0]]
        return self._rng.permutation(np.concatenate(parts))

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        return self.batch_at(self._draw(whole(batch_size, "sample: batch_size")))

    def batch_at(self, t: np.ndarray) -> dict[str, torch.Tensor]:
        """Transitions starting at these compact step indices."""
        s = self.steps
        t = np.asarray(t, dtype=np.int64)
        local = s.timestep[t]
        length = s.lengths[s.step_episode[t]]
        m = np.minimum(self.n_step, length - local)                       # (B,) steps summed
        k = np.arange(self.n_step, dtype=np.int64)[None, :]
        valid = k < m[:, None]                                            # (B, n_step)
        r_idx = np.where(valid, t[:, None] + k, 0)
        reward = (np.where(valid, self.step_reward[r_idx], 0.0) * self.gamma ** k).sum(axis=1)
        has_next = local + self.n_step < length
        nxt = np.where(has_next, t + self.n_step, t)
        mask, _ = s.mask_timestep(t)
        next_mask, _ = s.mask_timestep(nxt)
        ep = s.step_episode[t]
        return {
            "obs": s.windows(s.obs, t),                                   # (B, n, D)
            "mask": torch.from_numpy(mask),                               # (B, n)
            "action": s.rows(s.actions, t),                               # (B, A)
            "reward": torch.from_numpy(reward.astype(np.float32)),        # (B,)
            "next_obs": s.windows(s.obs, nxt, valid=has_next),            # (B, n, D), zeros if none
            "next_mask": torch.from_numpy(next_mask & has_next[:, None]), # (B, n)
            "done": torch.from_numpy((~has_next & self.ep_terminal[ep]).astype(np.float32)),  # (B,)
            "last": torch.from_numpy(~has_next),                          # (B,) bool
            "discount": torch.from_numpy((self.gamma ** m).astype(np.float32)),  # (B,)
            "mc_return": torch.from_numpy(self.mc_return[t].astype(np.float32)),  # (B,)
            "success": torch.from_numpy(self.ep_success[ep].astype(np.float32)),  # (B,)
            "episode_index": torch.from_numpy(s.episodes[ep]),            # (B,) into the source table
            "t": torch.from_numpy(local),                                 # (B,) step within the episode
        }


def _episode_terminal(data: Any, episodes: np.ndarray, who: str) -> np.ndarray:
    """Whether each episode ended in a termination (fall, collision), not a time-out."""
    if isinstance(data, ShardSource) and "terminated" in data.features:
        return data.feature("terminated").take(data.episode_ends[episodes] - 1).reshape(-1).astype(bool)
    if "terminated" in data.features:
        flags = np.asarray(data.features["terminated"]).reshape(-1)
        return flags[data.episode_ends[episodes] - 1].astype(bool)
    if "terminated" in data.episode_info:
        return data.episode_info["terminated"][episodes].astype(bool)
    raise ValueError(f"{who}: need a per-step 'terminated' feature or an episode_info 'terminated' column")
