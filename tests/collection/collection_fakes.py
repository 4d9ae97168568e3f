"""A scripted stand-in for LeggedEnv, to test the rollout loop's bookkeeping exactly.

It meets the env contract the rollout uses (terms, step -> (obs, rewards, dones, extras) with
time_outs and per-episode info, auto-reset, command_sampler hook, reset_envs, joint_targets, dt,
max_episode_length) with dynamics simple enough that every recorded number is predictable: env i's
episode k lasts ``3 + (i + k) % 4`` steps and ends in a fall when (i + k) is odd, else it runs to the
time limit when that is shorter. ``dof_pos`` carries (env id, episode counter, step) so tests can check
which observation was recorded where.
"""
from __future__ import annotations

import torch

from quadforge.layout import COMMAND_NAMES


class ScriptedEnv:
    def __init__(self, num_envs: int = 3, max_episode_length: int = 5, dt: float = 0.02):
        self.num_envs, self.max_episode_length, self.dt = num_envs, max_episode_length, dt
        self.device = torch.device("cpu")
        self.terrain_types = ("flat", "stairs_up")
        self.command_sampler = None
        self.commands = torch.zeros(num_envs, len(COMMAND_NAMES))
        self.commands[:, 0] = 1.0
        self.t = torch.zeros(num_envs, dtype=torch.long)
        self.k = torch.full((num_envs,), -1, dtype=torch.long)
        self.ret = torch.zeros(num_envs)
        self.joint_targets = torch.zeros(num_envs, 12)
        self.reset_calls: list[list[int]] = []

    def _planned(self, i: int) -> tuple[int, bool]:
        n = 3 + (i + int(self.k[i])) % 4
        fall = (i + int(self.k[i])) % 2 == 1
        if not fall or n > self.max_episode_length:
            return min(n, self.max_episode_length) if fall else self.max_episode_length, False
        return n, True

    def reset_envs(self, env_ids: torch.Tensor) -> None:
        ids = env_ids.tolist()
        self.reset_calls.append(ids)
        self.t[env_ids] = 0
        self.k[env_ids] += 1
        self.ret[env_ids] = 0
        if self.command_sampler is not None:
            self.commands[env_ids] = self.command_sampler(env_ids, torch.Generator())

    @property
    def terms(self) -> dict[str, torch.Tensor]:
        dof = torch.zeros(self.num_envs, 12)
        dof[:, 0] = torch.arange(self.num_envs, dtype=torch.float32)
        dof[:, 1] = self.k.float()
        dof[:, 2] = self.t.float()
        vel = torch.zeros(self.num_envs, 3)
        vel[:, :2] = self.commands[:, :2]
        return {"commands": self.commands.clone(), "base_lin_vel": vel, "dof_pos": dof}

    def step(self, actions: torch.Tensor):
        self.joint_targets = 0.5 * actions
        rewards = actions[:, 0] + self.t.float()
        self.ret += rewards
        self.t += 1
        dones = torch.zeros(self.num_envs, dtype=torch.bool)
        time_outs = torch.zeros(self.num_envs, dtype=torch.bool)
        reason = torch.zeros(self.num_envs, dtype=torch.long)
        for i in range(self.num_envs):
            n, fall = self._planned(i)
            if int(self.t[i]) >= n:
                dones[i] = True
                time_outs[i] = not fall
                reason[i] = 2 if fall else 1
        episode = {
            "termination_reason": [("none", "time_out", "fall")[r] for r in reason.tolist()],
            "length": self.t.clone(), "return": self.ret.clone(),
            "distance": self.t.float() * self.dt * self.commands[:, :2].norm(dim=1),
            "commanded_distance": self.t.float() * self.dt * self.commands[:, :2].norm(dim=1),
            "lin_vel_error": torch.zeros(self.num_envs), "lin_vel_x_error": torch.zeros(self.num_envs),
            "ang_vel_error": torch.zeros(self.num_envs),
            "terrain_type": torch.ones(self.num_envs, dtype=torch.long),
            "terrain_level": torch.full((self.num_envs,), 3),
        }
        done_ids = dones.nonzero().flatten()
        if done_ids.numel():
            self.reset_envs(done_ids)  # auto-reset: the returned obs is already the next episode's
        extras = {"time_outs": time_outs, "log": {}, "episode_end": episode}
        return None, rewards, dones, extras


class ZeroPolicy:
    """Zero joint actions: for tests where what the policy does does not matter."""

    policy_id, obs_terms, action_space, action_dim = "zero", ("dof_pos",), "joint", 12

    def reset(self, env_ids):
        pass

    def act(self, obs):
        return torch.zeros(obs["dof_pos"].shape[0], 12)


class EchoPolicy:
    """Joint actions that repeat the observation they saw (dof_pos), so tests can match them up."""

    policy_id = "echo"
    obs_terms = ("dof_pos",)
    action_space = "joint"
    action_dim = 12

    def __init__(self, with_hl: bool = False):
        self.resets: list[list[int]] = []
        self.with_hl = with_hl
        self.hl_commands = None

    def reset(self, env_ids: torch.Tensor) -> None:
        self.resets.append(env_ids.tolist())

    def act(self, obs):
        a = obs["dof_pos"].clone()
        if self.with_hl:
            self.hl_commands = obs["dof_pos"][:, :12].clone() * 2
        return a


class CameraScriptedEnv(ScriptedEnv):
    """ScriptedEnv with a camera, an instruction term and per-episode task parameters (the hooks a QUARD
    env offers): pixel (0, 0) of ``images/front_rgb`` holds (env id, episode counter, step) and the depth
    image the step in metres, so tests can check which frame was recorded where."""

    instruction_table = ["go to the red cube, slowly with a trotting gait", "stop the blue ball, quickly with a "
                         "pacing gait", "distinguish letter a, normally with a bounding gait"]

    def __init__(self, *args, frame_stride=None, size=(6, 8), **kwargs):
        super().__init__(*args, **kwargs)
        if frame_stride is not None:
            self.frame_stride = frame_stride
        self.size = size
        self.renders = 0

    def task_params(self, env_id: int) -> dict:
        k = (env_id + int(self.k[env_id])) % len(self.instruction_table)
        return {"family": ("go_to", "stop", "distinguish")[k], "instruction": self.instruction_table[k],
                "seed": 100 * env_id + int(self.k[env_id]), "episode": int(self.k[env_id])}

    @property
    def terms(self) -> dict[str, torch.Tensor]:
        out = super().terms
        self.renders += 1
        h, w = self.size
        rgb = torch.zeros(self.num_envs, h, w, 3, dtype=torch.uint8)
        rgb[:, 0, 0, 0] = torch.arange(self.num_envs, dtype=torch.uint8)
        rgb[:, 0, 0, 1] = self.k.to(torch.uint8)
        rgb[:, 0, 0, 2] = self.t.to(torch.uint8)
        out["images/front_rgb"] = rgb
        out["images/front_depth"] = self.t.float()[:, None, None].expand(self.num_envs, h, w).clone()
        out["instruction"] = (torch.arange(self.num_envs) + self.k) % len(self.instruction_table)
        return out
