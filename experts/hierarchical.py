"""A high-level policy that emits GeRM's 12-D command, on top of the gait controller.

GeRM (seed 003, Eq. 9) drives a walk-these-ways-style low-level controller with

    [v_x, v_y, w_z, theta_1, theta_2, theta_3, f, h_z, phi, s_y, h_z^f, T]

velocities, the gait pattern (theta = walk-these-ways' phase, offset, bound), gait frequency, body
height, pitch, foot (stance) width, foot swing height and a termination signal. ``HierarchicalPolicy``
maps it onto the 15-D gait command (``quadforge.layout.COMMAND_NAMES``), writes that into the ``commands``
term the low level reads, and keeps the last high-level command (the store's ``hl_commands``) and the
terminate flag. Entries the 12-D command does not carry (stance duration, roll, stance length, aux)
keep the values of the env's own command.

While an env's terminate flag is set its velocity commands are zeroed: the robot trots in place until
the episode is ended by whoever reads the flag (collection, evaluation).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from quadforge.experts.gait import GaitGains
from quadforge.experts.policy import check_policy, compile_experts, given_terms
from quadforge.layout import COMMAND_NAMES, NUM_JOINTS
from quadforge.tensors import device_constant, row_ids, set_rows
from quadforge.models.binning import ActionBinner

# seed 003 Eq. 9, in order
HL_COMMAND_NAMES = ("lin_vel_x", "lin_vel_y", "ang_vel_yaw", "gait_phase", "gait_offset", "gait_bound",
                    "gait_frequency", "body_height", "body_pitch", "stance_width", "foot_swing_height",
                    "terminate")
HL_COMMAND_DIM = len(HL_COMMAND_NAMES)
# where each of the first 11 entries lands in the 15-D gait command
_TO_GAIT = tuple(COMMAND_NAMES.index(n) for n in HL_COMMAND_NAMES[:-1])
_VELOCITIES = tuple(COMMAND_NAMES.index(n) for n in ("lin_vel_x", "lin_vel_y", "ang_vel_yaw"))


def gait_command(hl: torch.Tensor, base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 12) GeRM commands and (N, 15) base gait commands -> ((N, 15) gait commands, (N,) terminate).

    ``terminate`` is T > 0.5; terminated rows get zero velocities."""
    if hl.shape[-1] != HL_COMMAND_DIM:
        raise ValueError(f"high-level command must have {HL_COMMAND_DIM} entries {HL_COMMAND_NAMES}, "
                         f"got shape {tuple(hl.shape)}")
    if base.shape[-1] != len(COMMAND_NAMES) or base.shape[0] != hl.shape[0]:
        raise ValueError(f"base commands must be ({hl.shape[0]}, {len(COMMAND_NAMES)}), got {tuple(base.shape)}")
    out = base.clone()
    out[:, device_constant(_TO_GAIT, torch.long, hl.device)] = hl[:, :-1].to(out.dtype)
    terminate = hl[:, -1] > 0.5
    vel = device_constant(_VELOCITIES, torch.long, hl.device)
    out[:, vel] = torch.where(terminate.unsqueeze(-1), torch.zeros_like(out[:, vel]), out[:, vel])
    return out, terminate


class HierarchicalPolicy:
    """``high`` (action_space "command", 12-D) over ``low`` (a ``GaitController``); itself a "joint" policy."""

    action_space = "joint"
    action_dim = NUM_JOINTS

    def __init__(self, high, low):
        check_policy(high)
        check_policy(low)
        if high.action_space != "command" or int(high.action_dim) != HL_COMMAND_DIM:
            raise ValueError(f"high-level policy must have action_space 'command' and action_dim {HL_COMMAND_DIM}; "
                             f"got {high.action_space!r} / {high.action_dim}")
        if low.action_space != "joint" or "commands" not in low.obs_terms:
            raise ValueError("low-level policy must have action_space 'joint' and read the 'commands' term; "
                             f"got {low.action_space!r} reading {low.obs_terms}")
        self.high, self.low = high, low
        self.policy_id = f"hier:{high.policy_id}+{low.policy_id}"
        self.obs_terms = tuple(dict.fromkeys(tuple(high.obs_terms) + tuple(low.obs_terms)))
        n = int(getattr(low, "num_envs"))
        self.num_envs = n
        self.hl_commands = torch.zeros(n, HL_COMMAND_DIM)   # last high-level command (store: hl_commands)
        self.terminate = torch.zeros(n, dtype=torch.bool)   # last terminate flag
        self.low_commands = torch.zeros(n, len(COMMAND_NAMES))  # what the low level was given

    def reset(self, env_ids: torch.Tensor | None) -> None:
        # None: all; a mask: its rows; kept where the caller has them (a CUDA rollout's ids make no host trip)
        where = env_ids.device if isinstance(env_ids, torch.Tensor) else self.hl_commands.device
        ids = row_ids(env_ids, self.num_envs, where, check_range="host")
        self.high.reset(ids)
        self.low.reset(ids)
        # act() replaces both each step: under a caller's torch.inference_mode they are made there
        self.hl_commands = set_rows(self.hl_commands, ids.to(self.hl_commands.device), 0.0)
        self.terminate = set_rows(self.terminate, ids.to(self.terminate.device), False)

    def compile_expert(self) -> None:
        """``--compile-expert``: the parts that can (the gait controller below) run through torch.compile."""
        compile_experts(self.high, self.low)

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if "commands" not in obs:
            raise KeyError(f"HierarchicalPolicy needs the 'commands' term; {given_terms(obs)}")
        hl = self.high.act(obs)
        if hl.shape != (self.num_envs, HL_COMMAND_DIM):
            raise ValueError(f"high-level policy returned shape {tuple(hl.shape)}; "
                             f"expected ({self.num_envs}, {HL_COMMAND_DIM})")
        cmd, terminate = gait_command(hl, obs["commands"])
        # kept on the policy's device: the rollout records hl_commands beside the env's tensors, and a
        # copy to the host here would wait for the GPU every control step
        self.hl_commands = hl.detach().to(torch.float32).clone()
        self.terminate = terminate.clone()
        self.low_commands = cmd.detach().clone()
        low_obs = dict(obs)
        low_obs["commands"] = cmd
        return self.low.act(low_obs)


# --- the 12-D high-level command's bins (seed 003 Eq. 9) ------------------------------------------------

def controller_command_ranges() -> dict[str, tuple[float, float]]:
    """Per-dimension [low, high] of GeRM's 12-D command (``HL_COMMAND_NAMES``) fitted
    to what our gait controller can execute: beyond these it clamps (``experts.gait.resolve_params``), so a
    bin outside them would be a command the robot cannot tell from the edge bin. Velocities from
    ``GaitGains.max_lin_vel`` / ``max_yaw_rate``; gait phases span their cycle [0, 1]; the others are the
    controller's clamps; the terminate flag T spans [0, 1] (T > 0.5 ends the episode).

    GeRM's code bins vx −0.81..3.10, vy −0.90..0.89, wz −1.45..1.60 (its robot's data); ours are symmetric
    and capped at 1.5 where our controller stops following."""
    g = GaitGains()
    return {
        "lin_vel_x": (-g.max_lin_vel, g.max_lin_vel), "lin_vel_y": (-g.max_lin_vel, g.max_lin_vel),
        "ang_vel_yaw": (-g.max_yaw_rate, g.max_yaw_rate),
        "gait_phase": (0.0, 1.0), "gait_offset": (0.0, 1.0), "gait_bound": (0.0, 1.0),
        "gait_frequency": (1.0, 5.0), "body_height": (-0.15, 0.10), "body_pitch": (-0.4, 0.4),
        "stance_width": (0.05, 0.6), "foot_swing_height": (0.0, 0.3), "terminate": (0.0, 1.0),
    }


def command_binner(num_bins: int = 256) -> ActionBinner:
    """Uniform bins over ``controller_command_ranges`` in HL_COMMAND_NAMES order (seed 003: 256 per dim)."""
    if num_bins < 2:
        raise ValueError(f"num_bins must be >= 2, got {num_bins}")
    ranges = controller_command_ranges()
    rows = [np.linspace(*ranges[name], num_bins + 1) for name in HL_COMMAND_NAMES]
    return ActionBinner(torch.as_tensor(np.stack(rows), dtype=torch.float32))
