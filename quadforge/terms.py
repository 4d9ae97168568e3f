"""The catalogue of observation terms: names, widths, joint and command order, the height-scan grid (and the
terrain type names).

Plain Python, no torch: the store's schema (``data.schema``) reads it, so a `quadforge dataset ...` command
starts without importing torch (about 1.7 s and 180 MB). ``quadforge.layout`` builds policy input vectors
from these terms and re-exports every name here.
"""
from __future__ import annotations

NUM_JOINTS = 12
NUM_FEET = 4
# Joint order, stated once for the whole project: legs FR, FL, RR, RL, each hip, thigh, calf.
LEGS = ("FR", "FL", "RR", "RL")
JOINT_NAMES = tuple(f"{leg}_{part}" for leg in LEGS for part in ("hip", "thigh", "calf"))

# The walk-these-ways gait-conditioned command space (15-D). The joystick space is its first three
# entries; in joystick mode the rest hold the default trot so one `commands` term serves every layout.
COMMAND_NAMES = (
    "lin_vel_x", "lin_vel_y", "ang_vel_yaw", "body_height", "gait_frequency",
    "gait_phase", "gait_offset", "gait_bound", "gait_duration", "foot_swing_height",
    "body_pitch", "body_roll", "stance_width", "stance_length", "aux",
)

# The terrain types envs.terrain generates, named here (plain Python) so the data layer's sampler filter
# `terrain_types` can tell a misspelt type from one a store merely lacks
TERRAIN_TYPES = ("flat", "slope_up", "slope_down", "rough_slope", "stairs_up", "stairs_down",
                 "obstacles", "stepping_stones", "gaps")

# legged_gym's 17 x 11 height-sample grid over 1.6 m x 1.0 m.
HEIGHT_SCAN_X = tuple(round(-0.8 + 0.1 * i, 2) for i in range(17))
HEIGHT_SCAN_Y = tuple(round(-0.5 + 0.1 * i, 2) for i in range(11))

TERM_DIMS: dict[str, int] = {
    "base_lin_vel": 3,        # m/s, body frame
    "base_ang_vel": 3,        # rad/s, body frame
    "projected_gravity": 3,   # unit gravity vector in the body frame
    "commands": len(COMMAND_NAMES),
    "dof_pos": NUM_JOINTS,    # rad, relative to the robot's default standing pose
    "dof_vel": NUM_JOINTS,    # rad/s
    "dof_pos_sin": NUM_JOINTS,  # sin of the absolute joint angle (FCNet C.3.1)
    "dof_pos_cos": NUM_JOINTS,
    "last_action": NUM_JOINTS,
    "last_last_action": NUM_JOINTS,
    "foot_contacts": NUM_FEET,  # 1 where the foot touches ground
    "gait_clock": NUM_FEET,     # sin(2*pi*phase) per foot (walk-these-ways)
    # privileged: never fed to a deployable policy by default
    "base_height": 1,         # m above the terrain under the base
    "height_scan": len(HEIGHT_SCAN_X) * len(HEIGHT_SCAN_Y),  # base z - terrain z at the grid points, m
    "friction": 1,
    "added_mass": 1,
    # privileged QUARD task terms (envs/quard): world frame, m; emitted by QuardEnv only
    "task_base_pose": 4,        # base x, y, z and yaw (rad)
    "task_target_pos": 3,       # the point to reach or face: target object, target ball, 1 m past the named tunnel
    "task_target_vel": 3,       # velocity of the target (the rolling ball of `stop`, else 0)
    "task_distractor_pos": 3,   # the other object / ball / the point past the other tunnel
    "task_obstacle_pos": 3,     # go_avoid's obstacle (its centre on the ground), else 0
    "task_tunnel_entry": 3,     # go_through: the centre of the named tunnel's entrance, else 0
    "task_info": 4,             # family, speed word, gait word (codes into envs.quard.instructions), has obstacle
}
# A task's own terms (its targets and what it asks) are named ``task_<name>``; an env without such a task
# fills them with zeros.
TASK_TERM_PREFIX = "task_"
# Terms a deployable policy does not get by default; every task term is privileged.
PRIVILEGED_TERMS = frozenset({"base_height", "height_scan", "friction", "added_mass"}
                             | {name for name in TERM_DIMS if name.startswith(TASK_TERM_PREFIX)})
