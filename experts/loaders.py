"""Load outside (and our own) expert checkpoints as ``experts.policy.Policy`` objects.

``load_expert(path, kind="auto"|"rsl_rl"|"torchscript"|"wtw", layout=..., robot=..., num_envs=...)``.
Formats, each with an explicit observation adapter (``experts.actor_policy``):

- ``rsl_rl`` v1 (legged_gym era, rsl_rl 1-3): ``{"model_state_dict": {"actor.0.weight", ..., "std",
  "critic.0.weight", ...}, "optimizer_state_dict", "iter", "infos"}``; the actor is ``nn.Sequential``
  Linear/activation pairs at even indices; empirical obs normalisation, when used, is
  ``model_state_dict["actor_obs_normalizer._mean"/"._std"]`` (rsl_rl 3) or ``obs_norm_state_dict`` (2.x).
- ``rsl_rl`` v5 (rsl_rl 5.x ``PPO.save()``): ``{"actor_state_dict": {"mlp.0.weight", ...,
  "distribution.std_param", ["obs_normalizer._mean", "obs_normalizer._std", ...]}, "critic_state_dict",
  "optimizer_state_dict", "iter", "infos"}``. Checkpoints from ``quadforge train-expert`` carry
  ``infos["quadforge"]`` (the actor's layout, robot, action scale), so they load without options.
- ``torchscript``: a scripted actor taking the flat observation (legged_gym's ``policy_1.pt``: 48-D or
  235-D; rsl_rl's ``policy.pt`` export).
- ``wtw``: walk-these-ways' ``body_latest.jit`` + ``adaptation_module_latest.jit``: the adaptation module
  maps the 30 x 70-D history to a latent estimate, the body maps [history, latent] to 12 actions; the
  history is recurrent state per env (``HistoryObs``), zeroed on reset.

Conventions of outside sources that differ from ours are explicit arguments with the source's values as
defaults: joint order (Isaac Gym's FL, FR, RL, RR for legged_gym / walk-these-ways), action scale (0.25),
walk-these-ways' hip action reduction (0.5), action clip (10) and command observation scales.
"""
from __future__ import annotations

import re
import warnings
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from quadforge.layout import LAYOUTS, LEGS, NUM_JOINTS, WTW_70, ObsLayout, get_layout
from quadforge.envs.robots import get_robot
from quadforge.experts.actor_policy import ISAAC_GYM_LEGS, ActorPolicy, FrameObs, HistoryObs, JointOrder
from quadforge.experts.policy import checkpoint_policy_id
from quadforge.checkpoint_sniff import load_error, sniff

KINDS = ("auto", "rsl_rl", "torchscript", "wtw")

# legged_gym / walk-these-ways Go1 and A1: q_target = q_default + 0.25 * a.
SOURCE_ACTION_SCALE = 0.25
# walk-these-ways (go1_config / lcm_agent): hip actions are scaled by 0.5, actions clipped to +-10,
# the 15 commands scaled by obs_scales: lin_vel 2, ang_vel 0.25, body_height 2, gait freq/phase/offset/
# bound/duration 1, footswing 0.15, pitch 0.3, roll 0.3, stance width/length 1, aux 1.
WTW_HIP_SCALE_REDUCTION = 0.5
WTW_CLIP_ACTIONS = 10.0
WTW_HISTORY = 30
WTW_COMMAND_SCALES = (2.0, 2.0, 0.25, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.15, 0.3, 0.3, 1.0, 1.0, 1.0)
RSL_RL_PREFIX = "model_"    # rsl_rl run directories hold model_<iteration>.pt
WTW_BODY = "body_latest.jit"
WTW_ADAPTATION = "adaptation_module_latest.jit"
# rsl_rl's EmpiricalNormalization: (x - mean) / (std + eps)
RSL_RL_NORM_EPS = 1e-2


def wtw_layout() -> ObsLayout:
    """``quadforge.layout.WTW_70`` with walk-these-ways' command scales (the named layout keeps raw commands)."""
    terms = tuple(replace(t, scale=WTW_COMMAND_SCALES) if t.name == "commands" else t for t in WTW_70.terms)
    return ObsLayout("wtw_70_scaled_commands", terms, clip=100.0)


# --- the actor network rebuilt from a state dict -------------------------------------------------------
class MLPActor(nn.Module):
    """Optional empirical normalisation, then Linear/activation layers (the last one linear)."""

    def __init__(self, weights: list[tuple[torch.Tensor, torch.Tensor]], activation: str,
                 norm: tuple[torch.Tensor, torch.Tensor] | None = None, norm_eps: float = RSL_RL_NORM_EPS):
        super().__init__()
        act = _activation(activation)
        layers: list[nn.Module] = []
        for i, (w, b) in enumerate(weights):
            lin = nn.Linear(w.shape[1], w.shape[0])
            with torch.no_grad():
                lin.weight.copy_(w)
                lin.bias.copy_(b)
            layers += [lin] if i == len(weights) - 1 else [lin, act]
        self.mlp = nn.Sequential(*layers)
        self.in_dim, self.out_dim = weights[0][0].shape[1], weights[-1][0].shape[0]
        self.normalize = norm is not None
        if norm is not None:
            for name, v in zip(("obs_mean", "obs_std"), norm):
                if v.numel() != self.in_dim:
                    raise ValueError(f"observation normaliser {name} has {v.numel()} entries; the actor reads "
                                     f"{self.in_dim}")
                self.register_buffer(name, v.reshape(-1).detach().float().cpu().clone())
        self.norm_eps = norm_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # (N, in) -> (N, out)
        if self.normalize:
            x = (x - self.obs_mean) / (self.obs_std + self.norm_eps)
        return self.mlp(x)


def _activation(name: str) -> nn.Module:
    acts = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh, "selu": nn.SELU, "lrelu": nn.LeakyReLU,
            "sigmoid": nn.Sigmoid, "softplus": nn.Softplus, "gelu": nn.GELU, "swish": nn.SiLU, "mish": nn.Mish}
    if name not in acts:
        raise ValueError(f"activation={name!r} is invalid; allowed: {sorted(acts)}")
    return acts[name]()


def mlp_weights(sd: Mapping[str, torch.Tensor], prefix: str, source: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``prefix<i>.weight/bias`` Linear layers of an ``nn.Sequential``, in order, shape-checked."""
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)\.weight$")
    idx = sorted(int(m.group(1)) for k in sd if (m := pattern.match(k)))
    if not idx:
        raise ValueError(f"{source}: missing actor weights {prefix}0.weight, ...; found keys {sorted(sd)[:8]}")
    weights = []
    for i in idx:
        w, b = sd[f"{prefix}{i}.weight"], sd.get(f"{prefix}{i}.bias")
        if b is None:
            raise ValueError(f"{source}: missing key {prefix}{i}.bias (weight {prefix}{i}.weight is present)")
        if weights and w.shape[1] != weights[-1][0].shape[0]:
            raise ValueError(f"{source}: layer {prefix}{i}.weight reads {w.shape[1]} inputs but the previous "
                             f"layer outputs {weights[-1][0].shape[0]}")
        weights.append((w.detach().float().cpu(), b.detach().float().cpu()))
    return weights


# --- format detection --------------------------------------------------------------------------------
def detect_kind(path: str | Path) -> str:
    """``rsl_rl``, ``torchscript``, ``wtw`` or ``quadforge`` (a model trained by ``quadforge train``)."""
    path = Path(path)
    if path.is_dir():
        if (path / WTW_BODY).is_file() or (path / "checkpoints" / WTW_BODY).is_file():
            return "wtw"
        if list(path.glob(f"{RSL_RL_PREFIX}*.pt")):
            return "rsl_rl"
        if (path / "last.pt").is_file() or list(path.glob("step_*.pt")):
            return "quadforge"
        raise FileNotFoundError(f"{path}: no expert checkpoint inside (expected {WTW_BODY}, model_<it>.pt, "
                                "last.pt or step_<n>.pt)")
    if path.name.startswith(("body", "adaptation_module")) and path.suffix == ".jit":
        return "wtw"
    if sniff(path) == "zip":
        with zipfile.ZipFile(path) as z:
            if any(n.endswith("constants.pkl") or "/code/" in n for n in z.namelist()):
                return "torchscript"
    raw = _torch_load(path)
    if isinstance(raw, Mapping):
        if raw.get("kind") == "quadforge-policy":
            return "quadforge"
        if "actor_state_dict" in raw or "model_state_dict" in raw:
            return "rsl_rl"
    keys = sorted(raw)[:8] if isinstance(raw, Mapping) else type(raw).__name__
    raise ValueError(f"{path}: not a known expert checkpoint (expected rsl_rl 'actor_state_dict' / "
                     f"'model_state_dict', a TorchScript archive or {WTW_BODY}); found {keys}")


def _torch_load(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    sniff(path)
    try:  # rsl_rl checkpoints are plain tensors/dicts; weights_only refuses arbitrary pickles
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise load_error(path, err) from err


# --- layouts -----------------------------------------------------------------------------------------
def resolve_layout(layout: str | ObsLayout | None, in_dim: int | None, source: str,
                   trained_layout: ObsLayout | None = None) -> ObsLayout:
    """The explicit layout, else the one the checkpoint records, else the one named layout of ``in_dim``."""
    if isinstance(layout, ObsLayout):
        chosen = layout
    elif layout is not None:
        chosen = get_layout(layout)  # ValueError naming the allowed layouts
    elif trained_layout is not None:
        chosen = trained_layout
    else:
        fits = [name for name, lay in LAYOUTS.items() if lay.dim == in_dim]
        if len(fits) != 1:
            raise ValueError(f"{source}: cannot infer the layout of a {in_dim}-D actor; pass layout= one of "
                             f"{ {n: l.dim for n, l in LAYOUTS.items()} }")
        chosen = LAYOUTS[fits[0]]
    if trained_layout is not None and chosen.name != trained_layout.name:
        raise ValueError(f"{source}: the checkpoint was trained on layout {trained_layout.name!r}, "
                         f"got layout {chosen.name!r}")
    return chosen


def _check_dims(source: str, layout: ObsLayout, in_dim: int | None, out_dim: int, frames: int = 1) -> None:
    if in_dim is not None and in_dim != frames * layout.dim:
        what = f"{frames} x {layout.dim}-D" if frames > 1 else f"{layout.dim}-D"
        raise ValueError(f"{source}: the network reads {in_dim}-D observations but layout {layout.name!r} "
                         f"gives {what}")
    if out_dim != NUM_JOINTS:
        raise ValueError(f"{source}: the network outputs {out_dim} actions; expected {NUM_JOINTS} joint actions")


def _action_gain(robot: str, source_scale: float, hip_reduction: float = 1.0) -> torch.Tensor:
    gain = torch.full((NUM_JOINTS,), source_scale / float(get_robot(robot).action_scale))
    gain[0::3] *= hip_reduction  # hips are every third joint in any leg-major order
    return gain


def rsl_rl_checkpoints(directory: str | Path) -> list[Path]:
    """The ``model_<it>.pt`` files of an rsl_rl run directory, by iteration (another ``model_*`` name is none)."""
    paths = [p for p in Path(directory).glob(f"{RSL_RL_PREFIX}*.pt") if p.stem[len(RSL_RL_PREFIX):].isdigit()]
    return sorted(paths, key=rsl_rl_iteration)


def rsl_rl_iteration(path: Path) -> int:
    """The iteration a ``model_<it>.pt`` was saved after."""
    return int(path.stem[len(RSL_RL_PREFIX):])


def latest_rsl_rl_checkpoint(directory: str | Path) -> Path:
    """The ``model_<it>.pt`` with the highest iteration in an rsl_rl run directory."""
    paths = rsl_rl_checkpoints(directory)
    if not paths:
        raise FileNotFoundError(f"no {RSL_RL_PREFIX}<iteration>.pt checkpoint in {directory}")
    return paths[-1]


# --- the loaders -------------------------------------------------------------------------------------
def load_rsl_rl(path: Path, layout: str | ObsLayout | None, robot: str, num_envs: int, device: str,
                joint_order: Sequence[str] | str | None = None, activation: str | None = None,
                source_action_scale: float | None = None) -> ActorPolicy:
    raw = _torch_load(path)
    source = str(path)
    if not isinstance(raw, Mapping):
        raise ValueError(f"{source}: an rsl_rl checkpoint is a dict; found {type(raw).__name__}")
    meta = (raw.get("infos") or {}).get("quadforge") if isinstance(raw.get("infos"), Mapping) else None
    if "actor_state_dict" in raw:      # rsl_rl 5.x
        sd, prefix = raw["actor_state_dict"], "mlp."
        norm_keys = ("obs_normalizer._mean", "obs_normalizer._std")
        norm = tuple(sd[k] for k in norm_keys) if all(k in sd for k in norm_keys) else None
    elif "model_state_dict" in raw:    # rsl_rl 1-3 (legged_gym)
        sd, prefix = raw["model_state_dict"], "actor."
        norm_keys = ("actor_obs_normalizer._mean", "actor_obs_normalizer._std")
        norm = tuple(sd[k] for k in norm_keys) if all(k in sd for k in norm_keys) else None
        if norm is None and isinstance(raw.get("obs_norm_state_dict"), Mapping):
            ons = raw["obs_norm_state_dict"]
            if not all(k in ons for k in ("_mean", "_std")):
                raise ValueError(f"{source}: obs_norm_state_dict lacks '_mean'/'_std'; found {sorted(ons)}")
            norm = (ons["_mean"], ons["_std"])
    else:
        raise ValueError(f"{source}: missing keys: an rsl_rl checkpoint has 'actor_state_dict' (rsl_rl 5) or "
                         f"'model_state_dict' (rsl_rl 1-3); found {sorted(raw)}")
    weights = mlp_weights(sd, prefix, source)
    preset = (meta or {}).get("preset_config") or {}
    actor = MLPActor(weights, activation or preset.get("activation", "elu"), norm).to(device).eval()
    trained = ObsLayout.from_dict(meta["policy_layout"]) if meta and "policy_layout" in meta else None
    lay = resolve_layout(layout, actor.in_dim, source, trained)
    _check_dims(source, lay, actor.in_dim, actor.out_dim)
    if meta is not None:  # trained here: our joint order and the recorded action scale
        order, scale = joint_order or LEGS, source_action_scale or float(meta.get("action_scale", SOURCE_ACTION_SCALE))
        trained_robot = meta.get("robot", "go1")
        if robot is not None and robot != trained_robot:
            raise ValueError(f"{source}: the expert was trained on robot {trained_robot!r}, got robot {robot!r}")
        robot = trained_robot
    else:
        order, scale = joint_order or ISAAC_GYM_LEGS, source_action_scale or SOURCE_ACTION_SCALE
    gen = "v5" if prefix == "mlp." else "v1"
    # the env it was trained in clipped its actions there (env.observations.clip_actions): so does the policy,
    # in whichever env it runs (files from before the clip was recorded: none, the default 100 anyway)
    clip = (meta or {}).get("clip_actions")
    return ActorPolicy(actor, FrameObs(lay, num_envs, torch.device(device)), num_envs, device,
                       policy_id=checkpoint_policy_id(f"rsl_rl_{gen}", path), action_gain=_action_gain(robot or "go1", scale),
                       joint_order=JointOrder(order), clip_actions=float(clip) if clip is not None else None)


def _jit_load(path: Path, device: str) -> torch.jit.ScriptModule:
    if not path.is_file():
        raise FileNotFoundError(f"TorchScript file {path} does not exist")
    try:
        with warnings.catch_warnings():  # TorchScript is deprecated upstream, but it is the format these files are in
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(str(path), map_location=device).eval()
    except Exception as err:
        raise ValueError(f"{path} is not a TorchScript module: {type(err).__name__}") from err


def _first_in_dim(module: torch.jit.ScriptModule) -> int | None:
    for _, p in module.named_parameters():
        if p.dim() == 2:
            return int(p.shape[1])
    return None


def _probe(module: Any, in_dim: int, source: str, what: str) -> int:
    """Output width of ``module`` on a zero (1, in_dim) input; a width mismatch is a clear error."""
    try:
        with torch.no_grad():
            out = module(torch.zeros(1, in_dim, device=next(iter(module.parameters()), torch.zeros(0)).device))
    except RuntimeError as err:
        raise ValueError(f"{source}: the {what} does not accept {in_dim}-D inputs "
                         f"({str(err).splitlines()[0]})") from err
    return int(out.shape[-1])


def load_torchscript(path: Path, layout: str | ObsLayout | None, robot: str, num_envs: int, device: str,
                     joint_order: Sequence[str] | str | None = None,
                     source_action_scale: float | None = None) -> ActorPolicy:
    net = _jit_load(path, device)
    in_dim = _first_in_dim(net)
    lay = resolve_layout(layout, in_dim, str(path))
    _check_dims(str(path), lay, in_dim, NUM_JOINTS)  # the input width first: the probe needs it right
    _check_dims(str(path), lay, in_dim, _probe(net, lay.dim, str(path), "scripted actor"))
    return ActorPolicy(net, FrameObs(lay, num_envs, torch.device(device)), num_envs, device,
                       policy_id=checkpoint_policy_id("torchscript", path),
                       action_gain=_action_gain(robot, source_action_scale or SOURCE_ACTION_SCALE),
                       joint_order=JointOrder(joint_order or ISAAC_GYM_LEGS))


class WtwNet(nn.Module):
    """walk-these-ways inference: latent = adaptation(history); actions = body([history, latent])."""

    def __init__(self, body: nn.Module, adaptation: nn.Module):
        super().__init__()
        self.body, self.adaptation = body, adaptation

    def forward(self, history: torch.Tensor) -> torch.Tensor:  # (N, H*D) -> (N, 12)
        return self.body(torch.cat([history, self.adaptation(history)], dim=-1))


def wtw_files(path: Path) -> tuple[Path, Path]:
    """(body, adaptation module) from a checkpoints directory, its run directory or the body file."""
    if path.is_dir():
        folder = path / "checkpoints" if (path / "checkpoints" / WTW_BODY).is_file() else path
        body, adaptation = folder / WTW_BODY, folder / WTW_ADAPTATION
    else:
        body, adaptation = path, path.with_name(path.name.replace("body", "adaptation_module", 1))
        if path.name.startswith("adaptation_module"):
            body, adaptation = path.with_name(path.name.replace("adaptation_module", "body", 1)), path
    for f in (body, adaptation):
        if not f.is_file():
            raise FileNotFoundError(f"walk-these-ways checkpoint needs {f.name} next to the other file; "
                                    f"{f} does not exist")
    return body, adaptation


def load_wtw(path: Path, layout: str | ObsLayout | None, robot: str, num_envs: int, device: str,
             joint_order: Sequence[str] | str | None = None, history: int | None = None,
             hip_scale_reduction: float = WTW_HIP_SCALE_REDUCTION, clip_actions: float = WTW_CLIP_ACTIONS,
             source_action_scale: float | None = None) -> ActorPolicy:
    body_path, adapt_path = wtw_files(path)
    body, adaptation = _jit_load(body_path, device), _jit_load(adapt_path, device)
    lay = wtw_layout() if layout is None else resolve_layout(layout, None, str(path))
    in_dim = _first_in_dim(adaptation)
    if history is None:
        if in_dim is None:
            history = WTW_HISTORY
        elif in_dim % lay.dim:
            raise ValueError(f"{adapt_path}: the adaptation module reads {in_dim}-D inputs, not a whole number "
                             f"of {lay.dim}-D {lay.name!r} frames")
        else:
            history = in_dim // lay.dim
    _check_dims(str(adapt_path), lay, in_dim, NUM_JOINTS, frames=history)
    latent = _probe(adaptation, history * lay.dim, str(adapt_path), "adaptation module")
    body_in = _first_in_dim(body)
    if body_in is not None and body_in != history * lay.dim + latent:
        raise ValueError(f"{body_path}: the body reads {body_in}-D inputs; expected history {history} x "
                         f"{lay.dim} + latent {latent} = {history * lay.dim + latent}")
    out = _probe(body, history * lay.dim + latent, str(body_path), "body")
    _check_dims(str(body_path), lay, None, out)
    return ActorPolicy(WtwNet(body, adaptation), HistoryObs(lay, num_envs, torch.device(device), history),
                       num_envs, device, policy_id=checkpoint_policy_id("wtw", body_path), clip_actions=clip_actions,
                       action_gain=_action_gain(robot, source_action_scale or SOURCE_ACTION_SCALE,
                                                hip_scale_reduction),
                       joint_order=JointOrder(joint_order or ISAAC_GYM_LEGS))


def load_expert(path: str | Path, kind: str = "auto", layout: str | ObsLayout | None = None,
                robot: str | None = None, num_envs: int = 1, device: str = "cpu", **options: Any) -> ActorPolicy:
    """An expert checkpoint as a Policy. ``options`` go to the format's loader (``joint_order``,
    ``source_action_scale``, ``activation``; wtw: ``history``, ``hip_scale_reduction``, ``clip_actions``)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is invalid; allowed: {KINDS}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"expert checkpoint {path} does not exist")
    if kind == "auto":
        kind = detect_kind(path)
        if kind == "quadforge":
            raise ValueError(f"{path} is a quadforge trained-model checkpoint; load it with "
                             "quadforge.experts.registry.load_policy")
    if kind == "rsl_rl" and path.is_dir():
        path = latest_rsl_rl_checkpoint(path)
    loaders = {"rsl_rl": load_rsl_rl, "torchscript": load_torchscript, "wtw": load_wtw}
    if kind != "rsl_rl" and robot is None:
        robot = "go1"
    try:
        return loaders[kind](path, layout, robot, int(num_envs), device, **options)
    except TypeError as err:
        if "unexpected keyword" in str(err):
            raise ValueError(f"load_expert(kind={kind!r}): {err}") from err
        raise

