"""The one policy registry: every way of getting a ``Policy`` goes through ``load_policy(spec, num_envs)``.

A spec is one of

- a registered kind, optionally with an argument: ``gait`` / ``gait:pace`` (the gait controller expert),
  ``zero`` (zero joint actions), ``rsl_rl:PATH``, ``torchscript:PATH``, ``wtw:PATH``, ``model:PATH``
  (a model trained by ``quadforge train``, GeRM included), or any kind another module registered with
  ``register_policy_kind`` (a VLA checkpoint loader, say);
- a checkpoint path (file or run directory): its kind is detected from the file
  (``experts.loaders.detect_kind``; a ``quadforge train`` checkpoint is ``model``).

Adding a policy kind is one ``register_policy_kind(name, loader, help)`` call in the module that
implements it; the CLI's ``--policy`` help and errors list the registered kinds. Policy ids follow one
scheme (``experts.policy.checkpoint_policy_id``): ``<kind>:<file name>:<digest>`` for files,
``<kind>:<variant>`` for built-ins.

``policy_for_env(spec, env)`` is what the rollout callers use: it loads for the env's batch, robot, control
period and device, and runs a policy whose action space is ``command`` over the gait controller
(``HierarchicalPolicy``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from quadforge.envs.robots import ROBOTS, get_robot
from quadforge.experts.gait import GAITS, GaitController
from quadforge.experts.germ_policy import load_germ
from quadforge.experts.hierarchical import HierarchicalPolicy
from quadforge.experts.learned import check_robot, load_learned
from quadforge.experts.loaders import detect_kind, load_expert
from quadforge.experts.policy import nothing_to_compile
from quadforge.layout import NUM_JOINTS, TASK_TERM_PREFIX
from quadforge.models.checkpoint import load_checkpoint
from quadforge.models.registry import model_spec
from quadforge.tensors import check_device

DEFAULT_CONTROL_DT = 0.02  # s; the env's default (sim dt 0.005 x decimation 4)


@dataclass(frozen=True)
class LoadContext:
    """What a loader may need besides its argument."""

    num_envs: int
    device: str = "cpu"
    robot: str | None = None          # None: the checkpoint's own (or go1)
    control_dt: float = DEFAULT_CONTROL_DT
    allow_robot_mismatch: bool = False  # a checkpoint recording another robot than ``robot`` (refused otherwise)
    task: str | None = None           # the env's task (a VLA checkpoint refuses another); None: unchecked
    camera: Mapping[str, Any] | None = None   # the env's camera {name, height, width, image_every}
    instructions: Sequence[str] | None = None  # the env's instruction table (its ``instruction`` term indexes it)


@dataclass(frozen=True)
class PolicyKind:
    name: str
    load: Callable[[str, LoadContext], Any]   # (argument after "kind:", context) -> Policy
    help: str
    needs_path: bool = True                   # the argument is a file or directory that must exist
    # whether its policies run the gait controller that --compile-expert compiles: True, False (joint-space
    # policies), None (the checkpoint's action space decides, known once it is loaded)
    compiles_expert: bool | None = None


POLICY_KINDS: dict[str, PolicyKind] = {}
# Kind -> the module that registers it when imported (imported on first use: a kind's heavy optional
# dependencies never load for another's user), e.g. {"vla": "quadforge.experts.vla"}.
POLICY_KIND_MODULES: dict[str, str] = {"vla": "quadforge.experts.vla",
                                        "quard_expert": "quadforge.experts.quard_expert"}


def register_policy_kind(name: str, load: Callable[[str, LoadContext], Any], help: str,
                         needs_path: bool = True, compiles_expert: bool | None = None) -> None:
    """Make ``name`` / ``name:ARG`` a policy spec everywhere a ``--policy`` is accepted."""
    if not name.isidentifier():
        raise ValueError(f"policy kind {name!r}: use letters, digits and '_'")
    if name in POLICY_KINDS:
        raise ValueError(f"policy kind {name!r} is already registered")
    POLICY_KINDS[name] = PolicyKind(name, load, help, needs_path, compiles_expert)


def _registered_kind(kind: str) -> PolicyKind:
    """A kind's entry, importing the module that registers it (``POLICY_KIND_MODULES``) on first use."""
    if kind not in POLICY_KINDS and kind in POLICY_KIND_MODULES:
        importlib.import_module(POLICY_KIND_MODULES[kind])
    return POLICY_KINDS[kind]


def spec_help() -> str:
    kinds = ", ".join([f"{k.name}{':PATH' if k.needs_path else ''}" for k in POLICY_KINDS.values()]
                      + [f"{k}:..." for k in POLICY_KIND_MODULES if k not in POLICY_KINDS])
    return f"a checkpoint path, or one of {kinds}"


# --- built-in kinds ----------------------------------------------------------------------------------
class ZeroPolicy:
    """Zero joint actions: the robot holds its default pose (the env's standing targets)."""

    obs_terms: tuple[str, ...] = ()
    action_space = "joint"
    action_dim = NUM_JOINTS

    def __init__(self, num_envs: int, device: str | torch.device = "cpu"):
        self.num_envs, self.device = int(num_envs), torch.device(device)
        self.policy_id = "zero"

    def reset(self, env_ids: torch.Tensor) -> None:
        pass

    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.zeros(self.num_envs, NUM_JOINTS, device=self.device)


def _gait(arg: str, ctx: LoadContext) -> GaitController:
    gait = arg or "trot"
    if gait not in GAITS:
        raise ValueError(f"--policy gait:{gait}: unknown gait; allowed: {', '.join(GAITS)}")
    return GaitController(get_robot(ctx.robot or "go1"), ctx.num_envs, ctx.control_dt, device=ctx.device, gait=gait)


def _model(arg: str, ctx: LoadContext) -> Any:
    ckpt = load_checkpoint(arg)
    if not ctx.allow_robot_mismatch:
        check_robot(ckpt, ctx.robot, str(arg))
    kind = ckpt.extra.get("policy_kind")
    if kind in POLICY_KIND_MODULES:   # e.g. a VLA checkpoint: its module registers the loader
        return _registered_kind(kind).load(arg, ctx)
    return MODEL_POLICIES[model_spec(ckpt.model_name, "proprio").policy](arg, ctx.num_envs, ctx.device)


# a proprioceptive model's ``ModelSpec.policy`` -> its policy wrapper (a VLA's is the ``vla`` kind)
MODEL_POLICIES: dict[str, Callable[[str, int, str], Any]] = {"learned": load_learned, "germ": load_germ}


def _expert(kind: str) -> Callable[[str, LoadContext], Any]:
    def load(arg: str, ctx: LoadContext) -> Any:
        # allowed a mismatch, an expert drives with its own recorded robot's action gain
        robot = None if ctx.allow_robot_mismatch else ctx.robot
        return load_expert(arg, kind=kind, num_envs=ctx.num_envs, device=str(ctx.device),
                           **({"robot": robot} if robot is not None else {}))
    return load


register_policy_kind("gait", _gait, "the gait controller expert (gait:trot, gait:pace, ...)", needs_path=False,
                     compiles_expert=True)
register_policy_kind("zero", lambda arg, ctx: ZeroPolicy(ctx.num_envs, ctx.device), "zero joint actions",
                     needs_path=False, compiles_expert=False)
register_policy_kind("model", _model, "a model trained by `quadforge train` (imitation or GeRM)")
register_policy_kind("rsl_rl", _expert("rsl_rl"), "an rsl_rl PPO checkpoint (v1-3 or v5; `train-expert` writes these)",
                     compiles_expert=False)
register_policy_kind("torchscript", _expert("torchscript"), "a scripted actor (legged_gym policy_1.pt)",
                     compiles_expert=False)
register_policy_kind("wtw", _expert("wtw"), "walk-these-ways body + adaptation module", compiles_expert=False)


# --- the entry points --------------------------------------------------------------------------------
def parse_policy_spec(spec: str, flag: str = "--policy") -> tuple[str, str]:
    """(kind, argument); an existing path is detected as its kind. Errors name ``flag`` (the option the
    spec came from) and the allowed specs."""
    spec = str(spec).strip()
    if not spec:
        raise ValueError(f"{flag} is empty; give {spec_help()}")
    path = Path(spec)
    if path.exists():
        kind = detect_kind(path)
        return ("model" if kind == "quadforge" else kind), spec
    kind, _, arg = spec.partition(":")
    if kind in POLICY_KINDS or kind in POLICY_KIND_MODULES:
        entry = _registered_kind(kind)
        if entry.needs_path and not Path(arg).exists():
            raise FileNotFoundError(f"{flag} {spec!r}: no such checkpoint {arg!r}")
        return kind, arg
    if "/" in spec or spec.endswith((".pt", ".jit")):
        raise FileNotFoundError(f"{flag} {spec!r}: no such checkpoint file; use {spec_help()}")
    raise ValueError(f"{flag} {spec!r} is unknown; use {spec_help()}")


def check_policy_spec(spec: str, flag: str = "--policy") -> None:
    """Validate a spec without loading anything heavy (config validation: fail before any env is built)."""
    kind, arg = parse_policy_spec(spec, flag)
    if kind == "gait" and arg and arg not in GAITS:
        raise ValueError(f"{flag} {spec!r}: unknown gait {arg!r}; allowed: {', '.join(GAITS)}")


def check_compile_expert(specs: Sequence[str]) -> None:
    """``--compile-expert`` refused at validation, before any work, when no policy ``specs`` names could run
    the gait controller it compiles (kinds whose ``compiles_expert`` is False); a checkpoint whose action
    space decides is checked when loaded (``experts.policy.compile_experts``)."""
    named = [str(s) for s in specs if s]
    if named and all(_registered_kind(parse_policy_spec(s)[0]).compiles_expert is False for s in named):
        raise ValueError(nothing_to_compile(", ".join(named)))


def load_policy(spec: str | Path, num_envs: int, device: str | torch.device = "cpu", robot: str | None = None,
                control_dt: float = DEFAULT_CONTROL_DT, allow_robot_mismatch: bool = False,
                task: str | None = None, camera: Mapping[str, Any] | None = None,
                instructions: Sequence[str] | None = None) -> Any:
    """The Policy a spec names, for ``num_envs`` envs, in the action space the policy has. A checkpoint
    that records another robot than ``robot`` is refused unless ``allow_robot_mismatch``. ``task`` and
    ``camera`` (the env's) are checked by policies trained on a task's camera frames (VLAs);
    ``instructions`` is the env's instruction table, which such a policy reads its indices against."""
    if isinstance(num_envs, (bool, np.bool_)) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"num_envs={num_envs!r} is invalid; allowed: an integer >= 1")
    if robot is not None and robot not in ROBOTS:
        raise ValueError(f"robot={robot!r} is invalid; allowed: {', '.join(ROBOTS)}")
    check_device(device)
    kind, arg = parse_policy_spec(str(spec))
    ctx = LoadContext(int(num_envs), str(device), robot, float(control_dt), bool(allow_robot_mismatch), task, camera,
                      None if instructions is None else tuple(instructions))
    return POLICY_KINDS[kind].load(arg, ctx)


def task_blindness(policy: Any, env: Any) -> str | None:
    """Why ``policy`` can never succeed on ``env``'s task, or None. A task env names the terms that say
    what its task asks (``policy_context()["task_terms"]``: a QUARD env's instruction and privileged
    target); a policy reading none of them (a locomotion policy) cannot know which object is named."""
    context = env.policy_context() if callable(getattr(env, "policy_context", None)) else {}
    needed = tuple(context.get("task_terms") or ())
    if not needed:   # the other way round: a task's policy on an env with no task, whose task terms are zero
        steers_by = sorted(t for t in policy.obs_terms if t.startswith(TASK_TERM_PREFIX))
        if steers_by:
            return (f"policy {policy.policy_id} steers by task terms ({', '.join(steers_by)}) that this env's "
                    f"{context.get('task', 'locomotion')} task leaves at zero: it has no target to go to")
        return None
    if set(needed) & set(policy.obs_terms):
        return None
    return (f"policy {policy.policy_id} reads none of the terms that say what {context.get('task', 'the task')} "
            f"asks ({', '.join(needed)}): it cannot know the target and can never succeed there")


def policy_for_env(spec: str | Path, env: Any, robot: str | None = None, allow_robot_mismatch: bool = False) -> Any:
    """``load_policy`` for this env's batch, robot, control period and device; a ``command`` policy runs
    over the gait controller. ``robot`` (default: the env's) names the robot an outside checkpoint drives.
    An env with ``policy_context()`` (a QUARD env: its task, camera and instruction table) has it checked
    and used by the policies that read camera frames and instructions (a VLA numbers instructions as its
    training store did; the env's ``instruction`` term indexes the env's own table)."""
    robot = robot or getattr(getattr(env, "robot", None), "name", None)
    context = env.policy_context() if callable(getattr(env, "policy_context", None)) else {}
    policy = load_policy(spec, env.num_envs, str(env.device), robot=robot, control_dt=float(env.dt),
                         allow_robot_mismatch=allow_robot_mismatch, task=context.get("task"),
                         camera=context.get("camera"), instructions=context.get("instructions"))
    if policy.action_space == "command":
        low = GaitController(env.robot, env.num_envs, env.dt, device=str(env.device))
        policy = HierarchicalPolicy(policy, low)
    return policy
