"""The privileged scripted high-level expert of the QUARD tasks (the demonstrator of the VLA issues).

A ``"command"`` policy: it reads the privileged ``task_*`` terms (its own pose, the target, the
distractor, the obstacle, the named tunnel, the family / speed / gait codes) and emits seed 003's 12-D
command ``[vx, vy, wz, theta1, theta2, theta3, f, h_z, pitch, s_y, h_z^f, T]`` for
``HierarchicalPolicy(QuardExpert(...), GaitController(...))``. Per family it plans:

- go_to: walk at the target; go_avoid: to a waypoint beside the obstacle (1.25 m off the line to the
  target, on the side away from the distractor) 0.3 m short of it, then to one 0.4 m past it, then to
  the target;
- stop: intercept the rolling ball - aim where the ball will be when the robot can get there
  (constant ball velocity, the robot at its speed band), and meet it before it passes the 1 m line;
- distinguish: turn on the spot until the named letter box is straight ahead;
- go_through: to a point on the named tunnel's axis 0.9 m before its entrance (slowing down on the
  last 0.8 m), turn to the axis there, then along the axis
  through the tunnel to the point 1 m past it (the lateral error to the axis is steered out with vy).

Walking turns toward the current goal (yaw rate) and walks at it, the speed falling with the bearing
error, half of the goal direction's sideways part commanded as vy (the rest is turned out). The speed
word sets the band of ground speed the expert holds and the stepping frequency, per gait word
(``GAIT_SPEEDS``): the commanded speed is the band plus an integral of the measured shortfall (bound
and pronk lose 0.2-0.3 m/s of the commanded speed in the gait controller, docs/experts.md), capped
at ``MAX_COMMAND_SPEED``. The gait word sets (theta1..3) to walk-these-ways' named gait. T is raised
when the expert judges the task done (the env ends the episode on its own rule at the same time).
"""
from __future__ import annotations

import math
from typing import Mapping

import torch

from quadforge.envs.quard.instructions import GAIT_OF_WORD, GAIT_WORDS, SPEEDS
from quadforge.envs.quard.rules import FAMILY_CODE, SUCCESS_RADIUS
from quadforge.experts.gait import GAITS
from quadforge.experts.hierarchical import HL_COMMAND_DIM, HL_COMMAND_NAMES
from quadforge.experts.registry import LoadContext, register_policy_kind

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
YAW_GAIN, MAX_YAW_RATE = 1.5, 1.0
LATERAL_SHARE = 0.5               # of the goal direction's sideways part that is commanded as vy
AVOID_OFFSET = 1.25               # m beside the obstacle centre: the straight path from the spawn clears the panel end (0.46 m) by ~0.45 m
AVOID_BEYOND = 0.4                # m past it along the line to the target
AVOID_BEFORE = 0.3                # m short of it: the first waypoint
TUNNEL_APPROACH = 0.9             # m before the tunnel entrance
APPROACH_SLOWDOWN = 0.8           # m: closer than this to the approach point the speed falls with the distance
TUNNEL_SPEED = 0.6                # m/s commanded at most inside a tunnel
TUNNEL_LOOKAHEAD = 0.5            # m: the goal point on the tunnel axis ahead of the robot
TUNNEL_MAX_YAW = 0.35             # rad: short of the entrance the speed falls to 0 at this heading error
_COL = {n: i for i, n in enumerate(HL_COMMAND_NAMES)}


def _wrap(a: torch.Tensor) -> torch.Tensor:
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


class QuardExpert:
    """Scripted privileged high level for every QUARD family (module doc); batched over N envs."""

    action_space = "command"
    action_dim = HL_COMMAND_DIM
    obs_terms = ("base_lin_vel", "task_base_pose", "task_target_pos", "task_target_vel", "task_distractor_pos",
                 "task_obstacle_pos", "task_tunnel_entry", "task_info")

    def __init__(self, num_envs: int, dt: float = 0.02, device: str | torch.device = "cpu"):
        self.num_envs, self.dt, self.device = int(num_envs), float(dt), torch.device(device)
        self.policy_id = "quard_expert:v1"
        n = self.num_envs
        self.speed_integral = torch.zeros(n, device=self.device)
        self.passed_obstacle = torch.zeros(n, dtype=torch.bool, device=self.device)
        self.cleared_side = torch.zeros(n, dtype=torch.bool, device=self.device)
        self.in_tunnel_phase = torch.zeros(n, dtype=torch.bool, device=self.device)
        # (gait word, speed word) -> band, frequency
        table = torch.tensor([[GAIT_SPEEDS[g][s] for s in SPEEDS] for g in GAIT_WORDS], device=self.device)
        self._bands, self._frequencies = table[..., 0], table[..., 1]
        self._gaits = torch.tensor([GAITS[GAIT_OF_WORD[w]] for w in GAIT_WORDS], device=self.device)

    def reset(self, env_ids: torch.Tensor) -> None:
        ids = torch.as_tensor(env_ids, dtype=torch.long, device=self.device).flatten()
        self.speed_integral[ids] = 0.0
        self.passed_obstacle[ids] = False
        self.cleared_side[ids] = False
        self.in_tunnel_phase[ids] = False

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        missing = [t for t in self.obs_terms if t not in obs]
        if missing:
            raise KeyError(f"QuardExpert needs the privileged QUARD terms {missing} (run it on a QuardEnv)")
        o = {k: obs[k].to(self.device, torch.float32) for k in self.obs_terms}
        pose = o["task_base_pose"]
        xy, yaw = pose[:, :2], pose[:, 3]
        info = o["task_info"].round().long()
        family, speed_word, gait_word = info[:, 0], info[:, 1], info[:, 2]
        target, distractor = o["task_target_pos"][:, :2], o["task_distractor_pos"][:, :2]
        band = self._bands[gait_word, speed_word]

        goal = target.clone()
        # go_avoid: a waypoint beside the obstacle until the robot is past it
        avoid = family == FAMILY_CODE["go_avoid"]
        if avoid.any():
            obstacle = o["task_obstacle_pos"][:, :2]
            line = target - obstacle
            line = line / line.norm(dim=1, keepdim=True).clamp(min=1e-6)
            normal = torch.stack((-line[:, 1], line[:, 0]), dim=1)
            side = torch.sign(((target - distractor) * normal).sum(dim=1))       # away from the distractor
            side = torch.where(side == 0, torch.ones_like(side), side)
            # first beside the panel short of it (however the robot drifted while turning, it gets
            # clear sideways before it reaches the panel's line), then beside it and a little past it,
            # then to the target
            beside = obstacle + normal * (AVOID_OFFSET * side)[:, None]
            before, past = beside - line * AVOID_BEFORE, beside + line * AVOID_BEYOND
            lateral = ((xy - obstacle) * normal).sum(dim=1) * side
            progress = ((xy - obstacle) * line).sum(dim=1)
            self.cleared_side |= avoid & (lateral > AVOID_OFFSET - 0.3)
            self.passed_obstacle |= avoid & self.cleared_side & (progress > AVOID_BEYOND - 0.1)
            waypoint = torch.where(self.cleared_side[:, None], past, before)
            goal = torch.where((avoid & ~self.passed_obstacle)[:, None], waypoint, goal)
        # stop: intercept the rolling ball
        stop = family == FAMILY_CODE["stop"]
        if stop.any():
            vel = o["task_target_vel"][:, :2]
            dist = (target - xy).norm(dim=1)
            lead = dist / (band + vel.norm(dim=1)).clamp(min=1e-3)
            goal = torch.where(stop[:, None], target + vel * lead[:, None], goal)
        # go_through: line up with the named tunnel's axis before its entrance, then go along it
        through = family == FAMILY_CODE["go_through"]
        if through.any():
            entry = o["task_tunnel_entry"][:, :2]
            approach = entry - torch.tensor([TUNNEL_APPROACH, 0.0], device=self.device)
            lateral = (xy[:, 1] - entry[:, 1]).abs()
            self.in_tunnel_phase |= through & ((xy - approach).norm(dim=1) < 0.2) | \
                (through & (lateral < 0.1) & (xy[:, 0] > approach[:, 0] - 0.1))
            along = torch.stack((torch.maximum(xy[:, 0] + TUNNEL_LOOKAHEAD, entry[:, 0]), entry[:, 1]), dim=1)
            along = torch.where((along[:, 0] > target[:, 0])[:, None], target, along)
            phase_goal = torch.where(self.in_tunnel_phase[:, None], along, approach)
            goal = torch.where(through[:, None], phase_goal, goal)

        rel = goal - xy
        dist = rel.norm(dim=1)
        c, s = torch.cos(yaw), torch.sin(yaw)
        rel_b = torch.stack((c * rel[:, 0] + s * rel[:, 1], -s * rel[:, 0] + c * rel[:, 1]), dim=1)
        bearing = torch.atan2(rel_b[:, 1], rel_b[:, 0])
        direction = rel_b / dist.clamp(min=1e-6)[:, None]
        # hold the speed band: integrate the shortfall of the ground speed along the goal direction
        speed = (o["base_lin_vel"][:, :2] * direction).sum(dim=1)
        self.speed_integral = (self.speed_integral + SPEED_KI * (band - speed) * self.dt).clamp(
            0.0, MAX_COMMAND_SPEED)
        command_speed = torch.minimum(band + self.speed_integral, torch.full_like(band, MAX_COMMAND_SPEED))
        # inside a tunnel no faster than TUNNEL_SPEED (a fast pace sways the base into the walls), and
        # short of the entrance only once the body points along the axis: a robot arriving at the
        # approach point at an angle turns there instead of walking in crooked
        if through.any():
            aligned = torch.clamp(1.0 - _wrap(yaw).abs() / TUNNEL_MAX_YAW, min=0.0)
            before_entry = xy[:, 0] < entry[:, 0]
            tunnel_speed = torch.clamp(command_speed, max=TUNNEL_SPEED) * torch.where(before_entry, aligned, 1.0)
            command_speed = torch.where(self.in_tunnel_phase & through, tunnel_speed, command_speed)
        # arrive at a tunnel's approach point slowly: a fast trot coasts ~0.4 m past a goal and sideways
        # (bound and pronk never get fast enough to coast, and need every second of the 15 s limit)
        if through.any():
            slow = torch.clamp(dist / APPROACH_SLOWDOWN, min=0.25, max=1.0)
            fast_gait = (gait_word == GAIT_WORDS.index("trotting")) | (gait_word == GAIT_WORDS.index("pacing"))
            command_speed = torch.where(through & ~self.in_tunnel_phase & fast_gait, command_speed * slow,
                                        command_speed)
        # turn, then walk: the speed falls with the bearing error (zero beyond 90 degrees), and only a
        # share of it goes sideways - the pace and bound track a lateral command poorly (a pacing robot
        # commanded sideways at the start walked straight on into the go_avoid obstacle)
        command_speed = command_speed * torch.clamp(torch.cos(bearing), min=0.0)
        v = torch.stack((direction[:, 0], LATERAL_SHARE * direction[:, 1]), dim=1) * command_speed[:, None]
        wz = (YAW_GAIN * bearing).clamp(-MAX_YAW_RATE, MAX_YAW_RATE)
        # in the tunnel the body keeps facing along the axis (the goal point is on it)
        # distinguish: turn on the spot toward the named letter
        dist_fam = family == FAMILY_CODE["distinguish"]
        if dist_fam.any():
            rel_t = target - xy
            err = _wrap(torch.atan2(rel_t[:, 1], rel_t[:, 0]) - yaw)
            turn = torch.sign(err) * torch.clamp((YAW_GAIN * err).abs(), min=0.25, max=MAX_YAW_RATE)
            v = torch.where(dist_fam[:, None], torch.zeros_like(v), v)
            wz = torch.where(dist_fam, turn, wz)
        done = (target - xy).norm(dim=1) < SUCCESS_RADIUS
        done = torch.where(through, done & self.in_tunnel_phase & (xy[:, 0] > entry[:, 0] + 0.5) if through.any()
                           else done, done)
        if dist_fam.any():
            err_abs = _wrap(torch.atan2((target - xy)[:, 1], (target - xy)[:, 0]) - yaw).abs()
            done = torch.where(dist_fam, err_abs < math.radians(4.0), done)

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
    """``HierarchicalPolicy(QuardExpert, GaitController)`` for a ``QuardEnv``: a "joint" policy."""
    from quadforge.experts.gait import GaitController
    from quadforge.experts.hierarchical import HierarchicalPolicy

    return HierarchicalPolicy(QuardExpert(env.num_envs, env.dt, env.device),
                              GaitController(env.robot, env.num_envs, env.dt, env.device))


def _load_for_registry(arg: str, ctx: LoadContext) -> QuardExpert:
    if arg:
        raise ValueError(f"--policy quard_expert:{arg}: the QUARD expert takes no argument (the instruction "
                         f"in each episode sets its speed and gait)")
    return QuardExpert(ctx.num_envs, ctx.control_dt, ctx.device)


# `--policy quard_expert` on collect/eval/rollout: a command policy, run over the gait controller
register_policy_kind("quard_expert", _load_for_registry,
                     "the privileged scripted QUARD expert (reads the task_* terms: QUARD tasks only)",
                     needs_path=False)
