"""The one rollout loop: N envs under a policy, yielding finished episodes.

Collection stores what it yields, evaluation summarises it; both run this loop. Per env and step it
records the observation the policy acted on (every raw term of ``env.terms``), the action that was
applied (``actions``: the policy output, plus action noise when asked for), ``joint_targets``,
``rewards``, ``terminated``, ``time_outs`` and ``pushed`` (the env's ``extras["pushed"]``: a push came after
this step's reward, so the next step's observation is after the push), and ``hl_commands`` when the policy exposes the
high-level command it acted with (a ``hl_commands`` attribute, (N, 12), as hierarchical policies do).
A relabelling policy (``collection.dagger.RelabelledPolicy``: a learner drives, an expert labels) exposes
``label_actions`` (N, 12): then ``actions`` records the label - the imitation target - and
``applied_actions`` what was applied.

Buffers are preallocated numpy arrays (num_envs, max_episode_length, width) written in place each
step (``PackedSteps``: a step's features side by side, so a step costs one concatenation and one
copy). When env i is done, its episode - arrays sliced to its length - is yielded with the env's
``extras["episode_end"]`` numbers, the skill it ran, its label (``collection.labels``) and what perturbed
it; the policy is reset for the done envs and the loop carries on (the env has already auto-reset
them). An episode that hits the time limit ends with ``time_outs`` True and ``terminated`` False
(truncated, not terminal).

Camera terms (``images/<camera>``) are recorded at their own rate, every ``frame_stride``-th step of
each episode (``collection.frames.FrameRecorder``; 5 Hz by default), and only on those steps.
A vision-language env may expose, besides its terms (hooks the rollout uses when present):
``env.task_params(env_id) -> dict`` (the episode's family, instruction text, target, colours, slots,
speed, gait, seed, ...; read when the episode starts and stored with it), ``env.instruction_table``
(the list of strings its per-step ``instruction`` term indexes; the used entries travel with the
episode so the store can keep the same texts) and ``env.frame_stride`` (its camera rate).

Stopping at a count favours short episodes among those in flight (failures finish first); the envs'
partly run episodes are dropped, never yielded. A measurement (evaluation, benchmarks) therefore keeps a
sample fixed before any outcome is known: ``Rollout.first_episodes`` (and ``first_episodes_by_group``)
runs until env i has finished its first ``first_episode_quotas`` episodes and keeps the first N by
(episode index, env id) - each env's first ceil(N / envs) episodes, less for the last envs when N is not a
multiple. Episodes finished beyond an env's quota are dropped. Env i's k-th episode is the same whatever
the policy does (a seeded env draws it from its seed, env id and k), so two runs on the same env seed
keep the same scenes: ``first_episode_pairs`` names them.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterator, Sequence

import numpy as np
import torch

from quadforge.collection.frames import FrameRecorder
from quadforge.collection.labels import LabelRule, label, termination_name
from quadforge.collection.skills import SKILLS, SkillCommandSampler
from quadforge.data.images import DEFAULT_FRAME_STRIDE, is_image
from quadforge.envs.config import GAITS
from quadforge.envs.quard.rules import OUTCOMES
from quadforge.layout import COMMAND_NAMES
from quadforge.experts.policy import check_policy
from quadforge.seeding import torch_generator

_VX, _VY, _WZ = (COMMAND_NAMES.index(n) for n in ("lin_vel_x", "lin_vel_y", "ang_vel_yaw"))
_GAIT = [COMMAND_NAMES.index(n) for n in ("gait_phase", "gait_offset", "gait_bound")]


def _numpy(value: torch.Tensor | np.ndarray) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


class PackedSteps:
    """Per-env episode buffers for a fixed set of named per-step features, packed side by side into one
    preallocated float32 array (num_envs, max_len, total width): a step costs one ``torch.cat``, one
    device-to-host copy and one indexed write, whatever the number of features. Bool features are kept
    as 0/1 (exact in float32) and come back as bool."""

    def __init__(self, num_envs: int, max_len: int) -> None:
        self.num_envs, self.max_len = num_envs, max_len
        self.fields: list[tuple[str, int, int, tuple[int, ...], Any]] | None = None  # name, start, end, shape, dtype
        self.buf: np.ndarray | None = None
        self._rows = np.arange(num_envs)

    def _layout(self, features: dict[str, torch.Tensor]) -> None:
        fields, start = [], 0
        for name, t in features.items():
            shape = tuple(t.shape[1:])
            width = int(np.prod(shape)) if shape else 1
            fields.append((name, start, start + width, shape, np.bool_ if t.dtype == torch.bool else np.float32))
            start += width
        self.fields = fields
        self.buf = np.zeros((self.num_envs, self.max_len, start), dtype=np.float32)

    def write(self, steps: np.ndarray, features: dict[str, torch.Tensor]) -> None:
        """Row ``steps[i]`` of env i's buffer gets env i's entries of every (num_envs, ...) feature."""
        if self.fields is None:
            self._layout(features)
        elif [f[0] for f in self.fields] != list(features):
            raise RuntimeError(f"recorded features changed mid-run: {[f[0] for f in self.fields]} -> {list(features)}")
        flat = torch.cat([t.reshape(self.num_envs, -1).to(torch.float32) for t in features.values()], dim=1)
        self.buf[self._rows, steps] = flat.detach().cpu().numpy()

    def episode(self, env_id: int, length: int) -> dict[str, np.ndarray]:
        """Env ``env_id``'s first ``length`` steps, feature by feature (fresh arrays)."""
        if self.fields is None:
            return {}
        block = self.buf[env_id, :length]
        return {name: block[:, a:b].reshape((length,) + shape).astype(dtype)
                for name, a, b, shape, dtype in self.fields}


@dataclass
class Episode:
    """One finished episode: per-step arrays (length T each, first axis time) and its info."""

    features: dict[str, np.ndarray]
    info: dict[str, Any]

    @property
    def length(self) -> int:
        return int(self.info["length"])


@dataclass
class RolloutConfig:
    record: bool = True                 # False: infos only (evaluation summaries), no step arrays
    action_noise_std: float = 0.0       # Gaussian noise on the normalised actions (sub-optimal data)
    label_rule: LabelRule = field(default_factory=LabelRule)
    seed: int = 0                       # the noise stream's seed
    # control steps per recorded camera frame; None: the env's `frame_stride`, else 10 (5 Hz at 50 Hz)
    frame_stride: int | None = None

    def validate(self) -> None:
        if not (self.action_noise_std >= 0 and math.isfinite(self.action_noise_std)):
            raise ValueError(f"action_noise_std={self.action_noise_std!r}; must be a finite number >= 0")
        if self.frame_stride is not None and (not isinstance(self.frame_stride, int) or self.frame_stride < 1):
            raise ValueError(f"frame_stride={self.frame_stride!r}; must be an integer >= 1 (control steps per frame)")


class CommandIntegrator:
    """Where the ideal robot would be: integrates the commanded velocities, heading turning with the
    commanded yaw rate; per env the xy position (m) and heading (rad) since the episode start, the
    command sums (for means) and the episode's first command (its gait). NumPy float64: a handful of
    tiny array ops per step, cheaper than torch dispatch at these sizes."""

    def __init__(self, num_envs: int, dt: float) -> None:
        self.dt = dt
        self.pose = np.zeros((num_envs, 3))   # x, y, yaw
        self.sums = np.zeros((num_envs, 3))   # Σ vx, vy, wz
        self.first = np.zeros((num_envs, len(COMMAND_NAMES)))
        self.steps = np.zeros(num_envs, dtype=np.int64)

    def step(self, commands: np.ndarray) -> None:
        fresh = self.steps == 0
        if fresh.any():
            self.first[fresh] = commands[fresh]
        v = commands[:, [_VX, _VY, _WZ]].astype(np.float64)
        cos, sin = np.cos(self.pose[:, 2]), np.sin(self.pose[:, 2])
        self.pose[:, 0] += (cos * v[:, 0] - sin * v[:, 1]) * self.dt
        self.pose[:, 1] += (sin * v[:, 0] + cos * v[:, 1]) * self.dt
        self.pose[:, 2] += v[:, 2] * self.dt
        self.sums += v
        self.steps += 1

    def take(self, env_id: int) -> dict[str, Any]:
        """The finished episode's command numbers; forgets the env's."""
        displacement = float(np.hypot(*self.pose[env_id, :2]))
        means = (self.sums[env_id] / max(int(self.steps[env_id]), 1)).tolist()
        out = {"commanded_displacement": displacement, "cmd_vx": means[0], "cmd_vy": means[1],
               "cmd_wz": means[2], "gait": gait_name(self.first[env_id])}
        self.forget([env_id])
        return out

    def forget(self, env_ids: list[int]) -> None:
        self.pose[env_ids] = 0.0
        self.sums[env_ids] = 0.0
        self.steps[env_ids] = 0


def gait_name(command: np.ndarray | torch.Tensor) -> str:
    """walk-these-ways' gait of a 15-D command from its (phase, offset, bound), or "custom"."""
    pob = [float(command[j]) for j in _GAIT]
    for name, ref in GAITS.items():
        if all(abs(a - b) < 1e-3 for a, b in zip(pob, ref)):
            return name
    return "custom"


def first_episode_quotas(groups: Sequence[Hashable], episodes: int) -> list[int]:
    """Per env, how many of its first episodes are among its group's first ``episodes`` by (episode index,
    env id): env i, the p-th env of a group of m, keeps ceil((episodes - p) / m) (>= 0). The quotas of a group
    sum to ``episodes``; they depend on the group sizes only, never on an outcome."""
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 0:
        raise ValueError(f"episodes={episodes!r}; must be an integer >= 0")
    size, seen, quotas = Counter(groups), Counter(), []
    for g in groups:
        quotas.append(max(0, -(-(episodes - seen[g]) // size[g])))
        seen[g] += 1
    return quotas


def first_episode_pairs(groups: Sequence[Hashable], episodes: int) -> dict[Hashable, list[tuple[int, int]]]:
    """Per group, the (episode index, env id) of the episodes ``Rollout.first_episodes_by_group`` keeps, in
    its order: the group's first ``episodes`` pairs sorted by episode index, then env id."""
    quotas = first_episode_quotas(groups, episodes)
    out: dict[Hashable, list[tuple[int, int]]] = {g: [] for g in groups}
    for i, (g, q) in enumerate(zip(groups, quotas)):
        out[g].extend((k, i) for k in range(q))
    return {g: sorted(pairs) for g, pairs in out.items()}


class Rollout:
    """Runs ``policy`` in ``env`` and yields ``Episode``s (see the module doc).

    ``skills``: a ``SkillCommandSampler`` installed as the env's command sampler; its skill names go
    into the infos as ``task``. ``info_extra``: constant entries added to every info (robot, run
    settings).
    """

    def __init__(self, env: Any, policy: Any, config: RolloutConfig | None = None,
                 skills: SkillCommandSampler | None = None, info_extra: dict[str, Any] | None = None) -> None:
        self.cfg = config or RolloutConfig()
        self.cfg.validate()
        policy = check_policy(policy)
        if policy.action_space != "joint":
            raise ValueError(f"policy {policy.policy_id!r} emits action_space={policy.action_space!r}; the env "
                             "takes 'joint' actions - wrap a command policy in a HierarchicalPolicy")
        self.env, self.policy, self.skills = env, policy, skills
        self.info_extra = dict(info_extra or {})
        self.num_envs = int(env.num_envs)
        self.device = torch.device(getattr(env, "device", "cpu"))
        self.max_len = int(env.max_episode_length)
        if skills is not None:
            env.command_sampler = skills
        self._noise_gen = torch_generator(self.cfg.seed, "action_noise", self.device)
        self._commands = CommandIntegrator(self.num_envs, float(env.dt))
        self._step_count = np.zeros(self.num_envs, dtype=np.int64)
        self._skill = [""] * self.num_envs
        # before the env step: the observation and the action; after it: its outcome
        self._before = PackedSteps(self.num_envs, self.max_len)
        self._after = PackedSteps(self.num_envs, self.max_len)
        self.frame_stride = self._frame_stride(env)
        self._frames = FrameRecorder(self.num_envs, self.max_len, self.frame_stride)
        self._image_names: tuple[str, ...] | None = None   # found in the first step's terms
        self._task_params: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self.env_steps = 0  # env-steps summed over envs since construction

    def _frame_stride(self, env: Any) -> int:
        env_stride = getattr(env, "frame_stride", None)
        if self.cfg.frame_stride is None:
            return int(env_stride) if env_stride else DEFAULT_FRAME_STRIDE
        if env_stride and self.cfg.frame_stride % int(env_stride):
            raise ValueError(f"--frame-stride={self.cfg.frame_stride} is not a multiple of the env's camera stride "
                             f"{env_stride}: the env renders no frame on most of the recorded steps")
        return self.cfg.frame_stride

    # --- the loop -------------------------------------------------------------------------------------
    def _start(self, reset: bool) -> None:
        all_ids = torch.arange(self.num_envs, device=self.device)
        if reset:
            # VecEnv.reset() also refreshes the observation; reset_envs is the contract's minimum.
            env_reset = getattr(self.env, "reset", None)
            env_reset() if callable(env_reset) else self.env.reset_envs(all_ids)
        else:
            started = getattr(self.env, "episode_length_buf", None)
            if started is not None and bool((started != 0).any()):
                raise ValueError("Rollout.episodes(reset=False): every env must be at the start of an episode "
                                 f"(env.episode_length_buf is {started.tolist()})")
        self.policy.reset(all_ids)
        self._step_count[:] = 0
        self._commands = CommandIntegrator(self.num_envs, float(self.env.dt))
        self._start_episodes(range(self.num_envs))

    def _start_episodes(self, env_ids: Any) -> None:
        if self.skills is not None:
            for i in env_ids:
                self._skill[i] = self.skills.current[i]
        # a task env's per-episode parameters, read at the start of each episode (after its reset)
        task_params = getattr(self.env, "task_params", None)
        if callable(task_params):
            for i in env_ids:
                self._task_params[i] = dict(task_params(int(i)))

    def episodes(self, max_episodes: int | None = None, max_steps: int | None = None,
                 reset: bool = True) -> Iterator[Episode]:
        """Yield finished episodes until ``max_episodes`` were yielded or ``max_steps`` control steps
        (of the whole batch) were taken; at least one bound is required.

        ``reset=False`` keeps the envs as they are - for a caller that has just started fresh episodes
        itself (``env.set_terrain_levels`` / ``env.set_commands`` for an evaluation sweep)."""
        if max_episodes is None and max_steps is None:
            raise ValueError("Rollout.episodes: give max_episodes or max_steps (a bound), not neither")
        for name, bound in (("max_episodes", max_episodes), ("max_steps", max_steps)):
            if bound is not None and (not isinstance(bound, int) or bound < 0):
                raise ValueError(f"Rollout.episodes: {name}={bound!r}; must be an integer >= 0")
        self._start(reset)
        emitted = steps = 0
        while (max_episodes is None or emitted < max_episodes) and (max_steps is None or steps < max_steps):
            done_ids, extras = self._step()
            steps += 1
            for i in done_ids:
                if max_episodes is not None and emitted >= max_episodes:
                    break
                yield self._finish(i, extras)
                emitted += 1
            self._restart(done_ids)

    def first_episodes(self, episodes: int, reset: bool = True,
                       check: Callable[[Episode], None] | None = None) -> list[Episode]:
        """The first ``episodes`` episodes by (episode index, env id): each env's first ceil(episodes /
        num_envs) or so (``first_episode_quotas``), run until every env has finished its own - a sample fixed
        before any outcome is known. ``episodes(max_episodes=N)`` keeps the first N to *finish* instead,
        which over-samples quick outcomes (a success or a collision ends an episode early, a time-out runs
        to the limit) and depends on ``num_envs``. ``check(episode)`` sees every finished episode."""
        return self.first_episodes_by_group(episodes, [None] * self.num_envs, reset, check)[None]

    def first_episodes_by_group(self, episodes: int, groups: Sequence[Hashable], reset: bool = True,
                                check: Callable[[Episode], None] | None = None) -> dict[Hashable, list[Episode]]:
        """Env i belongs to ``groups[i]`` (an evaluation cell); per group its first ``episodes`` episodes by
        (episode index, env id), as ``first_episode_pairs`` lists them (``first_episodes``: one group)."""
        if len(groups) != self.num_envs:
            raise ValueError(f"groups: {len(groups)} entries for {self.num_envs} envs; one group per env")
        quotas = first_episode_quotas(groups, episodes)
        got: list[list[Episode]] = [[] for _ in range(self.num_envs)]
        short = sum(1 for q in quotas if q > 0)   # envs still short of their quota
        if short:
            bound = max(quotas) * self.max_len + 1   # every episode ends within max_len steps
            for ep in self.episodes(max_steps=bound, reset=reset):
                if check is not None:
                    check(ep)
                i = int(ep.info["env_id"])
                if len(got[i]) < quotas[i]:
                    got[i].append(ep)
                    short -= len(got[i]) == quotas[i]
                if not short:
                    break
            if short:
                raise RuntimeError(f"Rollout.first_episodes: {short} env(s) did not finish their episodes within "
                                   f"{bound} steps")
        return {g: [got[i][k] for k, i in pairs] for g, pairs in first_episode_pairs(groups, episodes).items()}

    def _step(self) -> tuple[list[int], dict]:
        terms = self.env.terms
        if np.any(self._step_count >= self.max_len):
            raise RuntimeError(f"an episode ran past env.max_episode_length={self.max_len} without a time-out")
        actions = self.policy.act(terms)
        if self.cfg.action_noise_std > 0:
            noise = torch.randn(actions.shape, generator=self._noise_gen, device=actions.device)
            actions = actions + self.cfg.action_noise_std * noise
        hl = getattr(self.policy, "hl_commands", None)
        if self.cfg.record:
            if self._image_names is None:
                self._image_names = tuple(k for k in terms if is_image(k))
            if self._image_names:   # frames at their own rate, outside the packed step buffer
                self._frames.write(self._step_count, {k: terms[k] for k in self._image_names})
                before = {k: v for k, v in terms.items() if not is_image(k)}
            else:
                before = dict(terms)
            before["actions"] = actions
            if hl is not None:
                before["hl_commands"] = hl
            labels = getattr(self.policy, "label_actions", None)
            if labels is not None:
                before["actions"], before["applied_actions"] = labels, actions
            self._before.write(self._step_count, before)
        self._commands.step(_numpy(terms["commands"]))

        _, rewards, dones, extras = self.env.step(actions)
        time_outs = extras["time_outs"].bool() & dones.bool()
        if self.cfg.record:
            after = {"joint_targets": self.env.joint_targets, "rewards": rewards,
                     "terminated": dones.bool() & ~time_outs, "time_outs": time_outs}
            if "pushed" in extras:   # a push after this step's reward: the next observation is after it
                after["pushed"] = extras["pushed"]
            self._after.write(self._step_count, after)
        self._step_count += 1
        self.env_steps += self.num_envs
        done_ids = dones.nonzero(as_tuple=False).flatten().tolist()
        if done_ids and "episode_end" in extras:
            # one copy to the host per column and step, not one read back per column and episode (on a
            # GPU each read back waits for its queue)
            host = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in extras["episode_end"].items()}
            extras = {**extras, "episode_end": host}
        return done_ids, extras

    def _finish(self, i: int, extras: dict) -> Episode:
        length = int(self._step_count[i])
        features = {**self._before.episode(i, length), **self._after.episode(i, length)} if self.cfg.record else {}
        if self.cfg.record and self._image_names:
            features.update(self._frames.episode(i, length))
        info: dict[str, Any] = dict(self.info_extra)
        for key, value in extras.get("episode_end", {}).items():
            info[key] = value[i].item() if isinstance(value, torch.Tensor) else value[i]
        if "length" in info and int(info["length"]) != length:
            raise RuntimeError(f"env {i}: the env counts {int(info['length'])} steps in the episode, the rollout "
                               f"recorded {length}; was the env stepped outside the rollout?")
        info["termination_reason"] = termination_name(info.get("termination_reason", "none"))
        terrain_types = tuple(getattr(self.env, "terrain_types", ()) or ())
        if "terrain_type" in info and terrain_types:
            info["terrain_type"] = terrain_types[int(info["terrain_type"])]
        info.update(self._commands.take(i))
        if "quard_outcome" in info:  # a task with its own rule (QUARD): the outcome's name, not its code
            info["quard_outcome"] = OUTCOMES[int(info["quard_outcome"])]
        success, reason, numbers = label(info, self.cfg.label_rule)
        if "progress" in numbers and not math.isfinite(numbers["progress"]):
            numbers["progress"] = None  # no commanded displacement: progress is undefined
        info.update({
            "env_id": i, "length": length, "task": self._skill[i], "policy_id": self.policy.policy_id,
            # the store's tasks table lists each task's instructions; a skill's is its description
            "instruction": SKILLS[self._skill[i]].description if self._skill[i] in SKILLS else None,
            "action_noise_std": self.cfg.action_noise_std, "success": success,
            "failure_reason": "none" if success else reason,
            "terminated": info["termination_reason"] not in ("none", "time_out"),
            "label": {"reason": reason, "numbers": numbers, "rule": self.cfg.label_rule.to_dict()},
        })
        if self._image_names:
            info["frame_stride"] = self.frame_stride
        self._task_info(i, info, features)
        task_info = getattr(self.env, "episode_task_info", None)
        if task_info is not None:  # the env's own record of the episode that just ended (QUARD): it wins over the start-of-episode read
            info.update(task_info(i))
        return Episode(features, info)

    def _task_info(self, i: int, info: dict[str, Any], features: dict[str, np.ndarray]) -> None:
        """A task env's episode: its parameters, task name, instruction text and the instruction texts
        its per-step ``instruction`` indices stand for."""
        params = self._task_params[i]
        if params:
            info["task_params"] = params
            if params.get("task") or params.get("family"):
                info["task"] = str(params.get("task") or f"quard:{params['family']}")
            if params.get("instruction"):
                info["instruction"] = str(params["instruction"])
        if "instruction" in features:
            table = getattr(self.env, "instruction_table", None)
            if table is None:
                raise ValueError("the env emits an 'instruction' term but has no instruction_table (the list of "
                                 "strings it indexes); the store needs the texts")
            used = np.unique(features["instruction"]).astype(np.int64)
            info["instructions"] = {str(k): str(table[k]) for k in used.tolist() if k >= 0}

    def _restart(self, done_ids: list[int]) -> None:
        if not done_ids:
            return
        self._step_count[done_ids] = 0
        # Any episode yielded or dropped at a bound: its env starts afresh either way.
        self._commands.forget(done_ids)
        self.policy.reset(torch.as_tensor(done_ids, device=self.device))
        self._start_episodes(done_ids)
