"""A trained actor network as an ``experts.policy.Policy``: named terms -> layout -> (history) -> net -> actions.

The observation side is an explicit adapter, so the same wrapper serves every checkpoint format:

- ``FrameObs``: one frame, ``layout.build(terms)`` (legged_gym 48/235-D, the PPO experts trained here);
- ``HistoryObs``: the last ``history`` frames flattened oldest-first, kept per env as recurrent state
  and zeroed by ``reset(env_ids)`` (walk-these-ways' 70-D x 30 history).

Joint order: terms are permuted into the source network's joint/foot order (``JointOrder``) before the
layout, and actions permuted back after it. The action side converts the source's convention to this project's ``q = q_default + action_scale * a``:
clip to ``clip_actions`` (the source env's clip), then multiply per joint by ``action_gain`` (e.g.
walk-these-ways' hip reduction, or source action scale / our robot's action scale); the previous actions
the network reads back (``last_action``, ``last_last_action``) are divided by it again, so it sees its
own clipped outputs, as in the env it was trained in.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from quadforge.tensors import row_ids, set_rows
from quadforge.experts.policy import given_terms
from quadforge.layout import JOINT_NAMES, LEGS, NUM_JOINTS, TERM_DIMS, ObsLayout

# Terms indexed by joint (12, leg-major) or by foot (4) - what a joint-order change must permute.
JOINT_TERMS = frozenset({"dof_pos", "dof_vel", "dof_pos_sin", "dof_pos_cos", "last_action", "last_last_action"})
FOOT_TERMS = frozenset({"foot_contacts", "gait_clock"})
# Isaac Gym loads Unitree URDFs as FL, FR, RL, RR (walk-these-ways remaps to the robot's FR, FL, RR, RL
# with [3, 4, 5, 0, 1, 2, 9, 10, 11, 6, 7, 8]); legged_gym and walk-these-ways checkpoints use it.
ISAAC_GYM_LEGS = ("FL", "FR", "RL", "RR")


class JointOrder:
    """The permutation between this project's joint order (FR, FL, RR, RL x hip, thigh, calf) and a
    source network's. ``source`` is a leg order (4 names, leg-major joints) or 12 joint names."""

    def __init__(self, source: Sequence[str] = LEGS):
        source = tuple(s.strip() for s in (source.split(",") if isinstance(source, str) else source))
        if sorted(source) == sorted(LEGS):
            joints = tuple(f"{leg}_{part}" for leg in source for part in ("hip", "thigh", "calf"))
        elif sorted(source) == sorted(JOINT_NAMES):
            joints = source
        else:
            raise ValueError(f"joint_order={source!r} is invalid; allowed: a permutation of the legs {LEGS} "
                             f"or of the 12 joints {JOINT_NAMES}")
        legs = tuple(dict.fromkeys(j.split("_")[0] for j in joints))
        self.source = source
        self.identity = joints == JOINT_NAMES
        # source[i] = ours[perm[i]]; actions come back with ours[j] = source[inv[j]]
        self.joint_perm = [JOINT_NAMES.index(j) for j in joints]
        self.joint_inv = [joints.index(j) for j in JOINT_NAMES]
        self.foot_perm = [LEGS.index(leg) for leg in legs]

    def terms_to_source(self, terms: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.identity:
            return dict(terms)
        out = {}
        for name, x in terms.items():
            if name in JOINT_TERMS:
                x = x[..., self.joint_perm]
            elif name in FOOT_TERMS:
                x = x[..., self.foot_perm]
            out[name] = x
        return out

    def actions_from_source(self, actions: torch.Tensor) -> torch.Tensor:
        return actions if self.identity else actions[..., self.joint_inv]


class FrameObs:
    """The current frame through the layout: (N, layout.dim)."""

    def __init__(self, layout: ObsLayout, num_envs: int, device: torch.device):
        self.layout = layout
        self.dim = layout.dim

    def reset(self, env_ids: torch.Tensor) -> None:
        pass

    def __call__(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.layout.build(terms)


class HistoryObs:
    """The last ``history`` frames, (N, history * layout.dim), oldest first; zeros before the episode start."""

    def __init__(self, layout: ObsLayout, num_envs: int, device: torch.device, history: int):
        if history < 1:
            raise ValueError(f"history={history} is invalid; allowed: an integer >= 1 (frames)")
        self.layout = layout
        self.history = history
        self.dim = history * layout.dim
        self.buffer = torch.zeros(num_envs, history, layout.dim, device=device)  # (N, H, D)

    def reset(self, env_ids: torch.Tensor) -> None:
        self.buffer = set_rows(self.buffer, env_ids, 0.0)   # replaced each call: maybe made in inference mode

    def __call__(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        frame = self.layout.build(terms)                                       # (N, D)
        self.buffer = torch.cat([self.buffer[:, 1:], frame[:, None]], dim=1)   # (N, H, D)
        return self.buffer.reshape(self.buffer.shape[0], -1)                   # (N, H*D)


class ActorPolicy:
    """``experts.policy.Policy`` around ``net: (N, adapter.dim) -> (N, 12)``."""

    action_space = "joint"

    def __init__(self, net: Callable[[torch.Tensor], torch.Tensor], adapter: FrameObs | HistoryObs,
                 num_envs: int, device: str | torch.device = "cpu", policy_id: str = "actor",
                 action_dim: int = NUM_JOINTS, clip_actions: float | None = None,
                 action_gain: float | Sequence[float] = 1.0, joint_order: JointOrder | None = None):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs={num_envs} is invalid; allowed: an integer >= 1")
        self.net = net
        self.adapter = adapter
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.policy_id = policy_id
        self.layout = adapter.layout
        self.obs_terms = adapter.layout.term_names
        self.action_dim = action_dim
        self.clip_actions = clip_actions
        # per joint, in the *source* order (e.g. walk-these-ways' hip reduction)
        self.action_gain = torch.as_tensor(action_gain, dtype=torch.float32, device=self.device)
        if not bool(torch.isfinite(self.action_gain).all()) or bool((self.action_gain == 0).any()):
            raise ValueError(f"action_gain={action_gain!r} is invalid; allowed: finite, non-zero gains (per joint "
                             f"or one): the env's previous actions are divided by it to give the network its own")
        self._unit_gain = bool((self.action_gain == 1).all())
        self.joint_order = joint_order or JointOrder()

    def reset(self, env_ids: torch.Tensor) -> None:
        self.adapter.reset(row_ids(env_ids, self.num_envs, self.device, check_range="host"))

    def observation(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The adapted network input (advances the history of a ``HistoryObs``)."""
        terms = {}
        for name in self.obs_terms:
            if name not in obs:
                raise ValueError(f"policy {self.policy_id} needs observation term {name!r}; {given_terms(obs)}")
            x = obs[name]
            if tuple(x.shape) != (self.num_envs, TERM_DIMS[name]):
                raise ValueError(f"observation term {name!r} has shape {tuple(x.shape)}; policy {self.policy_id} "
                                 f"expects (num_envs={self.num_envs}, {TERM_DIMS[name]})")
            terms[name] = x.to(self.device, torch.float32)
        return self.adapter(self._own_actions(self.joint_order.terms_to_source(terms)))

    def _own_actions(self, terms: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The env's previous actions (``last_action``, ``last_last_action``) in the network's own units: the
        env holds ``clip(net) * action_gain``, and a network is trained on what it output itself
        (walk-these-ways feeds back its clipped output and applies the hip reduction only to the targets)."""
        if self._unit_gain:
            return terms
        return {name: x / self.action_gain if name in ("last_action", "last_last_action") else x
                for name, x in terms.items()}

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        actions = self.net(self.observation(obs))                               # (N, 12)
        if self.clip_actions is not None:
            actions = actions.clamp(-self.clip_actions, self.clip_actions)
        return self.joint_order.actions_from_source(actions * self.action_gain)
