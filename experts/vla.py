"""A trained VLA (RT-1-style or GeRM) as a ``command`` Policy (``experts/policy.py``).

It reads ``images/front_rgb`` uint8 (N, H, W, 3) and ``instruction`` int64 (N,) (an index into the env's
instruction table) and emits seed 003's 12-D command, which ``HierarchicalPolicy`` hands to the gait
controller (``with_gait_controller``); the command's T > 0.5 ends the episode.

Frame history runs at the IMAGE rate the model was trained on: an env takes a new frame (and computes a
new command) every ``image_every`` control steps counted from its reset, and holds its command between
frames, so a 50 Hz control loop with 5 Hz images acts on exactly the windows of the training data.
Because the front-end is causal per frame, only the new frame is encoded: each env keeps its last T
frames' TokenLearner tokens (N, T, S, D), left-padded after a reset. Envs whose frame is due act as one
batch (batch-N acting for collection); the others cost nothing.

The checkpoint's task and camera settings are checked: a different camera resolution, camera name or
image rate, or a task family the model was not trained on, is refused with a one-line error.

``load_vla(path, num_envs, ...)`` rebuilds the policy from a checkpoint alone; the policy registry
(``experts.registry``) finds it by the checkpoint's ``extra["policy_kind"] == "vla"`` (a checkpoint
path, or the spec ``vla:PATH``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from quadforge.tensors import check_index_range, row_ids
from quadforge.experts.gait import GaitController
from quadforge.experts.hierarchical import HL_COMMAND_DIM, HierarchicalPolicy
from quadforge.experts.policy import checkpoint_policy_id
from quadforge.experts.registry import LoadContext, register_policy_kind
from quadforge.models.binning import ActionBinner
from quadforge.models.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, load_state
from quadforge.models.vla import VLAConfig, images_to_float
from quadforge.models.registry import build_vla_model

POLICY_KIND = "vla"   # extra["policy_kind"] of a VLA checkpoint

IMAGE_TERM = "images/front_rgb"
INSTRUCTION_TERM = "instruction"


def check_settings(trained: Mapping[str, Any], task: str | None, camera: Mapping[str, Any] | None) -> None:
    """Refuse an env whose task or camera differs from the checkpoint's (None: not checked)."""
    if task is not None:
        have = str(trained.get("task", ""))
        # a model trained on the per-episode mix serves every QUARD family
        ok = task == have or (have == "quard:all" and task.startswith("quard:"))
        if not ok:
            raise ValueError(f"VLA checkpoint was trained on task {have!r}, the env runs {task!r}")
    if camera is not None:
        want = dict(trained.get("camera") or {})
        for key in ("name", "height", "width"):
            if key in camera and key in want and camera[key] != want[key]:
                raise ValueError(f"VLA checkpoint camera {key}={want[key]!r}, the env's camera has "
                                 f"{key}={camera[key]!r} (trained camera {want})")
        if "image_every" in camera and int(camera["image_every"]) != int(trained.get("image_every", 1)):
            raise ValueError(f"VLA checkpoint takes a frame every {trained.get('image_every')} control steps, "
                             f"the env records every {camera['image_every']}")


class VLAPolicy:
    action_space = "command"
    action_dim = HL_COMMAND_DIM
    obs_terms = (IMAGE_TERM, INSTRUCTION_TERM)

    def __init__(self, model: nn.Module, binner: ActionBinner, settings: Mapping[str, Any],
                 instructions: Sequence[str], num_envs: int, device: str | torch.device = "cpu",
                 instruction_inputs: torch.Tensor | None = None, env_instructions: Sequence[str] | None = None,
                 task: str | None = None, camera: Mapping[str, Any] | None = None, policy_id: str = "vla"):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs={num_envs}; must be >= 1")
        cfg = model.cfg
        if binner.action_dim != cfg.action_dim or binner.num_bins != cfg.num_bins:
            raise ValueError(f"binner ({binner.action_dim} x {binner.num_bins}) does not fit the model "
                             f"({cfg.action_dim} x {cfg.num_bins})")
        check_settings(settings, task, camera)
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.binner = binner.to(self.device)
        self.settings = dict(settings)
        self.image_every = int(self.settings.get("image_every", 1))
        self.image_size = tuple(cfg.image.image_size)
        self.num_envs, self.policy_id = int(num_envs), policy_id
        # instruction embeddings of the env's whole table, computed once (the encoder is frozen at act time)
        table = list(env_instructions) if env_instructions is not None else list(instructions)
        with torch.no_grad():
            if instruction_inputs is not None and table == list(instructions):
                prepared = torch.as_tensor(instruction_inputs)    # no re-encoding (wordllama need not be installed)
            else:
                prepared = self.model.frontend.prepare_instructions(table)
            self.instruction_table = table
            self.embeddings = self.model.frontend.embed_instruction(prepared.to(self.device))   # (K, E)
        n, t, s, d = self.num_envs, cfg.history, cfg.tokens_per_frame, cfg.d_model
        self.frame_tokens = torch.zeros(n, t, s, d, device=self.device)   # per env: last T frames' tokens
        self.frame_mask = torch.zeros(n, t, dtype=torch.bool, device=self.device)
        self.steps = torch.zeros(n, dtype=torch.long, device=self.device)  # control steps since reset
        self.command = torch.zeros(n, HL_COMMAND_DIM, device=self.device)  # held between frames

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        ids = row_ids(env_ids, self.num_envs, self.device, check_range="host")   # None: all; a mask: its rows
        self.frame_tokens[ids] = 0.0
        self.frame_mask[ids] = False
        self.steps[ids] = 0
        self.command[ids] = 0.0

    def _check(self, obs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        for name in self.obs_terms:
            if name not in obs:
                # a VLA reads a QUARD task's camera and instruction: the usual cause is a locomotion env
                raise ValueError(f"policy {self.policy_id} needs observation term {name!r}, which only the QUARD "
                                 f"task envs give (`eval`, `collect` or `rollout` with --task quard:<family> or "
                                 f"quard:all; eval-tracking and eval-expert sweep the locomotion terrains); this env "
                                 f"gives {len(obs)} terms without it")
        img, ins = obs[IMAGE_TERM], obs[INSTRUCTION_TERM]
        h, w = self.image_size
        if tuple(img.shape) != (self.num_envs, h, w, 3):
            raise ValueError(f"{IMAGE_TERM} has shape {tuple(img.shape)}; the checkpoint was trained on "
                             f"(num_envs={self.num_envs}, {h}, {w}, 3) frames from camera {self.settings.get('camera')}")
        ins = ins.reshape(-1).long()
        if ins.shape[0] != self.num_envs:
            raise ValueError(f"{INSTRUCTION_TERM} must be ({self.num_envs},), got {tuple(obs[INSTRUCTION_TERM].shape)}")
        k = len(self.instruction_table)
        check_index_range(ins, k, f"{INSTRUCTION_TERM} indices", of="the instruction table")
        return img, ins

    @torch.no_grad()
    def act(self, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        img, ins = self._check(obs)
        rows = ((self.steps % self.image_every) == 0).nonzero(as_tuple=True)[0]       # the envs due a frame
        if rows.numel():
            fe = self.model.frontend
            frames = images_to_float(img[rows.to(img.device)].to(self.device))       # (n, 3, H, W): only theirs cross
            e = self.embeddings[ins.to(self.device)[rows]]                            # (n, E)
            new = fe.frame_tokens(frames, e)                                          # (n, S, D)
            toks = torch.cat([self.frame_tokens[rows, 1:], new[:, None]], dim=1)        # (n, T, S, D)
            mask = torch.cat([self.frame_mask[rows, 1:], mask_true(rows.shape[0], self.device)], dim=1)
            self.frame_tokens[rows], self.frame_mask[rows] = toks, mask
            bins = self.model.act_from_tokens(*fe.assemble(toks, mask, e))            # (n, 12)
            self.command[rows] = self.binner.decode(bins)
        self.steps += 1
        return self.command.clone()


def mask_true(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, 1, dtype=torch.bool, device=device)


def with_gait_controller(vla: VLAPolicy, robot, dt: float = 0.02) -> HierarchicalPolicy:
    """The VLA over the gait controller: a ``joint`` policy for the env (``HierarchicalPolicy``)."""
    return HierarchicalPolicy(vla, GaitController(robot, vla.num_envs, dt=dt, device=vla.device))


def load_vla_model(path: str | Path, weights: bool = True) -> tuple[Path, Checkpoint, nn.Module]:
    """A VLA checkpoint (file or run directory): its file, the checkpoint and its model, with the trained
    weights or (``weights=False``) freshly initialised ones of the same config; a clear error for any other
    checkpoint kind."""
    path = Path(path)
    if path.is_dir():
        path = latest_checkpoint(path)
    ckpt = load_checkpoint(path)
    if ckpt.extra.get("policy_kind") != POLICY_KIND:
        raise ValueError(f"{path}: not a VLA checkpoint (extra['policy_kind'] is {ckpt.extra.get('policy_kind')!r})")
    model = build_vla_model(ckpt.model_name, VLAConfig.from_dict(ckpt.model_config))
    if weights:
        load_state(model, ckpt)
    return path, ckpt, model


def load_vla(path: str | Path, num_envs: int, device: str | torch.device = "cpu", task: str | None = None,
             camera: Mapping[str, Any] | None = None, instructions: Sequence[str] | None = None) -> VLAPolicy:
    """A VLA checkpoint (file or run directory) as a ``command`` Policy for ``num_envs`` envs.

    ``task`` / ``camera`` (the env's) are checked against the settings the checkpoint was trained with;
    ``instructions`` is the env's instruction table when it differs from the training one."""
    path, ckpt, model = load_vla_model(path)
    return VLAPolicy(model, ActionBinner.from_dict(ckpt.extra["binner"]), dict(ckpt.extra["settings"]),
                     list(ckpt.extra["instructions"]), num_envs, device=device,
                     instruction_inputs=ckpt.extra.get("instruction_inputs"), env_instructions=instructions,
                     task=task, camera=camera, policy_id=checkpoint_policy_id(f"vla-{ckpt.model_name}", path, ckpt.state_dict,
                                                                  ckpt.model_config))


def _load_for_registry(arg: str, ctx: LoadContext) -> VLAPolicy:
    return load_vla(arg, ctx.num_envs, ctx.device, task=ctx.task, camera=ctx.camera, instructions=ctx.instructions)


register_policy_kind("vla", _load_for_registry,
                     "a vision-language-action checkpoint (RT-1-style or GeRM over camera frames + instruction)")
