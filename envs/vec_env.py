"""``LeggedEnv``: N quadrupeds on one terrain behind rsl_rl 5.x's ``VecEnv`` interface.

Per step: clip the policy action, apply per-env latency, turn it into joint targets
(``q_default + action_scale * a``), step the backend, let the task score and terminate, reset the done
envs in place (auto-reset: the returned observation of a done env is its next episode's first), push,
and build the observation groups ``policy`` (noisy) and ``critic`` (privileged, clean). All per-env work
is batched torch over N.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from rsl_rl.env import VecEnv
from tensordict import TensorDict

from quadforge.envs.backends import make_backend
from quadforge.envs.backends.base import PhysicsBackend
from quadforge.envs.rotations import yaw_from_quat
from quadforge.envs.config import EnvConfig
from quadforge.envs.fast_paths import cpu_arrays
from quadforge.envs.kinematics import LegKinematics
from quadforge.layout import NUM_FEET, NUM_JOINTS, get_layout
from quadforge.envs.observations import CompiledLayout, TermCache, ground_terms, make_term_fns, scan_points_b
from quadforge.envs.randomization import ActionLatency, Pushes
from quadforge.envs.robots import get_robot
from quadforge.envs.terrain import PIT_EDGED, PLATFORM_HALF, TERRAIN_TYPES
from quadforge.envs.step_log import PendingLog, match_table, named, read_logs
from quadforge.envs.tasks.locomotion import LocomotionTask
from quadforge.envs.tasks.terrain_levels import TerrainState
from quadforge.envs.terminations import TERMINATION_REASONS
from quadforge.envs.view_cache import ViewCache
from quadforge.seeding import torch_generator
from quadforge.tensors import row_ids, set_rows

_EPISODE_LONG = ("termination_reason", "length", "terrain_type", "terrain_level")
_EPISODE_FLOAT = ("return", "distance", "commanded_distance", "lin_vel_error", "lin_vel_x_error", "ang_vel_error")
EPISODE_KEYS = _EPISODE_LONG + _EPISODE_FLOAT


def spawn_footprint(robot, device) -> torch.Tensor:
    """(P, 2) xy offsets from the base (spawn yaw is zero) where a foot may stand at reset.

    A 0.05 m grid (half a heightfield cell: a vertex peak between samples is missed by millimetres)
    over the hips' rectangle widened by a calf length, since the random initial joint poses
    (``init.joint_pos_scale``) swing feet well away from under the hips."""
    hips = torch.as_tensor(robot.hip_offsets, dtype=torch.float32)[:, :2]         # (4, 2)
    reach = float(robot.calf_length)
    lo, hi = hips.amin(0) - reach, hips.amax(0) + reach
    xs = torch.arange(float(lo[0]), float(hi[0]) + 1e-6, 0.05)
    ys = torch.arange(float(lo[1]), float(hi[1]) + 1e-6, 0.05)
    return torch.stack(torch.meshgrid(xs, ys, indexing="ij"), -1).reshape(-1, 2).to(device)


def spawn_half_widths(spawn_xy: float, footprint: torch.Tensor, horizontal_scale: float | None,
                      device) -> torch.Tensor:
    """(types,) the spawn offset's half-width per ``TERRAIN_TYPES`` entry: ``spawn_xy`` (legged_gym's
    +-1 m), except on ``PIT_EDGED`` types, where the footprint (its farthest point from the base) stays a
    heightfield cell inside the platform."""
    widths = torch.full((len(TERRAIN_TYPES),), float(spawn_xy))
    if horizontal_scale is not None:
        inside = PLATFORM_HALF - horizontal_scale - float(footprint.abs().amax())
        for name in PIT_EDGED:
            widths[TERRAIN_TYPES.index(name)] = min(float(spawn_xy), max(inside, 0.0))
    return widths.to(device)


def spawn_clearance(robot, spawn_height: float) -> float:
    """The margin (m) the nominal spawn leaves under the nominal pose's lowest foot sphere over flat
    ground: base at ``nominal_base_height + spawn_height``. ``nominal_base_height`` is the mean over
    legs, so the deepest leg of the default pose clears a few mm less than ``spawn_height``; a drawn
    pose is held to this margin so that poses no deeper than the default keep the nominal height."""
    feet = LegKinematics(robot, "cpu", torch.float64).forward(torch.tensor(robot.default_joint_pos, dtype=torch.float64))
    return float(robot.nominal_base_height + spawn_height + feet[:, 2].min() - robot.foot_radius)


def check_default_dtype() -> None:
    """The env's buffers and random draws use torch's default dtype beside the backend's float32 state:
    under another default (``torch.set_default_dtype(torch.float64)``) they would mix dtypes and fail
    part-way through a reset, or return float64 observations. Refused up front instead."""
    if torch.get_default_dtype() != torch.float32:
        raise ValueError(f"torch's default dtype is {torch.get_default_dtype()}; quadforge's envs compute in "
                         f"float32: call torch.set_default_dtype(torch.float32) before building or stepping one")


def _nan_rows(actions: torch.Tensor) -> torch.Tensor | None:
    """(N,) bool: the envs whose action holds a NaN (clamping keeps NaN; MuJoCo would zero the whole
    control and every reward term reading the action would turn NaN); None when none does. On the CPU
    one numpy check; on a GPU the mask itself (reading it back would wait for the device)."""
    arrays = cpu_arrays(actions)
    if arrays is not None and not np.isnan(arrays[0]).any():
        return None
    return torch.isnan(actions).any(dim=1)


class LeggedEnv(VecEnv):
    """The locomotion env; ``backend`` overrides the one ``cfg.backend_name`` would build."""

    def __init__(self, cfg: EnvConfig, backend: PhysicsBackend | None = None):
        check_default_dtype()
        self.cfg = cfg.validate()
        self.robot = get_robot(cfg.backend.robot)
        self.backend = backend if backend is not None else make_backend(cfg.backend_name, cfg.backend_config())
        self.device = torch.device(self.backend.device)
        if cfg.torch_threads is not None and torch.device(self.device).type == "cpu" \
                and torch.get_num_threads() != cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)  # process-wide; see EnvConfig.torch_threads
        self.num_envs = cfg.num_envs
        self.num_actions = NUM_JOINTS
        self._action_shape = torch.Size((self.num_envs, NUM_JOINTS))
        self.dt = self.backend.sim_dt * self.backend.decimation
        self.max_episode_length = int(round(cfg.episode_length_s / self.dt))
        gen = lambda name: torch_generator(cfg.seed, f"env/{name}", self.device)  # noqa: E731
        self._reset_gen, self._noise_gen = gen("reset"), gen("noise")

        n, dev = self.num_envs, self.device
        self.terrain = TerrainState(cfg, n, torch_generator(cfg.seed, "env/terrain"), dev)
        self.terrain_types = self.terrain.types
        body_names = tuple(self.backend.state.body_names)
        self.task = self._make_task(cfg, body_names, gen("commands"))
        if cfg.compile_task:
            self.task.compile_score()
        self.pushes = Pushes(cfg.randomization, self.dt, gen("push"))
        # extras["pushed"]: all envs are pushed together; a copy of one of these two columns each step, so
        # that a caller writing into last step's extras changes nothing later steps report
        self._pushed_flags = (torch.zeros(self.num_envs, dtype=torch.bool, device=self.device),
                              torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        self.latency = ActionLatency(cfg.randomization, n, gen("latency"), dev)

        self.default_joint_pos = torch.tensor(self.robot.default_joint_pos, device=dev)
        self.action_scale = float(self.robot.action_scale)
        self.clip_actions = cfg.observations.clip_actions
        self.actions = torch.zeros(n, NUM_JOINTS, device=dev)        # a_t (policy output, clipped)
        self.last_actions = torch.zeros(n, NUM_JOINTS, device=dev)   # a_{t-1}
        self.joint_targets = self.default_joint_pos.expand(n, -1).clone()
        self._last_joint_vel = torch.zeros(n, NUM_JOINTS, device=dev)  # q̇ before the step, for dof_acc
        # made by _during_physics while the backend simulates, read after it in step()
        self._time_out = torch.zeros(n, dtype=torch.bool, device=dev)
        self._episode: dict[str, torch.Tensor] = {}
        self._noise: torch.Tensor | None = None
        # base height over a plane at z = 0: the base z itself, the base_height term's values uncomputed
        self._plane_base_height = ViewCache(lambda root_pos_w: root_pos_w[:, 2])
        self.episode_length_buf = torch.zeros(n, dtype=torch.long, device=dev)
        self.common_step_counter = 0

        obs_cfg = cfg.observations
        self.policy_layout = get_layout(obs_cfg.policy_layout)
        self.critic_layout = get_layout(obs_cfg.critic_layout)
        noise = dict(obs_cfg.noise) if obs_cfg.add_noise else {}
        self._policy_obs = CompiledLayout(self.policy_layout, noise, obs_cfg.noise_level, dev)
        self._critic_obs = CompiledLayout(self.critic_layout, device=dev)
        self._scan_points = scan_points_b(dev)
        self._spawn_footprint = spawn_footprint(self.robot, dev)
        self._spawn_half = spawn_half_widths(cfg.init.spawn_xy, self._spawn_footprint,
                                             cfg.terrain.horizontal_scale if cfg.terrain is not None else None, dev)
        self._leg_kin = LegKinematics(self.robot, dev)
        self._spawn_clearance = spawn_clearance(self.robot, cfg.init.spawn_height)
        self._term_fns = make_term_fns(self._scan_points)
        # On a terrain whose scan an observation group reads, the step's base-height lookup also takes
        # the scan (one terrain lookup); without resets or pushes the observation reuses it.
        self._joint_ground = not self.terrain.flat and any(
            t.name == "height_scan" for layout in (self.policy_layout, self.critic_layout) for t in layout.terms)
        self._terms: TermCache | None = None
        self._terms_full: dict[str, torch.Tensor] | None = None
        self.extras: dict[str, Any] = {"log": {}}

        self._reset_envs(torch.arange(n, device=dev))
        self._obs = self._compute_obs()

    def _make_task(self, cfg: EnvConfig, body_names: tuple[str, ...], gen: torch.Generator) -> LocomotionTask:
        """The task scoring and ending episodes; a subclass (``envs.quard.env.QuardEnv``) returns its own."""
        return LocomotionTask(cfg, self.robot, body_names, self.dt, gen, self.device)

    # --- rsl_rl VecEnv --------------------------------------------------------------------------------
    def get_observations(self) -> TensorDict:
        return self._obs

    def reset(self) -> tuple[TensorDict, dict]:
        check_default_dtype()
        self._restart(torch.arange(self.num_envs, device=self.device))
        return self._obs, self.extras

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        if not isinstance(actions, torch.Tensor):   # a numpy array or a list
            actions = torch.as_tensor(actions)
        check_default_dtype()
        if actions.shape != self._action_shape:     # before anything moves: torch would broadcast (1, 12)
            raise ValueError(f"step: actions must have shape ({self.num_envs}, {self.num_actions}), "
                             f"got {tuple(actions.shape)}")
        if actions.dtype != torch.float32 or actions.device != self.device:
            actions = actions.to(self.device, torch.float32)
        # detached: a policy's graph would otherwise live on in self.actions (the last_action term), step
        # after step
        a = actions.detach().clamp(-self.clip_actions, self.clip_actions)
        nan_rows = _nan_rows(a)
        if nan_rows is not None:   # a broken policy: its envs hold the default pose and end as non_finite
            a = torch.where(nan_rows[:, None], 0.0, a)
        applied = self.latency.apply(a, self.actions)
        self.joint_targets = self.default_joint_pos + self.action_scale * applied
        self._noise = None
        non_finite = self.backend.step(self.joint_targets, during=self._during_physics)
        if non_finite.device != self.device:
            non_finite = non_finite.to(self.device)
        if nan_rows is not None:
            non_finite = non_finite | nan_rows
        self.last_actions, self.actions = self.actions, a  # clamp made a fresh tensor

        state = self.backend.state
        ground = None
        if self._joint_ground:
            # the scan needs the base yaw; the heading steering in post_step reuses it
            terms = self._new_terms(yaw=yaw_from_quat(state.root_quat_w))
            ground = ground_terms(terms.view, self._scan_points)
            terms = self._terms = TermCache(self._term_fns, terms.view, ground)
        else:
            terms = self._new_terms()
        base_height = self._plane_base_height(state.root_pos_w) if self.terrain.flat else terms["base_height"][:, 0]
        res = self.task.post_step(terms.view, base_height, self._last_joint_vel, non_finite, self._time_out)
        episode = self._episode
        log: dict[str, float] = {}
        done_ids = torch.nonzero(res.dones, as_tuple=True)[0]
        if done_ids.numel():
            info = self.task.episode_info(done_ids, res.reason, state.root_pos_w)
            info["terrain_type"] = self.terrain.type_idx[done_ids].clone()
            info["terrain_level"] = self.terrain.levels[done_ids].clone()
            for k, v in info.items():
                episode[k][done_ids] = v.to(episode[k].device, episode[k].dtype)
            pending = self._episode_log(done_ids, info)
            if self.cfg.curriculum:
                asked = self.task.asked_distance(done_ids, info["commanded_distance"], self.max_episode_length)
                self.terrain.update_curriculum(done_ids, info["distance"], asked)
            applied_targets = self.joint_targets[done_ids].clone()
            self._reset_envs(done_ids)
            # the contract: joint_targets are the targets applied at this step, done envs included
            self.joint_targets[done_ids] = applied_targets
            terrain_log = self.terrain.pending_log()   # the levels after this step's curriculum update
            log = read_logs(pending + ([terrain_log] if terrain_log is not None else []))
        pushed = self.pushes.maybe_push(self.backend, self.common_step_counter)

        # Without resets the robots stand where the task just scored them: the observation reuses the
        # ground terms (unless a push refreshed the state) and the yaw the heading steering computed.
        if done_ids.numel() == 0:
            self._obs = self._compute_obs(yaw=self.task.yaw, known=None if pushed else ground, noise=self._noise)
        else:
            self._obs = self._compute_obs(noise=self._noise)
        # the push comes after this step's reward and before the next observation: who recomputes a reward from
        # stored observations needs to know which steps it came between (stored per step as `pushed`)
        self.extras = {"time_outs": res.time_outs, "log": log, "episode_end": episode,
                       "pushed": self._pushed_flags[int(pushed)].clone()}
        return self._obs, res.rewards, res.dones, self.extras

    # --- contract extras -------------------------------------------------------------------------------
    @property
    def terms(self) -> dict[str, torch.Tensor]:
        """Every raw observation term of the current observation, (N, dim) each, unscaled, noise-free."""
        if self._terms_full is None:
            self._terms_full = self._terms.materialize()
        return self._terms_full

    @property
    def command_sampler(self) -> Callable | None:
        return self.task.commands.command_sampler

    @command_sampler.setter
    def command_sampler(self, fn: Callable | None) -> None:
        self.task.commands.command_sampler = fn

    @property
    def commands(self) -> torch.Tensor:
        return self.task.commands.commands

    def set_commands(self, env_ids: torch.Tensor, commands: torch.Tensor) -> None:
        """Fix (k, 15) commands for these envs (indices or an (N,) bool mask) until their episode ends;
        refreshes the observation."""
        env_ids = row_ids(env_ids, self.num_envs, self.device)
        # a copy: the caller may hand rows of env.commands itself, which the write would alias
        self.task.commands.set_commands(env_ids, torch.as_tensor(commands).clone())
        self._obs = self._compute_obs()

    def set_terrain_levels(self, env_ids: torch.Tensor, levels: torch.Tensor, cols: torch.Tensor | None = None) -> None:
        """Move these envs (indices or an (N,) bool mask) to the given (level, col) tiles and start new
        episodes there; refreshes the observation."""
        check_default_dtype()
        env_ids = row_ids(env_ids, self.num_envs, self.device)   # checked before anything moves
        self.terrain.set_levels(env_ids, levels, cols)
        self._restart(env_ids)

    def reset_envs(self, env_ids: torch.Tensor) -> None:
        """Start new episodes in these envs (indices or an (N,) bool mask): spawn at their tile, fresh
        commands and gait clock; refreshes the observation (``get_observations``, ``terms``)."""
        check_default_dtype()
        self._restart(row_ids(env_ids, self.num_envs, self.device))

    def _restart(self, env_ids: torch.Tensor) -> None:
        """What every reset outside ``step`` does (``reset``, ``reset_envs``, ``set_terrain_levels``): new
        episodes in these valid ids, then the observation that shows them (a task env with a camera
        renders them here too, ``QuardEnv``)."""
        self._reset_envs(env_ids)
        self._obs = self._compute_obs()

    def _reset_envs(self, env_ids: torch.Tensor) -> None:
        """``reset_envs`` for valid (k,) int64 ids on the env's device, leaving the observation to the
        caller (a step builds it once after its resets)."""
        k = env_ids.numel()
        if k == 0:
            return
        g, dev, ic = self._reset_gen, self.device, self.cfg.init
        u = lambda *shape: torch.rand(*shape, generator=g, device=dev)  # noqa: E731
        pos = self.terrain.origins_of(env_ids).clone()
        if self.terrain.terrain is not None:  # legged_gym: anywhere on the tile's central platform
            pos[:, :2] += (2 * u(k, 2) - 1) * self._spawn_half[self.terrain.type_idx[env_ids]][:, None]
        quat = torch.zeros(k, 4, device=dev)
        quat[:, 0] = 1.0
        lin_vel = (2 * u(k, 3) - 1) * ic.root_vel
        ang_vel = (2 * u(k, 3) - 1) * ic.root_vel
        lo, hi = ic.joint_pos_scale
        q = self.default_joint_pos * (lo + (hi - lo) * u(k, NUM_JOINTS))
        feet = self._leg_kin.forward(q)             # (k, 4, 3) base frame = world offsets (level, yaw 0)
        # One terrain lookup (on a GPU each is ~30 kernel launches) for the ground under the spawn
        # footprint and under the drawn pose's feet: both need only the spawn's x, y.
        if self.terrain.flat:
            ground = self.backend.terrain_height(pos[:, None, :2] + feet[..., :2])            # (k, 4)
        else:
            pts = torch.cat([self._spawn_footprint.expand(k, -1, -1), feet[..., :2]], dim=1)
            heights = self.backend.terrain_height(pos[:, None, :2] + pts)                    # (k, P + 4)
            ground = heights[:, -NUM_FEET:]
            # over the highest ground under the feet, not under the base point: on rough terrain a bump
            # under a foot would otherwise spawn it inside the heightfield, pinched for the whole episode
            pos[:, 2] = heights[:, :-NUM_FEET].amax(dim=-1)
        pos[:, 2] += self.robot.nominal_base_height + ic.spawn_height
        # The drawn pose reaches up to ~10 cm deeper than the nominal one: its feet would start inside
        # the ground (pinched between heightfield prisms on terrain, kicked out of a plane). Lift such an
        # env until its lowest foot sphere clears the ground under it by the nominal pose's margin; an env
        # whose pose reaches no deeper keeps the nominal height exactly (max, not a recomputation).
        needed = (ground - feet[..., 2]).amax(dim=-1) + (self.robot.foot_radius + self._spawn_clearance)
        pos[:, 2] = torch.maximum(pos[:, 2], needed)
        self.backend.reset(env_ids, pos, quat, lin_vel, ang_vel, q, torch.zeros(k, NUM_JOINTS, device=dev))

        self.task.reset(env_ids, pos, quat)
        self.latency.reset(env_ids)
        # step() replaces these three each step (no copies): made under rsl_rl's torch.inference_mode
        self.actions = set_rows(self.actions, env_ids, 0.0)
        self.last_actions = set_rows(self.last_actions, env_ids, 0.0)
        self.joint_targets = set_rows(self.joint_targets, env_ids, self.default_joint_pos)
        self.episode_length_buf[env_ids] = 0

    def close(self) -> None:
        self.backend.close()

    # --- internals ------------------------------------------------------------------------------------
    def _new_terms(self, yaw: torch.Tensor | None = None, known: dict[str, torch.Tensor] | None = None) -> TermCache:
        view = self.task.view(self.backend.state, self.actions, self.last_actions, self.backend.env_params,
                              self.backend.terrain_height, self.terrain.flat, yaw)
        self._terms = TermCache(self._term_fns, view, known)
        self._terms_full = None
        return self._terms

    def _during_physics(self) -> None:
        """The step's work that needs no physics result, done while the backend simulates (on two
        threads its cost is shared with the physics instead of added to it). Same order of random draws
        as doing it afterwards: the observation noise is this step's only draw from its generator."""
        self._last_joint_vel.copy_(self.backend.state.joint_vel)  # still q̇ before the step
        self.episode_length_buf += 1
        self.common_step_counter += 1
        self._time_out = self.episode_length_buf >= self.max_episode_length
        self.task.before_physics()
        # fresh (N,) columns every step: a consumer may keep last step's extras
        n = self.num_envs
        long_keys = _EPISODE_LONG + tuple(getattr(self.task, "extra_episode_long", ()))
        float_keys = _EPISODE_FLOAT + tuple(getattr(self.task, "extra_episode_float", ()))
        episode = dict(zip(long_keys, torch.zeros(len(long_keys), n, dtype=torch.long, device=self.device).unbind(0)))
        episode.update(zip(float_keys, torch.zeros(len(float_keys), n, device=self.device).unbind(0)))
        self._episode = episode
        self._noise = self._policy_obs.draw_noise(n, self._noise_gen)

    def _compute_obs(self, yaw: torch.Tensor | None = None, known: dict[str, torch.Tensor] | None = None,
                     noise: torch.Tensor | None = None) -> TensorDict:
        terms = self._new_terms(yaw, known)
        return TensorDict({"policy": self._policy_obs.build(terms, self._noise_gen, noise),
                           "critic": self._critic_obs.build(terms)}, batch_size=[self.num_envs], device=self.device)

    def _episode_log(self, done_ids: torch.Tensor, info: dict[str, torch.Tensor]) -> list[PendingLog]:
        """The ending episodes' log entries, still on the device (``envs.step_log``: read with the rest of
        the step's log in one host read)."""
        keys = ("length", "return", "distance", "lin_vel_error", "ang_vel_error")
        means = torch.stack([info[k].to(torch.float32).mean() for k in keys])
        reasons = match_table(info["termination_reason"], len(TERMINATION_REASONS)).sum(dim=0)[1:] / done_ids.numel()
        return [self.task.rewards.pop_episode(done_ids, self.cfg.episode_length_s),
                named([f"Episode/{k}" for k in keys], means),
                named([f"Episode_Termination/{name}" for name in TERMINATION_REASONS[1:]], reasons)]

