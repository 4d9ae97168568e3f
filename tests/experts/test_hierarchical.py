"""HierarchicalPolicy: GeRM's 12-D command mapped onto the gait command, with a scripted high level."""
from __future__ import annotations

import pytest
import torch

from quadforge.layout import COMMAND_NAMES
from quadforge.envs.robots import get_robot
from quadforge.experts.gait import GaitController
from quadforge.experts.hierarchical import HL_COMMAND_NAMES, HierarchicalPolicy, gait_command

torch.set_num_threads(1)


class ScriptedHigh:
    """A fixed 12-D command per env; counts resets."""

    policy_id = "scripted"
    obs_terms = ("projected_gravity",)
    action_space = "command"
    action_dim = 12

    def __init__(self, command: torch.Tensor):
        self.command = command
        self.resets: list[list[int]] = []

    def reset(self, env_ids):
        self.resets.append(torch.as_tensor(env_ids).tolist())

    def act(self, obs):
        return self.command.clone()


def _hl(vx=0.4, vy=0.0, wz=0.0, phase=0.5, offset=0.0, bound=0.0, f=3.0, hz=0.0, pitch=0.0, sy=0.3,
        hf=0.08, T=0.0) -> list[float]:
    return [vx, vy, wz, phase, offset, bound, f, hz, pitch, sy, hf, T]


def test_eq9_entries_land_on_the_gait_command_and_the_rest_is_kept():
    hl = torch.tensor([_hl(0.3, -0.1, 0.2, 0.0, 0.5, 0.0, 2.5, -0.05, 0.1, 0.28, 0.12, 0.0)])
    base = torch.arange(15, dtype=torch.float32).unsqueeze(0) + 100
    cmd, term = gait_command(hl, base)
    got = dict(zip(COMMAND_NAMES, cmd[0].tolist()))
    want = dict(zip(HL_COMMAND_NAMES, hl[0].tolist()))
    for name in HL_COMMAND_NAMES[:-1]:
        assert got[name] == pytest.approx(want[name]), name
    for name in ("gait_duration", "body_roll", "stance_length", "aux"):
        assert got[name] == base[0, COMMAND_NAMES.index(name)]
    assert not term[0]


def test_terminate_flag_zeroes_velocities():
    hl = torch.tensor([_hl(0.5, 0.2, 0.3, T=1.0), _hl(0.5, T=0.0)])
    cmd, term = gait_command(hl, torch.zeros(2, 15))
    assert term.tolist() == [True, False]
    assert cmd[0, :3].abs().max() == 0 and cmd[1, 0] == pytest.approx(0.5)


def test_bad_shapes_and_policies_are_clear_errors():
    with pytest.raises(ValueError, match="12 entries"):
        gait_command(torch.zeros(2, 11), torch.zeros(2, 15))
    low = GaitController(get_robot("go1"), 2)
    joint_high = ScriptedHigh(torch.zeros(2, 12))
    joint_high.action_space = "joint"
    with pytest.raises(ValueError, match="action_space 'command'"):
        HierarchicalPolicy(joint_high, low)


def test_exposes_hl_commands_and_resets_both_levels():
    low = GaitController(get_robot("go1"), 2)
    high = ScriptedHigh(torch.tensor([_hl(0.4), _hl(0.0, T=1.0)]))
    pol = HierarchicalPolicy(high, low)
    assert pol.action_space == "joint" and set(pol.obs_terms) >= set(low.obs_terms) | {"projected_gravity"}
    obs = {"commands": torch.zeros(2, 15), "base_lin_vel": torch.zeros(2, 3), "base_ang_vel": torch.zeros(2, 3),
           "projected_gravity": torch.tensor([[0.0, 0.0, -1.0]] * 2), "dof_pos": torch.zeros(2, 12),
           "dof_vel": torch.zeros(2, 12)}
    a = pol.act(obs)
    assert a.shape == (2, 12) and torch.isfinite(a).all()
    assert torch.equal(pol.hl_commands, high.command)
    assert pol.terminate.tolist() == [False, True]
    assert pol.low_commands[0, 0] == pytest.approx(0.4) and pol.low_commands[1, 0] == 0
    pol.reset(torch.tensor([1]))
    assert high.resets == [[1]] and low.clock[1] == 0 and not pol.terminate[1]


class MetaLow:
    """A joint-level policy that answers on its input's device (torch's ``meta`` stands in for a GPU)."""

    policy_id, obs_terms, action_space, action_dim, num_envs = "meta_low", ("commands",), "joint", 12, 2

    def reset(self, env_ids):
        pass

    def act(self, obs):
        return torch.zeros(self.num_envs, 12, device=obs["commands"].device)


def test_commands_stay_on_the_policys_device():
    """What the rollout records (hl_commands) and the flags stay where the policy computed them: a copy
    to the host crashed the recording of a CUDA rollout beside its CUDA observations and waited for the
    GPU every control step (issue 23). On ``meta`` a copy to the host raises."""
    meta = torch.device("meta")
    pol = HierarchicalPolicy(ScriptedHigh(torch.zeros(2, 12, device=meta)), MetaLow())
    a = pol.act({"commands": torch.zeros(2, 15, device=meta)})
    assert a.device == meta
    assert pol.hl_commands.device == pol.terminate.device == pol.low_commands.device == meta
    pol.reset(torch.tensor([1]))   # ids from the host index the device-held flags


def test_scripted_high_level_walks_the_robot_on_leggedenv():
    from quadforge.envs.config import EnvConfig
    from quadforge.envs.vec_env import LeggedEnv

    cfg = EnvConfig.flat(num_envs=2, seed=5)
    cfg.randomization.push_robots = False
    env = LeggedEnv(cfg)
    high = ScriptedHigh(torch.tensor([_hl(0.4, sy=0.28), _hl(0.4, sy=0.28, T=1.0)]))
    pol = HierarchicalPolicy(high, GaitController(env.robot, 2, env.dt))
    pol.reset(torch.arange(2))
    vx = []
    for t in range(150):
        _, _, dones, extras = env.step(pol.act(env.terms))
        assert not (dones & ~extras["time_outs"]).any()
        if t >= 75:
            vx.append(env.terms["base_lin_vel"][:, 0])
    vx = torch.stack(vx).mean(0)
    assert abs(vx[0] - 0.4) < 0.15, vx      # walks at the high-level command
    assert abs(vx[1]) < 0.15, vx            # terminated: trots in place
