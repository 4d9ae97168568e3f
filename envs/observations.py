"""One function per observation term of ``quadforge.layout.TERM_DIMS``, computed from the robot state and
the task state; ``TermCache`` evaluates them lazily so a step only pays for the terms it uses.

Terms are raw (SI units, body frame, unscaled); policies flatten them with an ``ObsLayout``. Noise is
added inside the policy group's ``CompiledLayout`` only, never to what ``env.terms`` returns.

Adding a term: its dimension in ``quadforge.terms.TERM_DIMS``, and its function either here in
``make_term_fns`` or, from outside, ``register_term(name, fn)`` (``fn(TaskView) -> (N, dim)``) before the env is
built. A task's own term is named ``task_<name>``: it needs no function (zeros unless the task's env fills it,
``TaskView.task_terms``). A term without a function is a one-line error when an env is built.
"""
from __future__ import annotations

import functools

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import torch

from quadforge.envs.backends.base import RobotState
from quadforge.envs.fast_paths import cpu_arrays
from quadforge.envs.rotations import yaw_from_quat
from quadforge.layout import COMMAND_NAMES, HEIGHT_SCAN_X, HEIGHT_SCAN_Y, TASK_TERM_PREFIX, TERM_DIMS
from quadforge.envs.view_cache import ViewCache

_C = {n: i for i, n in enumerate(COMMAND_NAMES)}


@dataclass
class TaskView:
    """What the observation and reward functions read besides the robot state."""

    state: RobotState
    default_joint_pos: torch.Tensor      # (12,)
    commands: torch.Tensor               # (N, 15)
    actions: torch.Tensor                # (N, 12) the policy action of the last step (a_t)
    last_actions: torch.Tensor           # (N, 12) a_{t-1}
    gait_time: torch.Tensor              # (N,) walk-these-ways gait index t in [0, 1)
    env_params: Mapping[str, torch.Tensor]
    terrain_height: Callable[[torch.Tensor], torch.Tensor]   # (..., 2) world xy -> (...)
    flat: bool                           # a plane at z = 0: no terrain lookups needed
    yaw: torch.Tensor | None = None      # (N,) base yaw of state.root_quat_w when already computed
    task_terms: Mapping[str, torch.Tensor] | None = None  # a task's own ``task_*`` terms (QUARD), (N, dim)


def foot_phases(gait_time: torch.Tensor, commands: torch.Tensor) -> torch.Tensor:
    """(N, 4) foot phases in LEGS order FR, FL, RR, RL: FR = t+o, FL = t+p+o+b, RR = t+p, RL = t+b."""
    t = gait_time
    p, o, b = commands[:, _C["gait_phase"]], commands[:, _C["gait_offset"]], commands[:, _C["gait_bound"]]
    return torch.remainder(torch.stack((t + o, t + p + o + b, t + p, t + b), dim=1), 1.0)


def scan_points_b(device: torch.device | str = "cpu") -> torch.Tensor:
    """(187, 2) legged_gym's height-sample grid in the yaw frame, x-major (x outer, y inner)."""
    x = torch.tensor(HEIGHT_SCAN_X, device=device)
    y = torch.tensor(HEIGHT_SCAN_Y, device=device)
    gx, gy = torch.meshgrid(x, y, indexing="ij")
    return torch.stack((gx.flatten(), gy.flatten()), dim=1)


def scan_points_w(state: RobotState, points_b: torch.Tensor, yaw: torch.Tensor | None = None,
                  append_base: bool = False) -> torch.Tensor:
    """(N, P, 2) world xy of the grid rotated by the base yaw (legged_gym's quat_apply_yaw); ``yaw``:
    the yaw of ``state.root_quat_w`` when the caller has it. ``append_base``: (N, P + 1, 2), the
    base's own xy as a last point (``ground_terms``' one lookup)."""
    if yaw is None:
        yaw = yaw_from_quat(state.root_quat_w)
    c, s = torch.cos(yaw)[:, None], torch.sin(yaw)[:, None]     # (N, 1)
    pos = state.root_pos_w
    p = points_b.shape[0]
    out = torch.empty(pos.shape[0], p + int(append_base), 2, dtype=pos.dtype, device=pos.device)
    # On the CPU numpy does the same elementwise products and sums at a fraction of torch's per-call
    # cost (bit for bit: single IEEE-rounded operations); writes land in ``out`` either way.
    args = (out, pos, c, s) + _columns(points_b)
    arrays = cpu_arrays(*args)
    # R(yaw) p + pos written out per coordinate: the same products and sums as a batched (P, 2) @ R^T
    # matmul at a fraction of its cost for K = 2 (tested against it), each coordinate written straight
    # into its strided slot (stacking the two (N, P) planes would cost more than the arithmetic)
    xp, (o, pos_, c, s, px, py) = (torch, args) if arrays is None else (np, arrays)
    xp.add(px * c - py * s, pos_[:, 0:1], out=o[:, :p, 0])
    xp.add(px * s + py * c, pos_[:, 1:2], out=o[:, :p, 1])
    if append_base:
        out[:, p] = state.root_pos_w[:, :2]
    return out


_columns = ViewCache(lambda points_b: (points_b[:, 0], points_b[:, 1]))  # the scan grid is a constant


def _height_scan(v: TaskView, points_b: torch.Tensor) -> torch.Tensor:
    z = v.state.root_pos_w[:, 2:3]
    if v.flat:
        return z.expand(-1, points_b.shape[0]).clone()
    return z - v.terrain_height(scan_points_w(v.state, points_b, v.yaw))


def _base_height(v: TaskView) -> torch.Tensor:
    z = v.state.root_pos_w[:, 2:3]
    if v.flat:
        return z.clone()
    return z - v.terrain_height(v.state.root_pos_w[:, None, :2])


def ground_terms(v: TaskView, points_b: torch.Tensor) -> dict[str, torch.Tensor]:
    """``height_scan`` (N, P) and ``base_height`` (N, 1) from one terrain lookup (the base point
    appended to the scan points): the same per-point arithmetic as the two terms, one call fewer."""
    z = v.state.root_pos_w[:, 2:3]
    h = v.terrain_height(scan_points_w(v.state, points_b, v.yaw, append_base=True))  # (N, P + 1)
    arrays = cpu_arrays(z, h)
    if arrays is not None:  # two subtractions, the same bits in numpy
        zn, hn = arrays
        return {"height_scan": torch.from_numpy(zn - hn[:, :-1]), "base_height": torch.from_numpy(zn - hn[:, -1:])}
    return {"height_scan": z - h[:, :-1], "base_height": z - h[:, -1:]}


def _param(v: TaskView, name: str) -> torch.Tensor:
    n = v.state.root_pos_w.shape[0]
    p = v.env_params.get(name)
    if p is None:  # nominal physics: friction 1 (MuJoCo default), no added mass
        return torch.full((n, 1), 1.0 if name == "friction" else 0.0, device=v.state.root_pos_w.device)
    return p.reshape(n, 1).to(torch.float32)


def _task_term(v: TaskView, name: str) -> torch.Tensor:
    """A task's privileged term; zeros in an env whose task has none (locomotion)."""
    if v.task_terms is not None and name in v.task_terms:
        return v.task_terms[name]
    return torch.zeros(v.state.root_pos_w.shape[0], TERM_DIMS[name], device=v.state.root_pos_w.device)


# Term functions registered from outside this module (``register_term``): name -> fn(TaskView) -> (N, dim).
TERM_FUNCTIONS: dict[str, Callable[[TaskView], torch.Tensor]] = {}


def register_term(name: str, fn: Callable[[TaskView], torch.Tensor]) -> None:
    """The function of term ``name`` (already in ``TERM_DIMS``), read by every env built afterwards."""
    if name not in TERM_DIMS:
        raise ValueError(f"register_term({name!r}): no such term in quadforge.terms.TERM_DIMS; add its dimension "
                         f"there first")
    if name.startswith(TASK_TERM_PREFIX):
        raise ValueError(f"register_term({name!r}): a {TASK_TERM_PREFIX}* term is its task env's (TaskView.task_terms), "
                         f"zeros elsewhere; it takes no function")
    if name in TERM_FUNCTIONS:
        raise ValueError(f"register_term({name!r}): term {name!r} already has a registered function")
    TERM_FUNCTIONS[name] = fn


def make_term_fns(points_b: torch.Tensor) -> dict[str, Callable[[TaskView], torch.Tensor]]:
    fns: dict[str, Callable[[TaskView], torch.Tensor]] = {
        "base_lin_vel": lambda v: v.state.root_lin_vel_b,
        "base_ang_vel": lambda v: v.state.root_ang_vel_b,
        "projected_gravity": lambda v: v.state.projected_gravity_b,
        "commands": lambda v: v.commands,
        "dof_pos": lambda v: v.state.joint_pos - v.default_joint_pos,
        "dof_vel": lambda v: v.state.joint_vel,
        "dof_pos_sin": lambda v: torch.sin(v.state.joint_pos),
        "dof_pos_cos": lambda v: torch.cos(v.state.joint_pos),
        "last_action": lambda v: v.actions,
        "last_last_action": lambda v: v.last_actions,
        "foot_contacts": lambda v: v.state.foot_contact.to(torch.float32),
        "gait_clock": lambda v: torch.sin(2 * math.pi * foot_phases(v.gait_time, v.commands)),
        "base_height": _base_height,
        "height_scan": lambda v: _height_scan(v, points_b),
        "friction": lambda v: _param(v, "friction"),
        "added_mass": lambda v: _param(v, "added_mass"),
    }
    for name in TERM_DIMS:
        if name.startswith(TASK_TERM_PREFIX):
            fns[name] = functools.partial(_task_term, name=name)
    built_in = sorted(set(fns) & set(TERM_FUNCTIONS))
    if built_in:
        raise ValueError(f"observation terms {built_in}: registered with register_term but built into "
                         f"envs/observations.py make_term_fns; register only new terms")
    fns.update(TERM_FUNCTIONS)
    missing = sorted(set(TERM_DIMS) - set(fns))
    if missing:
        raise ValueError(f"observation terms {missing} of quadforge.terms.TERM_DIMS have no function: register one "
                         f"with envs.observations.register_term(name, fn) (fn(TaskView) -> (N, dim)) before building "
                         f"the env, or name a task's term {TASK_TERM_PREFIX}<name>")
    extra = sorted(set(fns) - set(TERM_DIMS))
    if extra:
        raise ValueError(f"observation functions {extra} have no term in quadforge.terms.TERM_DIMS; add their "
                         f"dimensions there")
    return fns


class TermCache(Mapping[str, torch.Tensor]):
    """A read-only mapping term -> (N, dim) that computes each term once, on first access."""

    def __init__(self, fns: Mapping[str, Callable[[TaskView], torch.Tensor]], view: TaskView,
                 known: Mapping[str, torch.Tensor] | None = None):
        """``known``: terms already computed for this view's state (not recomputed)."""
        self._fns, self._view, self._done = fns, view, dict(known or {})

    @property
    def view(self) -> TaskView:
        return self._view

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._done:
            if name not in self._fns:
                raise KeyError(f"unknown observation term {name!r}; known terms: {sorted(self._fns)}")
            self._done[name] = self._fns[name](self._view)
        return self._done[name]

    def __iter__(self):
        return iter(self._fns)

    def __len__(self) -> int:
        return len(self._fns)

    def columns(self, name: str, index: slice | list[int]) -> torch.Tensor:
        """Some columns of a term as a contiguous (N, k) tensor, made once: ``torch.cat`` copies
        contiguous inputs row by row but falls back to a much slower per-input path for any strided
        one, and two layouts (policy and critic) may ask for the same columns."""
        key = (name, (index.start, index.stop, index.step) if isinstance(index, slice) else tuple(index))
        got = self._done.get(key)
        if got is None:
            got = self._done[key] = self[name][:, index].contiguous()
        return got

    def materialize(self) -> dict[str, torch.Tensor]:
        """Every term, as a plain dict of tensors the caller may keep (clones)."""
        return {k: self[k].clone() for k in self._fns}


class CompiledLayout:
    """An ``ObsLayout`` precomputed into per-column offset/scale/clip vectors, with optional per-column
    uniform noise: one cat, one rand and a few fused ops per step instead of several ops per term.
    Gives exactly ``layout.build(terms)`` when no noise is asked for (tested)."""

    def __init__(self, layout, noise: Mapping[str, float] | None = None, level: float = 1.0,
                 device: torch.device | str = "cpu"):
        self.layout = layout
        self.parts: list[tuple[str, slice | list[int] | None]] = []
        offset, scale, lo, hi, amp = [], [], [], [], []
        for t in layout.terms:
            d = t.dim
            self.parts.append((t.name, _as_slice(t.index)))
            s = torch.as_tensor(t.scale, dtype=torch.float32).expand(d)
            offset.append(torch.full((d,), float(t.offset)))
            scale.append(s)
            c = math.inf if t.clip is None else float(t.clip)
            lo.append(torch.full((d,), -c))
            hi.append(torch.full((d,), c))
            # noise is in raw units of the term; in the scaled output it is noise * |scale|
            amp.append(s.abs() * float((noise or {}).get(t.name, 0.0)) * level)
        if layout.clip is not None:
            lo = [x.clamp(min=-layout.clip) for x in lo]
            hi = [x.clamp(max=layout.clip) for x in hi]
        cat = lambda xs: torch.cat(xs).to(device)  # noqa: E731
        self.offset, self.scale, self.lo, self.hi, self.noise = map(cat, (offset, scale, lo, hi, amp))
        self.has_offset = bool((self.offset != 0).any())
        self.has_noise = bool((self.noise > 0).any())
        self.noise2 = 2 * self.noise
        self.has_clip = bool(torch.isfinite(self.lo).any() or torch.isfinite(self.hi).any())

    def draw_noise(self, n: int, generator: torch.Generator | None) -> torch.Tensor | None:
        """The U(0, 1) draw ``build`` would make for n rows (None when it makes none), to pass back in."""
        if not self.has_noise or generator is None:
            return None
        return torch.rand((n, self.offset.numel()), generator=generator, device=self.offset.device)

    def build(self, terms: Mapping[str, torch.Tensor], generator: torch.Generator | None = None,
              noise: torch.Tensor | None = None) -> torch.Tensor:
        """``noise``: a draw from ``draw_noise`` made earlier from the same generator (then ``build``
        draws nothing)."""
        cols = getattr(terms, "columns", None) or (lambda n, idx: terms[n][:, idx])
        x = torch.cat([terms[n] if idx is None else cols(n, idx) for n, idx in self.parts], dim=1)
        # ((x + offset) + U(-a, a)) * scale, written to touch the (N, D) block as few times as possible;
        # in place on the fresh concatenation (the same operations as out of place: the same bits),
        # so a step allocates one (N, D) block, not four
        y = x.add_(self.offset).mul_(self.scale) if self.has_offset else x.mul_(self.scale)
        if self.has_noise and generator is not None:
            u = noise if noise is not None else torch.rand(y.shape, generator=generator, device=y.device)
            y = y.sub_(self.noise).addcmul_(u, self.noise2)
        return y.clamp_(self.lo, self.hi) if self.has_clip else y


def _as_slice(index: tuple[int, ...] | None) -> slice | list[int] | None:
    """A contiguous index as a slice (a view, no gather)."""
    if index is None:
        return None
    if list(index) == list(range(index[0], index[0] + len(index))):
        return slice(index[0], index[0] + len(index))
    return list(index)
