"""The privileged scripted high-level expert of the QUARD tasks (the demonstrator of the VLA issues).

A ``"command"`` policy: it reads the privileged ``task_*`` terms (its own pose, the target, the
distractor, the obstacle, the named tunnel, the family / speed / gait codes) and emits seed 003's 12-D
command ``[vx, vy, wz, theta1, theta2, theta3, f, h_z, pitch, s_y, h_z^f, T]`` for
``HierarchicalPolicy(QuardExpert(...), GaitController(...))``.

What it does on each family is the family's own (``Family.expert`` in ``envs/quard/family/<name>.py``:
the goal it walks at - go_avoid's waypoints around the panel, stop's interception point, go_through's
approach to and along the tunnel axis - a reshaped speed, a replaced command such as distinguish's turn
on the spot, and when it is done); ``act`` runs those per family through the registry
(``envs.quard.families``). Shared by every family:

Walking turns toward the current goal (yaw rate) and walks at it, the speed falling with the bearing
error, half of the goal direction's sideways part commanded as vy (the rest is turned out). The speed
word sets the band of ground speed the expert holds and the stepping frequency, per gait word
(``GAIT_SPEEDS``): the commanded speed is the band plus an integral of the measured shortfall (bound
and pronk lose 0.2-0.3 m/s of the commanded speed in the gait controller, docs/experts.md), capped
at ``MAX_COMMAND_SPEED``. The gait word sets (theta1..3) to walk-these-ways' named gait. T is raised
when the expert judges the task done (the env ends the episode on its own rule at the same time).
"""
from __future__ import annotations

from typing import Mapping

import torch

from quadforge.envs.quard.families import family_of_code, get_family
from quadforge.envs.quard.family.base import MAX_YAW_RATE, YAW_GAIN, ExpertStep
from quadforge.envs.quard.words import GAIT_OF_WORD, GAIT_WORDS, SPEEDS
from quadforge.tensors import row_ids, set_rows
from quadforge.experts.gait import GAITS
from quadforge.experts.hierarchical import HL_COMMAND_DIM, HL_COMMAND_NAMES
from quadforge.experts.registry import LoadContext, policy_for_env, register_policy_kind

# per gait word and speed word: (band of ground speed m/s the expert holds, stepping frequency Hz).
# Trot and pace track the commanded speed at 3 Hz. Bound and pronk lose 0.2-0.3 m/s of it in the gait
# controller (docs/experts.md) and at 3 Hz reach only ~0.5 m/s at the 1.5 m/s command limit, so with
# the trot's bands every word wound the integral up to the limit and all three walked ~0.37 m/s. Their
# bands are lower and the faster words step faster (measured, constant command on flat ground, 5 s:
# bound at 4 Hz 0.45-0.48 m/s at 1.0 commanded, 0.69-0.76 at 1.5; pronk at 5 Hz 0.63-0.69 at 1.0).
# Their "slowly" stays at 0.35 m/s: a slower bound or pronk would not get through go_through in 15 s.
SPEED_BANDS = {"slowly": 0.45, "normally": 0.7, "quickly": 1.0}   # m/s: trotting and pacing, at 3 Hz
GAIT_SPEEDS = {
    "trotting": {w: (b, 3.0) for w, b in SPEED_BANDS.items()},
    "pacing": {w: (b, 3.0) for w, b in SPEED_BANDS.items()},
    "bounding": {"slowly": (0.35, 3.0), "normally": (0.5, 4.0), "quickly": (0.65, 4.0)},
    "pronking": {"slowly": (0.35, 3.0), "normally": (0.5, 4.0), "quickly": (0.65, 5.0)},
}
MAX_COMMAND_SPEED = 1.5           # m/s: the integral may ask for at most this (the gait controller's limit)
SPEED_KI = 2.0                    # 1/s, integral gain on the speed shortfall
LATERAL_SHARE = 0.5               # of the goal direction's sideways part that is commanded as vy
_COL = {n: i for i, n in enumerate(HL_COMMAND_NAMES)}


class QuardExpert:
    """Scripted privileged high level for every QUARD family (module doc); batched over N envs."""

    action_space = "command"
    action_dim = HL_COMMAND_DIM
    obs_terms = ("base_lin_vel", "task_base_pose", "task_target_pos", "task_target_vel", "task_distractor_pos",
                 "task_obstacle_pos", "task_tunnel_entry", "task_info")

    def __init__(self, num_envs: int, dt: float = 0.02, device: str | torch.device = "cpu"):
        self.num_envs, self.dt, self.device = int(num_envs), float(dt), torch.device(device)
        self.policy_id = "quard_expert:v1"
        self.speed_integral = torch.zeros(self.num_envs, device=self.device)
        # family name -> its behaviour's per-env flags (``ExpertBehaviour.memory``), made on first use
        self.memory: dict[str, dict[str, torch.Tensor]] = {}
        # (gait word, speed word) -> band, frequency
        table = torch.tensor([[GAIT_SPEEDS[g][s] for s in SPEEDS] for g in GAIT_WORDS], device=self.device)
        self._bands, self._frequencies = table[..., 0], table[..., 1]
        self._gaits = torch.tensor([GAITS[GAIT_OF_WORD[w]] for w in GAIT_WORDS], device=self.device)

    def reset(self, env_ids: torch.Tensor | None) -> None:
        ids = row_ids(env_ids, self.num_envs, self.device, check_range="host")   # None: all; a mask: its rows
        # act() replaces or makes these: under a caller's torch.inference_mode they are made there
        self.speed_integral = set_rows(self.speed_integral, ids, 0.0)
        for flags in self.memory.values():
            for name in flags:
                flags[name] = set_rows(flags[name], ids, False)

    def _memory(self, family: str) -> dict[str, torch.Tensor]:
        if family not in self.memory:
            self.memory[family] = {name: torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
                                   for name in get_family(family).expert.memory}
        return self.memory[family]

    def _steps(self, o: dict[str, torch.Tensor], band: torch.Tensor, gait_word: torch.Tensor, family: torch.Tensor):
        """(family, env rows, ExpertStep) of every family present in the batch."""
        cols = {"xy": o["task_base_pose"][:, :2], "yaw": o["task_base_pose"][:, 3],
                "target": o["task_target_pos"][:, :2], "distractor": o["task_distractor_pos"][:, :2],
                "target_vel": o["task_target_vel"][:, :2], "obstacle": o["task_obstacle_pos"][:, :2],
                "tunnel_entry": o["task_tunnel_entry"][:, :2], "band": band, "gait_word": gait_word}
        out = []
        for code in torch.unique(family).tolist():
            fam = family_of_code(code)
            rows = torch.nonzero(family == code).flatten()
            memory = {name: flag[rows] for name, flag in self._memory(fam.name).items()}
            out.append((fam, rows, ExpertStep(**{k: v[rows] for k, v in cols.items()}, memory=memory)))
        return out

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        missing = [t for t in self.obs_terms if t not in obs]
        if missing:
            raise KeyError(f"QuardExpert needs the privileged QUARD terms {missing} (run it on a QuardEnv)")
        o = {k: obs[k].to(self.device, torch.float32) for k in self.obs_terms}
        xy, yaw = o["task_base_pose"][:, :2], o["task_base_pose"][:, 3]
        info = o["task_info"].round().long()
        speed_word, gait_word = info[:, 1], info[:, 2]
        band = self._bands[gait_word, speed_word]
        steps = self._steps(o, band, gait_word, info[:, 0])
        goal = o["task_target_pos"][:, :2].clone()
        for fam, rows, step in steps:
            goal[rows] = fam.expert.goal(step)
        rel = goal - xy
        dist = rel.norm(dim=1)
        c, s = torch.cos(yaw), torch.sin(yaw)
        rel_b = torch.stack((c * rel[:, 0] + s * rel[:, 1], -s * rel[:, 0] + c * rel[:, 1]), dim=1)
        bearing = torch.atan2(rel_b[:, 1], rel_b[:, 0])
        direction = rel_b / dist.clamp(min=1e-6)[:, None]
        command_speed = self._hold_band(band, (o["base_lin_vel"][:, :2] * direction).sum(dim=1))
        for fam, rows, step in steps:
            if fam.expert.speed is not None:
                step.goal_distance = dist[rows]
                command_speed[rows] = fam.expert.speed(step, command_speed[rows])
        # turn, then walk: the speed falls with the bearing error (zero beyond 90 degrees), and only a
        # share of it goes sideways - the pace and bound track a lateral command poorly (a pacing robot
        # commanded sideways at the start walked straight on into the go_avoid obstacle)
        command_speed = command_speed * torch.clamp(torch.cos(bearing), min=0.0)
        v = torch.stack((direction[:, 0], LATERAL_SHARE * direction[:, 1]), dim=1) * command_speed[:, None]
        wz = (YAW_GAIN * bearing).clamp(-MAX_YAW_RATE, MAX_YAW_RATE)
        done = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        for fam, rows, step in steps:
            if fam.expert.command is not None:
                v[rows], wz[rows] = fam.expert.command(step, v[rows], wz[rows])
            done[rows] = fam.expert.done(step)
            for name, flag in step.memory.items():
                flags = self.memory[fam.name]
                flags[name] = set_rows(flags[name], rows, flag)
        return self._command(v, wz, gait_word, speed_word, done)

    def _hold_band(self, band: torch.Tensor, speed: torch.Tensor) -> torch.Tensor:
        """The commanded speed: the band plus the integral of the ground speed's shortfall along the goal."""
        self.speed_integral = (self.speed_integral + SPEED_KI * (band - speed) * self.dt).clamp(0.0, MAX_COMMAND_SPEED)
        return torch.minimum(band + self.speed_integral, torch.full_like(band, MAX_COMMAND_SPEED))

    def _command(self, v: torch.Tensor, wz: torch.Tensor, gait_word: torch.Tensor, speed_word: torch.Tensor,
                 done: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(self.num_envs, HL_COMMAND_DIM, device=self.device)
        out[:, _COL["lin_vel_x"]] = v[:, 0]
        out[:, _COL["lin_vel_y"]] = v[:, 1]
        out[:, _COL["ang_vel_yaw"]] = wz
        gaits = self._gaits[gait_word]
        out[:, _COL["gait_phase"]], out[:, _COL["gait_offset"]], out[:, _COL["gait_bound"]] = gaits.unbind(1)
        out[:, _COL["gait_frequency"]] = self._frequencies[gait_word, speed_word]
        out[:, _COL["body_height"]] = 0.0
        out[:, _COL["body_pitch"]] = 0.0
        out[:, _COL["stance_width"]] = 0.25
        out[:, _COL["foot_swing_height"]] = 0.08
        out[:, _COL["terminate"]] = done.to(torch.float32)
        return out


def make_quard_expert(env) -> "object":
    """``HierarchicalPolicy(QuardExpert, GaitController)`` for a ``QuardEnv``: a "joint" policy; the same as
    ``experts.registry.policy_for_env("quard_expert", env)``, through which it is built."""
    return policy_for_env("quard_expert", env)


def _load_for_registry(arg: str, ctx: LoadContext) -> QuardExpert:
    if arg:
        raise ValueError(f"--policy quard_expert:{arg}: the QUARD expert takes no argument (the instruction "
                         f"in each episode sets its speed and gait)")
    return QuardExpert(ctx.num_envs, ctx.control_dt, ctx.device)


# `--policy quard_expert` on collect/eval/rollout: a command policy, run over the gait controller
register_policy_kind("quard_expert", _load_for_registry,
                     "the privileged scripted QUARD expert (reads the task_* terms: QUARD tasks only)",
                     needs_path=False, compiles_expert=True)
