"""The gait-conditioned model-based controller: the embedded default expert (no training).

It reads the 15-D walk-these-ways command (``quadforge.layout.COMMAND_NAMES``) and proprioception, and
returns normalised joint actions. Per env and step:

1. a phase oscillator ``t <- t + f*dt (mod 1)``; foot phases follow walk-these-ways,
   FL = t+p+o+b, FR = t+o, RL = t+b, RR = t+p (p, o, b = gait phase, offset, bound); a foot is in
   stance while its phase is below the duty ``duration``, in swing after. After a reset the robot
   stands on four feet for ``settle_s`` before the clock runs; the velocity reference follows the
   command under acceleration limits;
2. swing legs (position control): a cycloid from the measured lift-off point to the Raibert touchdown
   point ``p_td = p_neutral + (T_stance/2) v_i + k (v_meas_i - v_i)`` with ``v_i = v + w_z x p_i``
   (yaw via tangential foot velocities), under a raised-cosine lift of the commanded foot height above
   the ground the stance legs measure, plus a stumble reflex (a swing foot held back by an edge is
   lifted higher); neutral points from the commanded stance width/length. When the observation has
   the privileged ``height_scan`` the swing apex also clears the highest terrain the scan shows along
   the foot's path (``terrain_below``); without it (or on flat ground) the controller is blind;
3. stance legs (force control through the PD): a virtual-model wrench on the base - PI on the
   velocity and yaw-rate error, PD on body height (from stance-leg kinematics, or - with the scan -
   over the scanned terrain under the four neutral footholds, ``terrain_at``) and on pitch/roll (from
   projected gravity) towards the commanded values, plus the weight - distributed over the stance
   feet by weighted least squares, clipped to the friction cone, mapped to joint torques
   ``tau = -J^T f`` and sent as targets ``q + tau / Kp``. The PD legs (Kp 20) are only ~160 N/m stiff
   horizontally, so a purely kinematic stance sweep sags and slides instead of walking; forces do not;
4. leg kinematics from ``envs.kinematics`` (FK/IK, Jacobians by central differences of the FK, all
   in one batched FK pass), for Go1 and Aliengo alike (gains are per unit mass/inertia).

Every gain is a field of ``GaitGains`` with the reason for its value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch

from quadforge.envs.config import GAITS
from quadforge.envs.kinematics import LegKinematics
from quadforge.layout import COMMAND_NAMES, HEIGHT_SCAN_X, HEIGHT_SCAN_Y, LEGS, NUM_JOINTS
from quadforge.experts.policy import given_terms
from quadforge.tensors import check_compiler, constant_cache, device_constant, row_ids, set_rows

_GRAVITY = 9.81


@dataclass(frozen=True)
class GaitDefaults:
    """Gait parameters used where the command leaves them at zero (joystick-only commands).

    Values follow walk-these-ways' Go1 defaults; stance width/length default to the robot's own
    hip geometry (None)."""

    frequency: float = 3.0        # Hz; walk-these-ways' default trot
    duration: float = 0.5         # stance fraction of the cycle
    swing_height: float = 0.08    # m, foot clearance at mid-swing
    stance_width: float | None = None   # m between left and right feet; None -> 2*(hip y + abduction)
    stance_length: float | None = None  # m between front and rear feet; None -> hip x spacing


@dataclass(frozen=True)
class GaitGains:
    """Feedback gains, each with the reason for its value (tuned on LeggedEnv, flat then rough).

    Stance-force gains are accelerations per unit error (the controller multiplies them by the robot's
    mass or inertia), so one set serves Go1 and Aliengo."""

    # Raibert touchdown gain (s): the touchdown point moves by k*(v_meas - v_cmd). sqrt(h/g) ~ 0.17 s
    # is the capture-point value for a 0.3 m base; about half of it damps velocity errors without the
    # step-to-step oscillation a full capture-point step causes.
    raibert_k: float = 0.08
    # Horizontal velocity loop of the stance force (1/s): F_xy = m*(kv*e + ki*int e). The legs' Cartesian
    # stiffness under Kp 20 is only ~160 N/m horizontally, so velocity is tracked by force, not by a
    # kinematic foot sweep; the integral removes the residual drag of swing legs and slipping feet.
    vel_kp: float = 4.0
    vel_ki: float = 4.0
    vel_integral_limit: float = 0.5       # m/s equivalent, anti-windup
    # Yaw-rate loop (1/s): tangential stance forces for tau_z = I_zz*(kp*e + ki*int e).
    yaw_kp: float = 6.0
    yaw_ki: float = 4.0
    yaw_integral_limit: float = 1.0
    # Body height PD (1/s^2, 1/s) on the base height the stance legs measure: omega_n = 10 rad/s at
    # damping ~0.8, well below the 50 Hz control rate.
    height_kp: float = 100.0
    height_kd: float = 16.0
    # Attitude PD (1/s^2, 1/s) on roll/pitch from projected gravity: faster than the trot's half period
    # (0.17 s at 3 Hz) so the base is level again at every touchdown.
    att_kp: float = 150.0
    att_kd: float = 20.0
    # Wrench weights in the least-squares force distribution: torques (N m) count this much more than
    # forces (N) - about 1/lever^2 for 0.2 m levers - and a small ridge keeps a 2-foot stance solvable.
    torque_weight: float = 20.0
    force_ridge: float = 1e-3
    friction: float = 0.6                 # friction-cone bound on |f_xy| / f_z (below the floor's 1.0)
    # Shape of the swing lift (see swing_lift): 2 = raised cosine.
    lift_sharpness: float = 2.0
    # Stumble reflex: a swing foot lagging its path by more than stumble_lag (m; normal PD lag is
    # 2-3 cm) is lifted by stumble_gain x the excess, at most stumble_max (m).
    stumble_gain: float = 2.0
    stumble_lag: float = 0.04
    stumble_max: float = 0.08
    stumble_lag_per_speed: float = 0.03   # s: extra lag allowed per m/s of commanded speed
    # Height-scan swing planning (privileged ``height_scan``, used when the observation has it): the
    # swing apex clears the highest terrain the scan shows along the foot's path (lift-off to
    # touchdown, the 2x2 grid cells around each sample) by scan_clearance (m) over the foot radius,
    # raising the commanded swing height by at most scan_max_extra (m). 0 extra turns it off.
    scan_clearance: float = 0.04
    scan_max_extra: float = 0.15
    scan_samples: int = 6
    # Body height over the scanned terrain (privileged ``height_scan``): the height loop's estimate of
    # the base height blends, with this weight, from the ground the stance feet measure towards the
    # base height over the mean scanned terrain under the four neutral footholds (``terrain_at``).
    # Why: a stance foot over a pit measures nothing, so the stance-foot estimate keeps the body at full
    # height and the pit's leg - Go1's reaches ~0.40 m below the hip, the body stands 0.30 m, a pit is
    # 0.05-0.14 m deep - lands late or hangs; over the terrain under all four footholds the body sinks
    # half a pit when it straddles one. Obstacles no-fall 70 % -> 82 % (docs/experts.md). 0 turns it off.
    scan_body_height: float = 1.0
    # Each foothold's scanned terrain counts at most this far (m) from the ground the stance feet measure:
    # deeper than a leg can reach (stepping-stone and gap pits are 1 m deep) is not ground to stand over.
    scan_height_range: float = 0.15
    # Wider stance on uneven ground (privileged ``height_scan``): where the scanned terrain spans more
    # than scan_uneven (m), the stance is this much (m) wider than commanded (at most 0.6 m). Why:
    # obstacle falls are roll-overs where the left and right feet stand 19-23 cm apart in height, and
    # a trot's diagonal stance pair makes roll moment about its own line only from friction-clipped
    # horizontal forces (docs/experts.md); a wider stance turns that line further from the walking
    # direction and puts more lever under the body. Flat ground (zero spread) is untouched. 0 = off.
    scan_stance_width: float = 0.12
    scan_uneven: float = 0.005
    # Walking trot and a lower body on uneven ground (privileged ``height_scan``, same gate as the wider
    # stance): there each foot stands at least scan_duty of the cycle - two 4-foot support phases of
    # (scan_duty - 0.5) of a trot cycle each, so the support is not a bare diagonal line all the time -
    # and the body stands scan_body_drop (m) lower, leaving the low-side legs more reach. Obstacles
    # no-fall over 32 seeds of the sweep alone 86.6 % -> 91.4 % (duty 0.6 alone, 0.65, 0.7, a lower or
    # higher frequency, the walk gait, drops of 0.02-0.05 m: docs/experts.md). 0 / "" = off.
    scan_duty: float = 0.6
    scan_frequency: float = 0.0           # Hz on uneven ground (2.5 / 3.5 tried: no better than 3)
    scan_gait: str = ""                   # a GAITS name on uneven ground ("walk" tried: worse)
    scan_body_drop: float = 0.03
    # With an obstacle on the path the foot first rises, then moves: horizontal progress waits for this
    # fraction of the swing (retract before protract), so the toe does not hit the edge it is clearing.
    scan_delay: float = 0.0
    # Swing: the foot finishes this far (m) below the estimated ground so touchdown is never late.
    touchdown_depth: float = 0.02
    # After a reset the robot stands on all four feet for this long (s) before the gait clock starts:
    # envs reset with random joint poses a few cm above the ground.
    settle_s: float = 0.3
    # Acceleration limits of the velocity reference (m/s^2, rad/s^2): ~0.2 g, what two legs push at
    # the friction bound without slipping; 1 m/s is reached in 0.5 s.
    max_lin_acc: float = 2.0
    max_yaw_acc: float = 4.0
    # Clamp on velocity commands (m/s, rad/s): beyond these a step no longer fits the leg's workspace.
    max_lin_vel: float = 1.5
    max_yaw_rate: float = 1.5

@dataclass
class GaitParams:
    """Per-env gait parameters resolved from the command (all (N,) tensors)."""

    vx: torch.Tensor
    vy: torch.Tensor
    wz: torch.Tensor
    height: torch.Tensor
    frequency: torch.Tensor
    offsets: torch.Tensor      # (N, 4) foot phase offsets in LEGS order
    duration: torch.Tensor
    swing_height: torch.Tensor
    pitch: torch.Tensor
    roll: torch.Tensor
    stance_width: torch.Tensor
    stance_length: torch.Tensor


def foot_offsets(phase: torch.Tensor, offset: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """(N,) walk-these-ways phase/offset/bound -> (N, 4) foot phase offsets in LEGS order."""
    by_leg = {"FL": phase + offset + bound, "FR": offset, "RL": bound, "RR": phase}
    return torch.stack([by_leg[leg] for leg in LEGS], dim=-1)


def foot_phases(t: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """(N,) clock and (N, 4) offsets -> (N, 4) foot phases in [0, 1)."""
    return torch.remainder(t.unsqueeze(-1) + offsets, 1.0)


def cycloid(w: torch.Tensor) -> torch.Tensor:
    """Horizontal swing progress for w in [0, 1]: zero velocity and acceleration at both ends."""
    return w - torch.sin(2 * math.pi * w) / (2 * math.pi)


def swing_lift(w: torch.Tensor, sharpness: float = 2.0) -> torch.Tensor:
    """Vertical swing profile ``sin(pi w)^sharpness`` in [0, 1]: 0 at lift-off and touchdown, 1 at
    mid-swing. 2 is the raised cosine (zero vertical velocity at both ends); below 2 the foot rises
    and drops faster and stays high longer while it moves forward."""
    return torch.sin(math.pi * w.clamp(0.0, 1.0)).clamp(min=0.0) ** sharpness


def tilt_from_gravity(g_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Projected gravity (N, 3) -> (roll, pitch) of R = Rz Ry(pitch) Rx(roll); pitch > 0 is nose down."""
    pitch = torch.asin((g_b[:, 0]).clamp(-1.0, 1.0))
    roll = torch.atan2(-g_b[:, 1], -g_b[:, 2])
    return roll, pitch


def tilt_matrix(roll: torch.Tensor, pitch: torch.Tensor) -> torch.Tensor:
    """(N,) roll, pitch -> (N, 3, 3) R = Ry(pitch) Rx(roll): base orientation in the yaw frame."""
    cr, sr, cp, sp = torch.cos(roll), torch.sin(roll), torch.cos(pitch), torch.sin(pitch)
    zero = torch.zeros_like(roll)
    return torch.stack([
        torch.stack([cp, sp * sr, sp * cr], -1),
        torch.stack([zero, cr, -sr], -1),
        torch.stack([-sp, cp * sr, cp * cr], -1),
    ], dim=-2)


# command entries that cannot be zero: a zero there reads as "the default" (frequency, duty, swing height,
# stance width and length), so a partly filled command still walks
_ZERO_IS_DEFAULT = frozenset({"gait_frequency", "gait_duration", "foot_swing_height", "stance_width", "stance_length"})


@constant_cache
def _command_columns(defaults: GaitDefaults, gait: str, width0: float, length0: float,
                     gains: GaitGains) -> tuple[tuple, ...]:
    """Per command column (``COMMAND_NAMES`` order): whether a joystick row reads the default there,
    whether a zero there reads as the default, the default, and the clamp's low and high bounds. The
    same for every step of a controller: made once, not at every ``act``."""
    p0, o0, b0 = GAITS[gait]
    fallback = {"body_height": 0.0, "gait_frequency": defaults.frequency, "gait_phase": p0, "gait_offset": o0,
                "gait_bound": b0, "gait_duration": defaults.duration, "foot_swing_height": defaults.swing_height,
                "body_pitch": 0.0, "body_roll": 0.0, "stance_width": width0, "stance_length": length0}
    lin, yaw = gains.max_lin_vel, gains.max_yaw_rate
    # body_height is an offset from the robot's nominal standing height (walk-these-ways)
    bounds = {"lin_vel_x": (-lin, lin), "lin_vel_y": (-lin, lin), "ang_vel_yaw": (-yaw, yaw),
              "body_height": (-0.15, 0.1), "gait_frequency": (1.0, 5.0), "gait_duration": (0.2, 0.8),
              "foot_swing_height": (0.0, 0.3), "body_pitch": (-0.4, 0.4), "body_roll": (-0.4, 0.4),
              "stance_width": (0.05, 0.6), "stance_length": (0.2, 0.7)}
    unbounded = (-math.inf, math.inf)
    return (tuple(k in fallback for k in COMMAND_NAMES), tuple(k in _ZERO_IS_DEFAULT for k in COMMAND_NAMES),
            tuple(fallback.get(k, 0.0) for k in COMMAND_NAMES),
            tuple(bounds.get(k, unbounded)[0] for k in COMMAND_NAMES),
            tuple(bounds.get(k, unbounded)[1] for k in COMMAND_NAMES))


def resolve_params(commands: torch.Tensor, defaults: GaitDefaults, gait: str, nominal_height: float,
                   width0: float, length0: float, gains: GaitGains) -> GaitParams:
    """(N, 15) commands -> per-env gait parameters.

    A row whose entries 3.. are all zero is a joystick command: it walks the controller's own gait
    with ``defaults``. Otherwise each entry is read as walk-these-ways defines it; entries that cannot
    be zero (frequency, duration, swing height, stance width/length) fall back to the default when
    zero, so a partly filled command still walks. Each entry is then clamped to what the controller
    can execute. All columns go through each operation together (a few calls, not a dozen per column)."""
    c = commands
    dtypes = (torch.bool, torch.bool, c.dtype, c.dtype, c.dtype)
    reads_default, zero_is_default, fallback, low, high = (
        device_constant(values, dtype, c.device)
        for values, dtype in zip(_command_columns(defaults, gait, width0, length0, gains), dtypes))
    joystick = (c[:, 3:] == 0).all(dim=-1, keepdim=True)
    use_default = (joystick & reads_default) | ((c == 0) & zero_is_default)
    read = torch.where(use_default, fallback, c).clamp(low, high)
    col = dict(zip(COMMAND_NAMES, read.unbind(-1)))
    return GaitParams(
        vx=col["lin_vel_x"], vy=col["lin_vel_y"], wz=col["ang_vel_yaw"],
        height=nominal_height + col["body_height"],
        frequency=col["gait_frequency"],
        offsets=foot_offsets(col["gait_phase"], col["gait_offset"], col["gait_bound"]),
        duration=col["gait_duration"],
        swing_height=col["foot_swing_height"],
        pitch=col["body_pitch"],
        roll=col["body_roll"],
        stance_width=col["stance_width"],
        stance_length=col["stance_length"],
    )


def _scan_cells(scan: torch.Tensor, xy: torch.Tensor):
    """The height scan as a terrain grid and points in its cell units, for ``terrain_below``/``terrain_at``:
    (top (N, 187) terrain z relative to the base, x-major as the scan, u and v (N, P) fractional grid
    coordinates of the points (unclamped))."""
    step = HEIGHT_SCAN_X[1] - HEIGHT_SCAN_X[0]
    flat = xy.reshape(xy.shape[0], -1, 2)                                       # (N, P, 2)
    u = (flat[..., 0] - HEIGHT_SCAN_X[0]) / step
    v = (flat[..., 1] - HEIGHT_SCAN_Y[0]) / step
    return -scan, u, v


def _four_cells(top: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The scan's samples at grid cells (row, col), (row, col+1), (row+1, col), (row+1, col+1), each
    index clamped to the grid: ``top`` (N, 187), row and col (N, P) integer -> four (N, P). One gather
    for all four, so a GPU launches one, not four."""
    nx, ny = len(HEIGHT_SCAN_X), len(HEIGHT_SCAN_Y)
    step = device_constant((0, 1), torch.int64, top.device)
    rows = (row.unsqueeze(-1) + step).clamp(0, nx - 1).unsqueeze(-1)           # (N, P, 2, 1)
    cols = (col.unsqueeze(-1) + step).clamp(0, ny - 1).unsqueeze(-2)           # (N, P, 1, 2)
    cells = (rows * ny + cols).view(top.shape[0], -1)                           # (N, P*4)
    return top.gather(1, cells).view(*row.shape, 4).unbind(-1)


def terrain_below(scan: torch.Tensor, xy: torch.Tensor) -> torch.Tensor:
    """Highest terrain near points, from the privileged height scan.

    scan (N, 187): ``height_scan`` (base z - terrain z on legged_gym's 17 x 11 grid, x-major, in the
    yaw frame), xy (N, ..., 2) points in the yaw frame relative to the base. Returns (N, ...) terrain z
    relative to the base: the highest of the four grid samples around each point (conservative: the
    MuJoCo heightfield is piecewise linear between 0.1 m vertices, so an edge between two samples
    belongs to the higher one). Points off the grid take its border."""
    top, u, v = _scan_cells(scan, xy)
    h00, h01, h10, h11 = _four_cells(top, u.floor().long(), v.floor().long())
    return torch.maximum(torch.maximum(torch.maximum(h00, h01), h10), h11).view(xy.shape[:-1])


def terrain_at(scan: torch.Tensor, xy: torch.Tensor) -> torch.Tensor:
    """Terrain z (relative to the base) at points of the yaw frame, bilinear in the height scan.

    scan (N, 187) as for ``terrain_below``, xy (N, ..., 2); returns (N, ...). Unlike ``terrain_below``
    (the highest of the four samples, for clearance) this is the best estimate of the surface itself:
    exact on a plane, between the samples at an edge. Points off the grid take its border."""
    nx, ny = len(HEIGHT_SCAN_X), len(HEIGHT_SCAN_Y)
    top, u, v = _scan_cells(scan, xy)
    u, v = u.clamp(0, nx - 1), v.clamp(0, ny - 1)
    i, j = u.floor().clamp(max=nx - 2), v.floor().clamp(max=ny - 2)
    fu, fv = u - i, v - j
    h00, h01, h10, h11 = _four_cells(top, i.long(), j.long())
    near = h00 * (1 - fv) + h01 * fv
    far = h10 * (1 - fv) + h11 * fv
    return (near * (1 - fu) + far * fu).view(xy.shape[:-1])


def skew(r: torch.Tensor) -> torch.Tensor:
    """(..., 3) -> (..., 3, 3) matrix of the cross product r x ."""
    x, y, z = r.unbind(-1)
    zero = torch.zeros_like(x)
    return torch.stack([torch.stack([zero, -z, y], -1),
                        torch.stack([z, zero, -x], -1),
                        torch.stack([-y, x, zero], -1)], dim=-2)


def distribute_wrench(feet: torch.Tensor, stance: torch.Tensor, wrench: torch.Tensor,
                      torque_weight: float, ridge: float) -> torch.Tensor:
    """Ground forces on the stance feet that best produce a body wrench (weighted least squares).

    feet (N, 4, 3) foot positions relative to the base, stance (N, 4) bool, wrench (N, 6) = total
    force and torque about the base origin, all in one frame. Minimises
    ``|A f - w|_S^2 + ridge |f|^2`` with ``A = [I ...; [r_i]x ...]``; swing feet get zero force.
    Returns (N, 4, 3)."""
    n = feet.shape[0]
    eye = torch.eye(3, dtype=feet.dtype, device=feet.device).expand(n, 4, 3, 3)
    blocks = torch.cat([eye, skew(feet)], dim=-2) * stance[..., None, None]   # (N, 4, 6, 3)
    a = blocks.permute(0, 2, 1, 3).reshape(n, 6, 12)                           # (N, 6, 12)
    w = float(torque_weight)
    s = device_constant((1.0, 1.0, 1.0, w, w, w), feet.dtype, feet.device)
    ata = a.transpose(1, 2) @ (s[:, None] * a) + ridge * torch.eye(12, dtype=feet.dtype, device=feet.device)
    atb = a.transpose(1, 2) @ (s * wrench).unsqueeze(-1)                      # (N, 12, 1)
    # solve_ex: the ridge keeps ata positive definite, and solve's singularity check is a host read on a GPU
    return torch.linalg.solve_ex(ata, atb)[0].view(n, 4, 3)


def robot_inertia(robot) -> tuple[float, float, float]:
    """Principal-axis (Ixx, Iyy, Izz) of the whole robot about its centre of mass in the default pose,
    from the MJCF (kg m^2)."""
    import mujoco
    import numpy as np

    model = robot.load_model()
    data = mujoco.MjData(model)
    data.qpos[7:] = robot.default_joint_pos
    mujoco.mj_forward(model, data)
    com = data.subtree_com[1]
    total = np.zeros((3, 3))
    for b in range(1, model.nbody):
        rot = data.ximat[b].reshape(3, 3)
        r = data.xipos[b] - com
        total += rot @ np.diag(model.body_inertia[b]) @ rot.T
        total += model.body_mass[b] * (r @ r * np.eye(3) - np.outer(r, r))
    return float(total[0, 0]), float(total[1, 1]), float(total[2, 2])


class GaitController:
    """Model-based gait controller; meets ``experts.policy.Policy`` with action_space "joint"."""

    # height_scan is privileged and optional: read when the observation has it (swing planning over
    # obstacles), blind without it
    required_terms = ("commands", "base_lin_vel", "base_ang_vel", "projected_gravity", "dof_pos", "dof_vel")
    obs_terms = required_terms + ("height_scan",)
    action_space = "joint"
    action_dim = NUM_JOINTS

    def __init__(self, robot, num_envs: int, dt: float = 0.02, device: str | torch.device = "cpu",
                 gait: str = "trot", defaults: GaitDefaults | None = None, gains: GaitGains | None = None):
        if gait not in GAITS:
            raise ValueError(f"unknown gait {gait!r}; allowed: {sorted(GAITS)}")
        if gains is not None and gains.scan_gait and gains.scan_gait not in GAITS:
            raise ValueError(f"GaitGains.scan_gait {gains.scan_gait!r} unknown; allowed: '' or {sorted(GAITS)}")
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if not dt > 0:
            raise ValueError(f"dt must be > 0 seconds, got {dt}")
        self.robot, self.num_envs, self.dt, self.gait = robot, int(num_envs), float(dt), gait
        self.device = torch.device(device)
        self.defaults = defaults or GaitDefaults()
        self.gains = gains or GaitGains()
        self.policy_id = f"gait:{gait}"
        f32 = dict(dtype=torch.float32, device=self.device)
        self.legs = LegKinematics(robot, device=self.device)
        self.default_q = torch.as_tensor(robot.default_joint_pos, **f32)
        self.action_scale = float(robot.action_scale)
        self.kp = float(robot.kp)
        ranges = torch.as_tensor(robot.joint_ranges, **f32)
        margin = 0.02  # rad kept off the joint limits so the PD never drives into the stops
        self.q_low, self.q_high = ranges[:, 0] + margin, ranges[:, 1] - margin
        self.torque_limits = torch.as_tensor(robot.torque_limits, **f32)
        hips = torch.as_tensor(robot.hip_offsets, **f32)                # (4, 3)
        self.hip_x_centre = hips[:, 0].mean()
        self.side_x = torch.sign(hips[:, 0])                            # +1 front, -1 rear
        self.side_y = torch.sign(hips[:, 1])                            # +1 left, -1 right
        stand = self.legs.forward(self.default_q)                       # (4, 3) default-pose feet
        self.width0 = float(2 * stand[:, 1].abs().mean())
        self.length0 = float(hips[:, 0].max() - hips[:, 0].min())
        self.foot_radius = float(robot.foot_radius)
        self.mass = float(robot.total_mass)
        self.inertia = torch.tensor(robot_inertia(robot), **f32)       # (Ixx, Iyy, Izz)
        self.max_step = 0.6 * float(robot.thigh_length)                 # m, touchdown shift bound
        n = self.num_envs
        self.clock = torch.zeros(n, **f32)
        self.elapsed = torch.zeros(n, **f32)              # s since reset
        self.liftoff_xy = torch.zeros(n, 4, 2, **f32)     # measured foot xy (H) at lift-off
        self.was_stance = torch.ones(n, 4, dtype=torch.bool, device=self.device)
        self.v_ref = torch.zeros(n, 3, **f32)             # filtered (vx, vy, wz) reference
        self.stumble = torch.zeros(n, 4, **f32)           # extra swing lift from the stumble reflex (m)
        self.vel_integral = torch.zeros(n, 2, **f32)
        self.yaw_integral = torch.zeros(n, **f32)
        self.ground = torch.full((n,), -float(robot.nominal_base_height) + self.foot_radius, **f32)
        self._control = self._control_law     # torch.compile'd by compile_expert

    # -- Policy protocol ----------------------------------------------------------------------------
    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        ids = row_ids(env_ids, self.num_envs, self.device, check_range="host")   # None: all; a mask: its rows
        # act() replaces most of these each step: under a caller's torch.inference_mode they are made there
        self.clock = set_rows(self.clock, ids, 0.0)
        self.elapsed = set_rows(self.elapsed, ids, 0.0)
        self.vel_integral = set_rows(self.vel_integral, ids, 0.0)
        self.v_ref = set_rows(self.v_ref, ids, 0.0)
        self.stumble = set_rows(self.stumble, ids, 0.0)
        self.yaw_integral = set_rows(self.yaw_integral, ids, 0.0)
        self.was_stance = set_rows(self.was_stance, ids, True)
        self.ground = set_rows(self.ground, ids, -float(self.robot.nominal_base_height) + self.foot_radius)

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        missing = [k for k in self.required_terms if k not in obs]
        if missing:
            raise KeyError(f"GaitController needs observation terms {missing}; {given_terms(obs)}")
        term = {k: obs[k].to(self.device, torch.float32) for k in self.obs_terms if k in obs}
        if term["commands"].shape != (self.num_envs, len(COMMAND_NAMES)):
            raise ValueError(f"commands must be ({self.num_envs}, {len(COMMAND_NAMES)}), "
                             f"got {tuple(term['commands'].shape)}")
        return self._control(term)

    def compile_expert(self) -> None:
        """Run the control law through ``torch.compile`` from now on (``--compile-expert``; off by default).

        Its ~420 small kernels a step become a few fused ones: on a GPU that many fewer launches, on this
        2-core CPU act about 4x quicker at 16 envs (docs/experts.md). The actions equal the eager ones to
        about 1e-3 (normalised), not bit for bit: the Jacobian's float32 central differences divide by
        2e-4 and so magnify a fused kernel's last-bit rounding; every number in the docs is the eager
        expert's. The first act compiles (~30 s on 2 cores from an empty inductor cache, a few s from a
        warm one); Dynamo keeps one graph per controller and grad mode, and past its recompile limit (8
        per process) a further controller acts eagerly, with Dynamo's warning. Without the device's kernel
        compiler (C++ on the CPU, Triton on a GPU) a clear error now."""
        check_compiler("--compile-expert", self.device)
        self._control = torch.compile(self._control_law, dynamic=False, options={"size_asserts": False})

    def _control_law(self, term: dict[str, torch.Tensor]) -> torch.Tensor:
        """Normalised joint actions from the checked, float32 terms; tensor arithmetic only (``compile_expert``)."""
        g, dt = self.gains, self.dt
        prm = resolve_params(term["commands"], self.defaults, self.gait, float(self.robot.nominal_base_height),
                             self.width0, self.length0, g)

        scan = term.get("height_scan")
        self._adapt_to_uneven_ground(prm, scan)

        # measured state in the horizontal frame H (base origin, yaw-aligned, gravity-levelled)
        roll, pitch = tilt_from_gravity(term["projected_gravity"])
        rot = tilt_matrix(roll, pitch)                                            # (N, 3, 3) body -> H
        vel = (rot @ term["base_lin_vel"].unsqueeze(-1)).squeeze(-1)             # (N, 3)
        omega = (rot @ term["base_ang_vel"].unsqueeze(-1)).squeeze(-1)           # (N, 3)
        q_meas = term["dof_pos"] + self.default_q
        feet_b, jac = self.legs.forward_and_jacobian(q_meas)                     # (N, 4, 3), (N, 4, 3, 3)
        feet_h = torch.einsum("nij,nfj->nfi", rot, feet_b)                       # (N, 4, 3)

        # gait clock: stand on four feet while settling after a reset, then run the oscillator
        self.elapsed += dt
        running = self.elapsed > g.settle_s
        self.clock = torch.where(running, torch.remainder(self.clock + prm.frequency * dt, 1.0), self.clock)
        phase = foot_phases(self.clock, prm.offsets)                              # (N, 4)
        duty = prm.duration.unsqueeze(-1)
        stance = (phase < duty) | ~running.unsqueeze(-1)
        swing_w = ((phase - duty) / (1 - duty)).clamp(0.0, 1.0)                  # swing progress

        # the velocity reference follows the command under acceleration limits, and is zero while settling:
        # a step change of command would otherwise ask the legs for more than a stride can deliver
        target = torch.stack([prm.vx, prm.vy, prm.wz], -1) * running.unsqueeze(-1)
        step = device_constant((g.max_lin_acc, g.max_lin_acc, g.max_yaw_acc), torch.float32, self.device) * dt
        self.v_ref = self.v_ref + (target - self.v_ref).clamp(-step, step)
        prm.vx, prm.vy, prm.wz = self.v_ref.unbind(-1)

        # ground height (foot-centre z in H) as the feet that stood last step measure it
        n_was = self.was_stance.float().sum(-1)
        measured_ground = (feet_h[..., 2] * self.was_stance).sum(-1) / n_was.clamp(min=1.0)
        self.ground = torch.where(n_was > 0, measured_ground, self.ground)
        height = self.foot_radius - self.ground                                   # base over ground
        neutral = self._neutral(prm)                                             # (N, 4, 2)
        if scan is not None and g.scan_body_height > 0:
            surface = (self.ground - self.foot_radius).unsqueeze(-1)              # what the feet measure
            footholds = terrain_at(scan, neutral)
            footholds = torch.minimum(torch.maximum(footholds, surface - g.scan_height_range),
                                      surface + g.scan_height_range)
            over_terrain = -footholds.mean(-1)
            height = height + g.scan_body_height * (over_terrain - height)

        q_swing = self._swing_targets(prm, neutral, stance, swing_w, feet_h, vel, omega, rot, scan)
        q_stance = self._stance_targets(prm, stance, feet_h, jac, q_meas, vel, omega, roll, pitch, height, rot)
        self.was_stance = stance
        q = torch.where(stance.repeat_interleave(3, dim=-1), q_stance, q_swing)
        q = torch.maximum(torch.minimum(q, self.q_high), self.q_low)
        return (q - self.default_q) / self.action_scale

    def _adapt_to_uneven_ground(self, prm: GaitParams, scan: torch.Tensor | None) -> None:
        """Where the privileged scan spans more than ``scan_uneven``: a wider stance, a stance duty of at
        least ``scan_duty``, a body ``scan_body_drop`` lower and (when set) another stepping frequency
        and gait. In place on ``prm``; flat scans and blind controllers are untouched."""
        g = self.gains
        if scan is None:
            return
        uneven = (scan.amax(-1) - scan.amin(-1)) > g.scan_uneven
        if g.scan_stance_width > 0:
            prm.stance_width = torch.where(uneven, prm.stance_width + g.scan_stance_width,
                                           prm.stance_width).clamp(max=0.6)
        if g.scan_duty > 0:
            prm.duration = torch.where(uneven, prm.duration.clamp(min=g.scan_duty), prm.duration)
        if g.scan_frequency > 0:
            prm.frequency = torch.where(uneven, torch.full_like(prm.frequency, g.scan_frequency), prm.frequency)
        if g.scan_body_drop > 0:
            prm.height = torch.where(uneven, prm.height - g.scan_body_drop, prm.height)
        if g.scan_gait:
            offsets = foot_offsets(*(torch.full_like(prm.duration, v) for v in GAITS[g.scan_gait]))
            prm.offsets = torch.where(uneven.unsqueeze(-1), offsets, prm.offsets)

    def _neutral(self, prm: GaitParams) -> torch.Tensor:
        """(N, 4, 2) neutral footholds in the horizontal frame, from the commanded stance width/length."""
        return torch.stack([
            self.hip_x_centre + self.side_x * prm.stance_length.unsqueeze(-1) / 2,
            self.side_y * prm.stance_width.unsqueeze(-1) / 2], dim=-1)

    # -- swing: cycloid from lift-off to the Raibert touchdown point ---------------------------------
    def _swing_targets(self, prm: GaitParams, neutral, stance, w, feet_h, vel, omega, rot, scan) -> torch.Tensor:
        """``neutral`` (N, 4, 2): ``_neutral(prm)``, the footholds the touchdown points start from."""
        g = self.gains
        v_cmd = torch.stack([prm.vx, prm.vy], -1).unsqueeze(1)                   # (N, 1, 2)
        # each foot's velocity over the ground: base velocity + yaw rate x foot position
        tangential = torch.stack([-neutral[..., 1], neutral[..., 0]], -1)        # (N, 4, 2)
        v_cmd_i = v_cmd + prm.wz.view(-1, 1, 1) * tangential
        v_meas_i = vel[:, None, :2] + omega[:, 2].view(-1, 1, 1) * tangential
        t_stance = (prm.duration / prm.frequency).view(-1, 1, 1)
        shift = (t_stance / 2) * v_cmd_i + g.raibert_k * (v_meas_i - v_cmd_i)
        touchdown = neutral + shift.clamp(-self.max_step, self.max_step)
        lifting = ~stance & self.was_stance
        self.liftoff_xy = torch.where(lifting.unsqueeze(-1), feet_h[..., :2], self.liftoff_xy)
        ground = self.ground.unsqueeze(-1)                                       # (N, 1) foot-centre z
        extra = self._scan_lift(scan, touchdown, ground + prm.swing_height.unsqueeze(-1))
        progress = w
        if g.scan_delay > 0:   # over an obstacle: lift first, then move forward
            delayed = ((w - g.scan_delay) / (1 - g.scan_delay)).clamp(0.0, 1.0)
            progress = torch.where(extra > 0, delayed, w)
        xy = self.liftoff_xy + (touchdown - self.liftoff_xy) * cycloid(progress).unsqueeze(-1)
        # heights from the measured ground, so body sag never eats the clearance
        steep_lift = swing_lift(w, 0.5)                                          # for the extra lifts
        z = ground + prm.swing_height.unsqueeze(-1) * swing_lift(w, g.lift_sharpness) \
            - g.touchdown_depth * w + extra * steep_lift
        # stumble reflex: a swing foot held back (an edge in its way) is lifted higher, by how far it lags
        # its path beyond the normal PD tracking lag; the lift is remembered for the rest of the swing
        if g.stumble_gain > 0:
            # the normal PD lag grows with the swing speed, so does the threshold
            speed = torch.stack([prm.vx, prm.vy], -1).norm(dim=-1, keepdim=True)
            lag = ((xy - feet_h[..., :2]).norm(dim=-1) - g.stumble_lag - g.stumble_lag_per_speed * speed).clamp(min=0.0)
            active = ~stance & (w > 0.1) & (w < 0.8)
            self.stumble = torch.where(stance, torch.zeros_like(self.stumble),
                                       torch.maximum(self.stumble, (g.stumble_gain * lag * active).clamp(max=g.stumble_max)))
            z = z + self.stumble * steep_lift
        foot_h = torch.cat([xy, z.unsqueeze(-1)], dim=-1)                        # (N, 4, 3)
        foot_b = torch.einsum("nji,nfj->nfi", rot, foot_h)                       # R^T p
        return self.legs.inverse(foot_b)

    def _scan_lift(self, scan, touchdown, apex) -> torch.Tensor:
        """Extra swing lift (N, 4) that clears the terrain the height scan shows between lift-off and
        touchdown; ``apex`` (N, 1 or 4): the foot-centre height the swing reaches without it. Zeros
        without a scan. (Raising the touchdown end to a higher landing spot too was tried and made
        both terrains worse: the foot then lands late on the max-of-4-cells estimate.)"""
        g = self.gains
        if scan is None or g.scan_max_extra <= 0:
            return torch.zeros_like(touchdown[..., 0])
        s = torch.linspace(0.0, 1.0, g.scan_samples, device=self.device).view(1, 1, -1, 1)
        path = self.liftoff_xy.unsqueeze(2) + (touchdown - self.liftoff_xy).unsqueeze(2) * s   # (N, 4, S, 2)
        top = terrain_below(scan, path).amax(-1)                                  # (N, 4) terrain z
        return (top + self.foot_radius + g.scan_clearance - apex).clamp(0.0, g.scan_max_extra)

    # -- stance: a virtual-model wrench, distributed over the stance feet, as joint torques ----------
    def _stance_targets(self, prm: GaitParams, stance, feet_h, jac, q_meas, vel, omega, roll, pitch,
                        height, rot) -> torch.Tensor:
        """``jac`` (N, 4, 3, 3): the legs' Jacobians at ``q_meas``, from ``LegKinematics.forward_and_jacobian``."""
        g, dt, m = self.gains, self.dt, self.mass
        e_v = torch.stack([prm.vx, prm.vy], -1) - vel[:, :2]
        self.vel_integral = (self.vel_integral + e_v * dt).clamp(-g.vel_integral_limit, g.vel_integral_limit)
        e_wz = prm.wz - omega[:, 2]
        self.yaw_integral = (self.yaw_integral + e_wz * dt).clamp(-g.yaw_integral_limit, g.yaw_integral_limit)
        force = torch.cat([
            m * (g.vel_kp * e_v + g.vel_ki * self.vel_integral),
            (m * (_GRAVITY + g.height_kp * (prm.height - height) - g.height_kd * vel[:, 2])).unsqueeze(-1),
        ], dim=-1)                                                                # (N, 3)
        torque = self.inertia * torch.stack([
            g.att_kp * (prm.roll - roll) - g.att_kd * omega[:, 0],
            g.att_kp * (prm.pitch - pitch) - g.att_kd * omega[:, 1],
            g.yaw_kp * e_wz + g.yaw_ki * self.yaw_integral,
        ], dim=-1)                                                                # (N, 3)
        f = distribute_wrench(feet_h, stance, torch.cat([force, torque], -1), g.torque_weight, g.force_ridge)
        # unilateral contact and friction cone
        fz = f[..., 2].clamp(min=0.0)
        fxy = f[..., :2]
        limit = (g.friction * fz / fxy.norm(dim=-1).clamp(min=1e-6)).clamp(max=1.0).unsqueeze(-1)
        f = torch.cat([fxy * limit, fz.unsqueeze(-1)], dim=-1) * stance.unsqueeze(-1)
        f_b = torch.einsum("nji,nfj->nfi", rot, f)                               # H -> body
        tau = -torch.einsum("nfji,nfj->nfi", jac, f_b).reshape(-1, NUM_JOINTS)   # motor torques, (N, 12)
        tau = torch.maximum(torch.minimum(tau, self.torque_limits), -self.torque_limits)
        # the actuator is a PD about the target: q_t = q + tau / Kp makes it apply tau (minus damping)
        return q_meas + tau / self.kp
