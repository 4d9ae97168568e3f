"""``QuardEnv``: the QUARD vision-language tasks on ``LeggedEnv`` (seed 003 Table I).

N robots, each in its own world with one compiled scene holding the whole object library
(``envs.quard.objects``); every episode draws a family (``quard:all``) and a scene
(``envs.quard.families``) from a stream seeded per env and episode, places its objects, and the rules
of ``envs.quard.rules`` end it: success, wrong target, obstacle collision, missed ball, timeout - or the
env's own fall / base collision / non-finite terminations. Beyond the locomotion env's terms it emits

- ``images/front_rgb`` (N, H, W, 3) uint8 and, with ``camera.depth``, ``images/front_depth`` (N, H, W)
  float32 m: rendered when an env's step count in its episode is a multiple of ``image_every`` (10:
  5 Hz at 50 Hz control; 0 = the episode's first observation) and held in between;
- ``instruction`` (N,) int64: index into ``env.instruction_table`` (every instruction of the task);
- privileged ``task_*`` terms (``envs.layout.TERM_DIMS``): base pose, target, distractor, obstacle,
  named tunnel, family / speed / gait codes.

``extras["episode_end"]`` adds ``quard_outcome`` (code into ``envs.quard.rules.OUTCOMES``), ``quard_family``,
``obstacle_contacts`` (steps touching the obstacle), ``time_to_success`` (s, -1 without success) and
``path_length`` (m of base travel); ``env.episode_task_info(i)`` gives a finished episode's JSON-able
task parameters (family, instruction, target, distractor, slots, speed and gait words, ball speed,
seed). The reward is sparse: 1 at the step that succeeds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from quadforge.typed_values import check_field_types
from quadforge.envs.backends import make_backend, require_capabilities
from quadforge.envs.commands import yaw_from_quat
from quadforge.envs.config import CommandsConfig, EnvConfig, InitConfig, RandomizationConfig
from quadforge.envs.quard.camera import CameraConfig
from quadforge.envs.quard.families import EpisodeScene, family_code, get_family, sample_episode, swap_instruction
from quadforge.envs.quard.instructions import (GAIT_WORDS, HELD_OUT_COLOURS, SPEEDS, TRAIN_COLOURS,
                                               instruction_table, task_families)
from quadforge.envs.quard.objects import NEUTRAL, PARK, RGB, ObjectLibrary
from quadforge.envs.quard.rules import OUTCOME_CODE, RuleState, inside_tunnel, judge
from quadforge.envs.tasks.locomotion import LocomotionTask, StepResult
from quadforge.envs.terminations import BASE_COLLISION, FALL, NON_FINITE, TASK_END, TIME_OUT
from quadforge.envs.vec_env import LeggedEnv
from quadforge.seeding import numpy_rng
from quadforge.tensors import from_host

# What a QUARD scene asks of its physics backend (envs.backends.CAPABILITIES); "cameras" too with images.
QUARD_CAPABILITIES = ("scene_addon", "set_mocap", "sensor_columns")
COLOUR_SETS = {"train": TRAIN_COLOURS, "held_out": HELD_OUT_COLOURS, "all": TRAIN_COLOURS + HELD_OUT_COLOURS}
OBSTACLE_CONTACT_FORCE = 1e-6   # N: any contact force on the obstacle (only the robot can touch it)


def quard_env_config(robot: str = "go1", num_envs: int = 16, seed: int = 0, terrain: Any | None = None) -> EnvConfig:
    """The locomotion settings under a QUARD task: flat (or ``terrain``), nominal physics, no pushes, a
    calm start (joints 0.9-1.1 x default, root velocities +-0.1), commands left to the high level (the
    env's own velocity commands are zero, the default trot fills the rest), 20 s episodes, no curriculum."""
    zero = {"lin_vel_x": (0.0, 0.0), "lin_vel_y": (0.0, 0.0), "ang_vel_yaw": (0.0, 0.0)}
    commands = CommandsConfig(heading_command=False, resample=False, ranges={**CommandsConfig().ranges, **zero})
    cls = EnvConfig.flat if terrain is None else EnvConfig.rough
    kw = {} if terrain is None else {"terrain": terrain}
    return cls(robot=robot, num_envs=num_envs, seed=seed, commands=commands, randomization=RandomizationConfig.off(),
               init=InitConfig(joint_pos_scale=(0.9, 1.1), root_vel=0.1, spawn_xy=0.0), episode_length_s=20.0,
               curriculum=False, **kw)


@dataclass
class QuardConfig:
    task: str = "quard:all"           # quard:<family> or quard:all (a family drawn per episode)
    env: EnvConfig = field(default_factory=quard_env_config)
    colours: str = "train"            # "train" (blue, green, red, yellow), "held_out" (gold, orange, pink, purple), "all"
    images: bool = True
    camera: CameraConfig = field(default_factory=CameraConfig)
    image_every: int = 10             # control steps between frames: 5 Hz at the 50 Hz control rate
    # every scene as drawn, its instruction naming the other object (families.swap_instruction): the
    # instruction-following measurement (`quadforge eval --instructions swapped`)
    swap_instruction: bool = False

    @classmethod
    def make(cls, task: str = "quard:all", robot: str = "go1", num_envs: int = 16, seed: int = 0,
             terrain: Any | None = None, backend: str = "mujoco_cpu", **kw: Any) -> "QuardConfig":
        env = quard_env_config(robot, num_envs, seed, terrain)
        env.backend_name = backend      # any registered backend with QUARD_CAPABILITIES
        return cls(task=task, env=env, **kw)

    @property
    def families(self) -> tuple[str, ...]:
        return task_families(self.task)

    def validate(self) -> "QuardConfig":
        check_field_types(self, "QuardConfig.")
        task_families(self.task)
        if self.colours not in COLOUR_SETS:
            raise ValueError(f"QuardConfig.colours={self.colours!r}; allowed: {', '.join(COLOUR_SETS)}")
        if not isinstance(self.image_every, int) or self.image_every < 1:
            raise ValueError(f"QuardConfig.image_every={self.image_every!r}; allowed: an integer >= 1 (control steps)")
        self.camera.validate()
        longest = max(get_family(f).time_limit_s for f in self.families)
        if self.env.episode_length_s < longest:
            raise ValueError(f"QuardConfig.env.episode_length_s={self.env.episode_length_s}; the families "
                             f"{self.families} need >= {longest} s")
        return self


def _yaw_quat(yaw: float) -> np.ndarray:
    return np.array([math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])


class QuardScenes:
    """Per-env episode state: the scene's placements, colours, targets and the rule bookkeeping."""

    def __init__(self, qcfg: QuardConfig, library: ObjectLibrary, num_envs: int, seed: int, dt: float):
        self.qcfg, self.library, self.n, self.seed, self.dt = qcfg, library, num_envs, seed, dt
        self.families = qcfg.families
        self.colours = COLOUR_SETS[qcfg.colours]
        self.table = instruction_table(self.families)
        self._table_index = {text: i for i, text in enumerate(self.table)}
        n, m = num_envs, library.num_mocap
        self.episode_count = np.zeros(n, dtype=np.int64)
        self.params: list[dict[str, Any]] = [{} for _ in range(n)]
        self.finished: list[dict[str, Any]] = [{} for _ in range(n)]
        self.origin = np.zeros((n, 3))
        self.mocap_pos = np.tile(PARK, (n, m, 1))
        self.mocap_quat = np.tile([1.0, 0.0, 0.0, 0.0], (n, m, 1))
        # per-env colours of every object geom (textured letter boxes stay white so the texture shows)
        self.colour_geoms = np.concatenate([inst.geom_ids for inst in library.instances])
        self._geom_slices = []
        start = 0
        for inst in library.instances:
            self._geom_slices.append(slice(start, start + len(inst.geoms)))
            start += len(inst.geoms)
        self.default_rgba = np.concatenate([self._rgba(inst, None) for inst in library.instances])
        self.rgba = np.tile(self.default_rgba, (n, 1, 1)).astype(np.float32)
        f2 = lambda: np.zeros((n, 2))  # noqa: E731
        self.family = np.zeros(n, dtype=np.int64)
        self.speed = np.zeros(n, dtype=np.int64)
        self.gait = np.zeros(n, dtype=np.int64)
        self.instruction = np.zeros(n, dtype=np.int64)
        self.target, self.target_vel, self.distractor, self.distractor_vel = f2(), f2(), f2(), f2()
        self.obstacle, self.tunnel_named, self.tunnel_other = f2(), f2(), f2()
        self.has_obstacle = np.zeros(n, dtype=bool)
        self.has_tunnels = np.zeros(n, dtype=bool)
        self.moving = np.full(n, -1, dtype=np.int64)        # mocap index of the rolling ball
        self.rolls_target = np.ones(n, dtype=bool)          # it is the target (a swapped stop: the distractor)
        self.through = np.zeros((n, 2), dtype=bool)         # named, other
        self.path_length = np.zeros(n)
        self.last_xy = f2()
        self.obstacle_contacts = np.zeros(n, dtype=np.int64)
        self.steps = np.zeros(n, dtype=np.int64)

    def _rgba(self, inst, colour: str | None) -> np.ndarray:
        rgb = np.array(RGB[colour] if colour is not None else NEUTRAL)
        out = np.ones((len(inst.geoms), 4))
        for k, (shade, textured) in enumerate(zip(inst.shades, inst.textured)):
            out[k, :3] = 1.0 if textured else np.clip(rgb * shade, 0, 1)
        return out

    def new_episodes(self, env_ids: np.ndarray, spawn: np.ndarray, ground_z: np.ndarray) -> None:
        """Draw and lay out the next episode of each env (``spawn`` (k, 3) its base spawn point)."""
        lib = self.library
        for row, i in enumerate(env_ids):
            i = int(i)
            if self.params[i]:
                self.finished[i] = self.params[i]
            k = int(self.episode_count[i])
            self.episode_count[i] += 1
            rng = numpy_rng(self.seed, f"quard/env{i}/episode{k}")
            family = self.families[int(rng.integers(len(self.families)))]
            scene: EpisodeScene = sample_episode(family, rng, self.colours)
            if self.qcfg.swap_instruction:
                scene = swap_instruction(scene)
            scene.params.update(seed=int(self.seed), env_id=i, episode=k, colour_set=self.qcfg.colours)
            self.params[i] = scene.params
            self.origin[i] = [spawn[row, 0], spawn[row, 1], ground_z[row]]
            self.mocap_pos[i] = PARK
            self.mocap_quat[i] = [1.0, 0.0, 0.0, 0.0]
            self.rgba[i] = self.default_rgba
            self.moving[i] = -1
            for p_idx, place in enumerate(scene.placements):
                inst_idx = lib.find(*place.instance)
                inst = lib.instances[inst_idx]
                self.mocap_pos[i, inst.mocap] = self.origin[i] + [place.pos[0], place.pos[1], 0.0]
                self.mocap_quat[i, inst.mocap] = _yaw_quat(place.yaw)
                self.rgba[i, self._geom_slices[inst_idx]] = self._rgba(inst, place.colour)
                if p_idx == scene.moving:
                    self.moving[i] = inst.mocap
            self.family[i] = family_code(family)
            self.speed[i] = SPEEDS.index(scene.params["speed"])
            self.gait[i] = GAIT_WORDS.index(scene.params["gait"])
            self.instruction[i] = self._table_index[scene.params["instruction"]]
            self.target[i], self.distractor[i] = scene.target, scene.distractor
            self.target_vel[i], self.distractor_vel[i] = scene.target_vel, scene.distractor_vel
            self.rolls_target[i] = any(scene.target_vel)
            self.has_obstacle[i] = scene.obstacle is not None
            self.obstacle[i] = scene.obstacle if scene.obstacle is not None else (0.0, 0.0)
            self.has_tunnels[i] = scene.tunnel_named is not None
            self.tunnel_named[i] = scene.tunnel_named if scene.tunnel_named is not None else (0.0, 0.0)
            self.tunnel_other[i] = scene.tunnel_other if scene.tunnel_other is not None else (0.0, 0.0)
        ids = np.asarray(env_ids, dtype=np.int64)
        self.through[ids] = False
        self.path_length[ids] = 0.0
        self.last_xy[ids] = spawn[:, :2] - self.origin[ids, :2]
        self.obstacle_contacts[ids] = 0
        self.steps[ids] = 0

    def advance_balls(self) -> np.ndarray:
        """Roll the moving balls one control step; returns the env ids that moved."""
        ids = np.flatnonzero(self.moving >= 0)
        if len(ids):
            self.target[ids] += self.target_vel[ids] * self.dt
            self.distractor[ids] += self.distractor_vel[ids] * self.dt
            on_target = self.rolls_target[ids, None]
            ball_xy = np.where(on_target, self.target[ids], self.distractor[ids])
            ball_vel = np.where(on_target, self.target_vel[ids], self.distractor_vel[ids])
            self.mocap_pos[ids, self.moving[ids], :2] = self.origin[ids, :2] + ball_xy
            # the ball turns as it rolls without slipping (seen as its shading moves): about the axis
            # z x v, by |v| dt / r, accumulated into its orientation; all rolling balls at once (a loop
            # per env would cost ~15 us each, and thousands of worlds roll balls on a GPU)
            speed = np.hypot(ball_vel[:, 0], ball_vel[:, 1])
            rolling = speed > 0
            if rolling.any():
                rows, v, speed = ids[rolling], ball_vel[rolling], speed[rolling]
                axis = np.stack([-v[:, 1], v[:, 0], np.zeros_like(speed)], axis=1) / speed[:, None]
                half = speed * self.dt / 0.2 / 2
                dq = np.concatenate([np.cos(half)[:, None], np.sin(half)[:, None] * axis], axis=1)
                cols = self.moving[rows]
                self.mocap_quat[rows, cols] = _quat_mul(dq, self.mocap_quat[rows, cols])
        return ids

    def rule_state(self, base_xy_w: np.ndarray, yaw: np.ndarray, obstacle_contact: np.ndarray) -> RuleState:
        rel = base_xy_w - self.origin[:, :2]
        self.path_length += np.linalg.norm(rel - self.last_xy, axis=1)
        self.last_xy = rel
        self.steps += 1
        if self.has_tunnels.any():
            self.through[:, 0] |= self.has_tunnels & inside_tunnel(rel, self.tunnel_named)
            self.through[:, 1] |= self.has_tunnels & inside_tunnel(rel, self.tunnel_other)
        contact = obstacle_contact & self.has_obstacle
        self.obstacle_contacts += contact
        return RuleState(family=self.family, base_xy=rel, yaw=yaw, target_xy=self.target, distractor_xy=self.distractor,
                         through_named=self.through[:, 0], through_other=self.through[:, 1],
                         obstacle_contact=contact, time_s=self.steps * self.dt)

    def task_terms(self, state, device) -> dict[str, torch.Tensor]:
        o = self.origin
        pos = state.root_pos_w
        yaw = yaw_from_quat(state.root_quat_w)
        z = o[:, 2:3]

        def w(rel: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
            out = np.concatenate([rel + o[:, :2], z], axis=1)
            return out if mask is None else np.where(mask[:, None], out, 0.0)

        vel = np.concatenate([self.target_vel, np.zeros((self.n, 1))], axis=1)
        entry = self.tunnel_named - [0.5, 0.0]
        info = np.stack([self.family, self.speed, self.gait, self.has_obstacle], axis=1)
        host = {"task_target_pos": w(self.target), "task_target_vel": vel, "task_distractor_pos": w(self.distractor),
                "task_obstacle_pos": w(self.obstacle, self.has_obstacle),
                "task_tunnel_entry": w(entry, self.has_tunnels), "task_info": info}
        # one float32 block, one copy to the device (not one per term: on a GPU each waited for the queue);
        # the terms are its column views
        block = from_host(torch.from_numpy(np.concatenate([a.astype(np.float32) for a in host.values()], axis=1)),
                          device)
        terms = dict(zip(host, block.split([a.shape[1] for a in host.values()], dim=1)))
        return {"task_base_pose": torch.cat([pos.to(torch.float32), yaw[:, None].to(torch.float32)], dim=1), **terms}


def _quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton products of (..., 4) wxyz quaternions, row by row."""
    w1, x1, y1, z1 = np.moveaxis(a, -1, 0)
    w2, x2, y2, z2 = np.moveaxis(b, -1, 0)
    return np.stack([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2], axis=-1)


class QuardTask(LocomotionTask):
    """The locomotion task's bookkeeping plus the QUARD rules, scene resets and task terms."""

    extra_episode_long = ("quard_outcome", "quard_family", "obstacle_contacts")
    extra_episode_float = ("time_to_success", "path_length")

    def __init__(self, cfg: EnvConfig, robot, body_names, dt, gen, device, scenes: QuardScenes, backend):
        super().__init__(cfg, robot, body_names, dt, gen, device)
        self.scenes, self.backend = scenes, backend
        self._obstacle_cols = backend.scene.addon_sensors[next(iter(backend.scene.addon_sensors))]
        self.outcome = np.zeros(cfg.num_envs, dtype=np.int64)
        self.success_time = np.full(cfg.num_envs, -1.0)

    def view(self, state, actions, last_actions, env_params, terrain_height, flat, yaw=None):
        v = super().view(state, actions, last_actions, env_params, terrain_height, flat, yaw)
        v.task_terms = self.scenes.task_terms(state, self.device)
        return v

    def reset(self, env_ids, root_pos_w, root_quat_w) -> None:
        super().reset(env_ids, root_pos_w, root_quat_w)
        ids = env_ids.detach().cpu().numpy()
        spawn = root_pos_w.detach().cpu().numpy().astype(np.float64)
        ground = self.backend.terrain_height(root_pos_w[:, :2]).detach().cpu().numpy().astype(np.float64)
        self.scenes.new_episodes(ids, spawn, ground)
        self.stand_on_ground(ids)
        self.backend.set_mocap(ids, self.scenes.mocap_pos[ids], self.scenes.mocap_quat[ids], forward=True)
        self.outcome[ids] = 0
        self.success_time[ids] = -1.0

    def stand_on_ground(self, env_ids: np.ndarray, mocap: np.ndarray | None = None) -> None:
        """Put the placed objects of these envs (all of them, or the one ``mocap`` index per env) on the
        terrain under their own centre, not at the spawn's height (on a slope that is ~0.3 m apart 3 m
        ahead); on flat ground nothing moves. Objects are not tilted to the slope."""
        pos = self.scenes.mocap_pos
        rows = np.asarray(env_ids, dtype=np.int64)
        cols = np.arange(pos.shape[1])[None, :] if mocap is None else np.asarray(mocap, dtype=np.int64)[:, None]
        sel = pos[rows[:, None], cols]                                  # (k, m | 1, 3)
        placed = sel[..., 2] > PARK[2] / 2                              # parked instances stay under the ground
        if placed.any():
            xy = torch.as_tensor(sel[placed][:, :2], dtype=torch.float32, device=self.device)
            sel[placed, 2] = self.backend.terrain_height(xy).detach().cpu().numpy().astype(np.float64)
            pos[rows[:, None], cols] = sel

    def post_step(self, view, base_height, last_joint_vel, non_finite, time_out) -> StepResult:
        res = super().post_step(view, base_height, last_joint_vel, non_finite, time_out)
        s = view.state
        force = self.backend.sensor_columns(self._obstacle_cols)
        contact = np.einsum("ni,ni->n", force, force) > OBSTACLE_CONTACT_FORCE ** 2
        yaw = (view.yaw if view.yaw is not None else yaw_from_quat(s.root_quat_w)).detach().cpu().numpy()
        rs = self.scenes.rule_state(s.root_pos_w[:, :2].detach().cpu().numpy().astype(np.float64), yaw, contact)
        task = judge(rs)
        reason = res.reason.detach().cpu().numpy()
        physics = {NON_FINITE: "non_finite", BASE_COLLISION: "base_collision", FALL: "fall"}
        outcome = task.copy()
        for code, name in physics.items():
            outcome = np.where(reason == code, OUTCOME_CODE[name], outcome)
        outcome = np.where((reason == TIME_OUT) & (outcome == 0), OUTCOME_CODE["timeout"], outcome)
        self.outcome = outcome
        succeeded = outcome == OUTCOME_CODE["success"]
        self.success_time = np.where(succeeded, rs.time_s, self.success_time)
        ended = outcome != 0
        family_timeout = (outcome == OUTCOME_CODE["timeout"]) & (reason == 0)
        new_reason = np.where(ended & (reason == 0), np.where(family_timeout, TIME_OUT, TASK_END), reason)
        dev = res.dones.device
        dones = torch.as_tensor(ended, device=dev) | res.dones
        time_outs = res.time_outs | torch.as_tensor(family_timeout, device=dev)
        rewards = torch.as_tensor(succeeded.astype(np.float32), device=dev)
        return StepResult(rewards=rewards, reason=torch.as_tensor(new_reason, device=dev), dones=dones,
                          time_outs=time_outs)

    def episode_info(self, env_ids, reason, root_pos_w) -> dict[str, torch.Tensor]:
        info = super().episode_info(env_ids, reason, root_pos_w)
        ids = env_ids.detach().cpu().numpy()
        sc = self.scenes
        dev = self.device   # the env's episode columns these fill live there (a GPU's, on Warp)
        info.update(quard_outcome=torch.as_tensor(self.outcome[ids], device=dev),
                    quard_family=torch.as_tensor(sc.family[ids], device=dev),
                    obstacle_contacts=torch.as_tensor(sc.obstacle_contacts[ids], device=dev),
                    time_to_success=torch.as_tensor(self.success_time[ids], dtype=torch.float32, device=dev),
                    path_length=torch.as_tensor(sc.path_length[ids], dtype=torch.float32, device=dev))
        return info


class QuardEnv(LeggedEnv):
    """``LeggedEnv`` running QUARD tasks (module doc); ``QuardEnv(QuardConfig.make("quard:go_to", num_envs=8))``."""

    def __init__(self, qcfg: QuardConfig, backend=None):
        self.qcfg = qcfg.validate()
        cfg = qcfg.env
        self.library = ObjectLibrary(camera_fovy=qcfg.camera.fovy, camera_pos=qcfg.camera.pos)
        # asked of the registry before anything is built: a backend lacking one fails in one line
        require_capabilities(cfg.backend_name, QUARD_CAPABILITIES + (("cameras",) if qcfg.images else ()),
                             f"QUARD task {qcfg.task!r}")
        if backend is None:
            backend = make_backend(cfg.backend_name, replace(cfg.backend_config(), scene_addon=self.library))
        self.library.bind(backend.scene.model)
        self.scenes = QuardScenes(qcfg, self.library, cfg.num_envs, cfg.seed, cfg.dt)
        self.instruction_table = self.scenes.table
        self.camera = None
        self.images = self.depth = None
        if qcfg.images:
            c = qcfg.camera
            self.camera = backend.make_camera(c)
            self.camera.set_colour_geoms(self.scenes.colour_geoms, self.scenes.rgba)
            self.images = np.zeros((cfg.num_envs, c.height, c.width, 3), dtype=np.uint8)
            self.depth = np.zeros((cfg.num_envs, c.height, c.width), dtype=np.float32) if c.depth else None
        super().__init__(cfg, backend)
        self.render(np.arange(self.num_envs))

    def _make_task(self, cfg, body_names, gen):
        return QuardTask(cfg, self.robot, body_names, self.dt, gen, self.device, self.scenes, self.backend)

    @property
    def families(self) -> tuple[str, ...]:
        return self.scenes.families

    def step(self, actions):
        moved = self.scenes.advance_balls()
        if len(moved):
            self.task.stand_on_ground(moved, self.scenes.moving[moved])     # a ball rolls over the terrain
            self.backend.set_mocap(moved, self.scenes.mocap_pos[moved], self.scenes.mocap_quat[moved])
        obs, rew, dones, extras = super().step(actions)
        if self.camera is not None:
            due = np.flatnonzero(self.episode_length_buf.cpu().numpy() % self.qcfg.image_every == 0)
            self.render(due)
        return obs, rew, dones, extras

    def render(self, env_ids) -> None:
        """Render the current frame of these envs into ``images`` (and ``depth``)."""
        if self.camera is not None and len(env_ids):
            self.camera.render(env_ids, self.images, self.depth)

    def _restart(self, env_ids: torch.Tensor) -> None:
        # new scenes outside ``step`` (a full reset at a rollout's start, reset_envs, set_terrain_levels):
        # render them, or the episode's first frame shows the scene before (``step`` renders the envs it resets)
        super()._restart(env_ids)
        self.render(env_ids.cpu().numpy())

    @property
    def terms(self) -> dict[str, torch.Tensor]:
        out = dict(super().terms)
        out["instruction"] = torch.as_tensor(self.scenes.instruction.copy(), device=self.device)
        if self.images is not None:
            out["images/front_rgb"] = torch.from_numpy(self.images.copy())
            if self.depth is not None:
                out["images/front_depth"] = torch.from_numpy(self.depth.copy())
        return out

    @property
    def frame_stride(self) -> int:
        """Control steps between camera frames (the rollout records images at this rate)."""
        return self.qcfg.image_every

    def policy_context(self) -> dict[str, Any]:
        """What a policy reading this env's frames and instructions checks and uses (``policy_for_env``)."""
        c = self.qcfg.camera
        # task_terms: what says which object the task names; a policy reading neither can never succeed
        # here (experts.registry.task_blindness)
        return {"task": self.qcfg.task, "instructions": list(self.instruction_table),
                "task_terms": ("instruction", "task_target_pos"),
                "camera": {"name": "front", "height": c.height, "width": c.width, "image_every": self.qcfg.image_every}}

    def task_params(self, env_id: int) -> dict[str, Any]:
        """The task of env ``env_id``'s current episode (the rollout reads it when the episode starts)."""
        return dict(self.scenes.params[env_id])

    def episode_task_info(self, env_id: int) -> dict[str, Any]:
        """The JSON-able task of env ``env_id``'s last finished episode (call it for a done env)."""
        p = self.scenes.finished[env_id] or self.scenes.params[env_id]
        return {"task": f"quard:{p['family']}", "instruction": p["instruction"], "task_params": dict(p)}

    def close(self) -> None:
        if self.camera is not None:
            self.camera.close()
        super().close()
