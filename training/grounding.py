"""Does a VLA read the instruction? The instruction-swap metric, measured on held-out windows while training.

A QUARD scene holds two candidates (objects, balls, letter boxes, tunnels) and the instruction names one.
For a window of frames, the policy's greedy command is computed twice: once with the episode's instruction
(naming the target) and once with the instruction naming the other candidate (``swapped_instruction``,
the same rule as ``envs.quard.families.swap_instruction``). Only the words change, so any change of the
command comes from the words. From the privileged poses at the window's newest frame (``task_base_pose``,
``task_target_pos``, ``task_distractor_pos``) we know which candidate lies more to the robot's left.

- ``toward_named``: over the windows whose two candidates differ in bearing by more than
  ``MIN_SEPARATION`` rad, the share where the lateral command (``wz + vy``: yaw rate and sideways speed,
  both positive to the left) with the original instruction minus the one with the swapped instruction
  points toward the original target's side. An exact tie (the words change nothing) counts one half, so a
  policy that ignores the words scores exactly 0.5 and one that steers to the named object 1.0.
- ``change``: the mean |Δvx| + |Δvy| + |Δwz| of the greedy command (m/s, rad/s) when only the target's
  words change: 0 for a policy that ignores them.
- ``toward_named/<family>``, ``change/<family>``: the same per family present.

The windows end in an episode's first ``DECISION_FRAMES`` image frames (1 s at 5 Hz): the decision phase,
where the robot still sees both candidates and the demonstrations turn toward the named one. Later the
chosen candidate is ahead and the other often out of view, so what "toward" means there is not defined by
the words; measured on the same checkpoint, uniform windows over whole episodes read 0.48 where the
decision windows read 0.85 (go_to), and hid the grounding a run was learning.

``GroundingProbe`` picks its windows once (seeded) from the held-out episodes of an image store and keeps
them in RAM; ``measure(model, binner)`` runs the model on them (no gradient) and returns the numbers the
trainer logs as ``val/swap_*`` rows beside the losses (console, TensorBoard, ``OUT/grounding.json``).
``swap_scores`` is the metric itself on given commands and bearings (what the tests check on toy policies).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from quadforge.data.image_sampler import ImageWindowSampler
from quadforge.data.store import TrajectoryStore
from quadforge.envs.quard.families import EpisodeScene, swap_instruction
from quadforge.envs.quard.words import COLOURS
from quadforge.experts.hierarchical import HL_COMMAND_NAMES
from quadforge.experts.vla import POLICY_KIND
from quadforge.seeding import numpy_rng
from quadforge.models.checkpoint import Checkpoint, load_state
from quadforge.models.instruction import PAD, UNK, build_vocabulary
from quadforge.models.moe import upcycled_state
from quadforge.models.registry import model_names, model_spec
from quadforge.models.vla import images_to_float

POSE_TERMS = ("task_base_pose", "task_target_pos", "task_distractor_pos")
DECISION_FRAMES = 5       # image frames from an episode's start in which its choice is made (module doc)
MIN_SEPARATION = 0.1      # rad between the candidates' bearings: below it "toward" has no direction
TIE = 1e-6                # a command change below this is "unchanged" (a policy deaf to the words)
_VX, _VY, _WZ = (HL_COMMAND_NAMES.index(n) for n in ("lin_vel_x", "lin_vel_y", "ang_vel_yaw"))


def robot_frame_polar(base_pose: torch.Tensor, point: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bearing (rad, + to the robot's left, in (-π, π]) and planar distance (m) of world ``point`` (..., ≥2)
    from a base at ``base_pose`` (..., 4: x, y, z, yaw)."""
    dx = point[..., 0] - base_pose[..., 0]
    dy = point[..., 1] - base_pose[..., 1]
    bearing = torch.atan2(dy, dx) - base_pose[..., 3]
    bearing = torch.atan2(torch.sin(bearing), torch.cos(bearing))
    return bearing, torch.hypot(dx, dy)


def swapped_instruction(params: Mapping[str, Any]) -> str | None:
    """The instruction naming the other candidate of a QUARD episode (its ``task_params``); None when the
    episode has no candidates' words (not a QUARD episode) or is itself a swapped one."""
    if not params or "distractor" not in params or "family" not in params or params.get("instruction_swapped"):
        return None
    scene = EpisodeScene(dict(params), [], (0.0, 0.0), (0.0, 0.0))
    return str(swap_instruction(scene).params["instruction"])


def _scene(params: Mapping[str, Any]) -> tuple:
    """A QUARD episode's scene identity (its seed, env and episode index; paired episodes share it)."""
    return (params.get("seed"), params.get("env_id"), params.get("episode"))


def lateral(command: torch.Tensor) -> torch.Tensor:
    """(..., 12) command -> its leftward intent wz + vy (rad/s + m/s)."""
    return command[..., _WZ] + command[..., _VY]


def swap_scores(command_named: torch.Tensor, command_swapped: torch.Tensor, bearing_named: torch.Tensor,
                bearing_other: torch.Tensor, families: Sequence[str] | None = None) -> dict[str, float]:
    """The metric (module doc) from commands (B, 12) with the original / swapped instruction and the
    candidates' bearings (B,) in the robot frame. Keys: ``toward_named``, ``change``, ``windows`` (the
    windows ``toward_named`` counts), and per family when ``families`` (B names) is given."""
    delta = lateral(command_named) - lateral(command_swapped)                  # (B,)
    side = torch.sign(bearing_named - bearing_other)
    counted = (bearing_named - bearing_other).abs() > MIN_SEPARATION
    score = torch.where(delta.abs() <= TIE, torch.full_like(delta, 0.5), (delta * side > 0).float())
    change = (command_named - command_swapped)[:, [_VX, _VY, _WZ]].abs().sum(-1)

    def block(rows: torch.Tensor, suffix: str) -> dict[str, float]:
        c = rows & counted
        return {f"toward_named{suffix}": float(score[c].mean()) if bool(c.any()) else math.nan,
                f"change{suffix}": float(change[rows].mean()) if bool(rows.any()) else math.nan}

    everyone = torch.ones_like(counted)
    out = {**block(everyone, ""), "windows": float(counted.sum())}
    if families is not None:
        names = np.asarray(list(families))
        for fam in sorted(set(names.tolist())):
            out.update(block(torch.from_numpy(names == fam), f"/{fam}"))
    return out


class GroundingProbe:
    """Fixed held-out windows of a QUARD image store, with each window's original and swapped instruction
    and the candidates' bearings at its newest frame (module doc). ``measure(model, binner)`` -> numbers."""

    def __init__(self, frames: torch.Tensor, mask: torch.Tensor, named: list[str], swapped: list[str],
                 bearing_named: torch.Tensor, bearing_other: torch.Tensor, families: list[str],
                 episodes: list[int] | None = None, frame_index: list[int] | None = None):
        self.episodes = episodes                               # the store episode of each window
        self.frame_index = frame_index                         # its newest frame's index in the episode
        self.frames, self.mask = frames, mask                  # uint8 (N, T, H, W, 3), bool (N, T)
        self.named, self.swapped, self.families = named, swapped, families
        self.bearing_named, self.bearing_other = bearing_named, bearing_other

    def __len__(self) -> int:
        return len(self.named)

    @classmethod
    def from_store(cls, path: str | Path, history: int, seed: int = 0, val_fraction: float = 0.1,
                   windows: int = 128, camera: str = "images/front_rgb", families: Sequence[str] = (),
                   decision_frames: int = DECISION_FRAMES) -> "GroundingProbe | None":
        """Up to ``windows`` windows of the store's held-out successful episodes that have two candidates
        (the trainer's seeded split: the same episodes its validation rows use; a held-out scene whose
        counterfactual partner is in the training split is left out); None when the store has
        no such episodes or lacks the privileged poses (a store not collected on a QUARD task). ``families``:
        only those QUARD families; ``decision_frames``: only windows ending in an episode's first so many
        frames (0: every window)."""
        store = TrajectoryStore.open(path)
        if any(t not in store.feature_names for t in POSE_TERMS) or camera not in store.image_features:
            return None
        try:
            sampler = ImageWindowSampler(store, cameras=[camera], history=history, next_frame=False,
                                         step_features=POSE_TERMS, split="val" if val_fraction > 0 else "all",
                                         val_fraction=val_fraction, seed=seed,
                                         filters={"success_only": True, **({"families": list(families)} if families else {})},
                                         cache_chunks=8)
        except ValueError as err:   # no held-out episodes (a tiny store)
            if "no episodes left" in str(err) or "no windows" in str(err):
                return None
            raise
        held_out = set(np.unique(sampler._win_ep).tolist())
        trained_scenes = {_scene(store.task_params(i)) for i in range(store.num_episodes) if i not in held_out}
        swapped_of: dict[int, str | None] = {}
        ok = []
        in_phase = sampler._win_j < decision_frames if decision_frames > 0 else np.ones(sampler.num_windows, bool)
        for w, ep in enumerate(sampler._win_ep.tolist()):
            if not in_phase[w]:
                continue
            if ep not in swapped_of:
                params = store.task_params(ep)
                # a scene whose counterfactual partner was trained on is not held out: its first frame was seen
                # with the swapped instruction
                seen = _scene(params) in trained_scenes and "episode" in params
                swapped_of[ep] = None if seen else swapped_instruction(params)
            if swapped_of[ep] is not None:
                ok.append(w)
        if not ok:
            return None
        rng = numpy_rng(seed, "grounding/windows")
        pick = np.sort(rng.choice(np.asarray(ok), size=min(int(windows), len(ok)), replace=False))
        b = sampler.batch_at(pick)
        eps = b["episode_index"].tolist()
        pose, target, other = (b[t][:, -1].float() for t in POSE_TERMS)
        bearing_named, _ = robot_frame_polar(pose, target)
        bearing_other, _ = robot_frame_polar(pose, other)
        return cls(b[camera], b["mask"].bool(), [store.instruction_text(e) for e in eps],
                   [swapped_of[e] for e in eps], bearing_named, bearing_other,
                   [str(store.task_params(e).get("family", "")) for e in eps], eps, b["frame"].tolist())

    @torch.no_grad()
    def commands(self, act: Callable[[torch.Tensor, torch.Tensor, list[str]], torch.Tensor],
                 texts: list[str], chunk: int = 64) -> torch.Tensor:
        """(N, 12) commands of ``act(frames uint8, mask, texts)`` over the windows in chunks."""
        out = [act(self.frames[i:i + chunk], self.mask[i:i + chunk], texts[i:i + chunk])
               for i in range(0, len(self), chunk)]
        return torch.cat(out)

    def measure_act(self, act: Callable[[torch.Tensor, torch.Tensor, list[str]], torch.Tensor]) -> dict[str, float]:
        return swap_scores(self.commands(act, self.named), self.commands(act, self.swapped),
                           self.bearing_named, self.bearing_other, self.families)

    @torch.no_grad()
    def measure(self, model: torch.nn.Module, binner: Any) -> dict[str, float]:
        """The metric of a VLA (RT-1-style or GeRM) acting greedily; ``swap_`` keys for the trainer's rows."""
        was = model.training
        model.eval()
        device = next(model.parameters()).device

        def act(frames: torch.Tensor, mask: torch.Tensor, texts: list[str]) -> torch.Tensor:
            x = images_to_float(frames.to(device))
            inputs = model.frontend.prepare_instructions(texts).to(device)
            bins = model.act_from_tokens(*model.frontend(x, mask.to(device), inputs))
            return binner.decode(bins).cpu()

        try:
            scores = self.measure_act(act)
        finally:
            model.train(was)
        return {f"swap_{k}": v for k, v in scores.items()}


def append_row(out: Path, row: Mapping[str, float]) -> None:
    """Add one validation row's swap numbers to ``OUT/grounding.json`` (a list of rows, step first)."""
    path = Path(out) / "grounding.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    rows.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()
                 if k == "step" or k.startswith("swap_")})
    path.write_text(json.dumps(rows, indent=1))


# --- colour dropout: the instruction without its colour word ---------------------------------------------

UNSEEN_WORD = "unseen"   # not a word of any QUARD instruction: the words encoder maps it to <unk>
_COLOUR_WORD = re.compile(r"\b(" + "|".join(COLOURS) + r")\b")


def blank_colours(texts: Sequence[str]) -> list[str]:
    """Each instruction with its colour words (training and held-out) replaced by ``UNSEEN_WORD``: what a
    held-out colour looks like to the words encoder (one ``<unk>``), so a model trained on both learns to
    fall back on the other words (object, shape) when the colour is one it does not know."""
    return [_COLOUR_WORD.sub(UNSEEN_WORD, str(t)) for t in texts]


def null_instruction(text: str) -> str:
    """The instruction with every word replaced by ``UNSEEN_WORD`` (``<unk>`` to the words encoder): the same
    length, no meaning. Training rows see it with ``instruction_dropout``; acting-time contrast
    (``training.vla_probe.contrasted_logits``) subtracts the model's output for it."""
    return re.sub(r"[a-z0-9]+", UNSEEN_WORD, str(text).lower())


# --- the language-blind baseline and fine-tuning vocabularies ------------------------------------------

BLIND_VOCAB = ("<blank>",)   # no instruction word is ever "<blank>" (words are [a-z0-9]+): all map to <unk>
_EMBED = "frontend.instruction.embed.weight"


def vocabulary_for(instructions: Sequence[str], blind: bool, init: Checkpoint | None) -> tuple[str, ...]:
    """The word encoder's vocabulary: none for a blind run, the starting checkpoint's for a fine-tune (so a
    store of one family fine-tunes a model trained on all of them; words it never saw map to <unk>), else
    the instruction table's words."""
    if blind:
        return BLIND_VOCAB
    if init is not None and (init.model_config or {}).get("instruction", "words") == "words":
        vocab = tuple(init.model_config.get("vocab", ()))
        unseen = sorted(set(build_vocabulary(instructions)) - set(vocab))
        if unseen:
            print(f"[vla] init_from vocabulary lacks {unseen}: they map to <unk>", flush=True)
        return vocab
    return tuple(build_vocabulary(instructions))


def upcycles(init_model: str, model_name: str) -> bool:
    """Whether a checkpoint of ``init_model`` starts a ``model_name`` run by sparse upcycling: the dense
    variant of a network (GeRM w/o MoE) into its MoE variants (GeRM, GeRM w/o RL), each expert a copy of
    the dense FFN (``models.moe.upcycled_state``). This is how a GeRM starts from a grounded GeRM w/o MoE;
    the experts then have the dense FFN's width, so the upcycled GeRM's active parameters exceed the
    dense one's (top-2: two FFNs per token)."""
    if init_model == model_name:
        return False
    try:
        have, want = model_spec(init_model, "vision"), model_spec(model_name, "vision")
    except ValueError:
        return False
    return have.dense and not want.dense and have.cls == want.cls


def upcycle_sources(model_name: str) -> tuple[str, ...]:
    """The models whose checkpoints start a ``model_name`` run by upcycling (from the model registry)."""
    return tuple(name for name in model_names(inputs="vision") if upcycles(name, model_name))


def upcycling_hint() -> str:
    """Every upcycling the registry allows, for error messages: "a germ-dense checkpoint into germ / germ-il"."""
    names = model_names(inputs="vision")
    return "; ".join(f"a {src} checkpoint into {' / '.join(dst)}" for src in names
                     if (dst := [n for n in names if upcycles(src, n)]))


def check_vla_init(init: Checkpoint, path: Any) -> None:
    """``init_from`` must be a VLA checkpoint: checked before its config is read (a locomotion model's has no
    vocabulary, which would be the error otherwise)."""
    if (init.extra or {}).get("policy_kind") != POLICY_KIND:
        raise ValueError(f"init_from={path}: not a VLA checkpoint: it holds model {init.model_name!r} (policy kind "
                         f"{(init.extra or {}).get('policy_kind')!r}); a VLA fine-tune starts from a VLA's last.pt")


def load_init_weights(model: torch.nn.Module, init: Checkpoint, vla: Any, model_name: str, path: Any) -> None:
    """Start a fine-tune from ``init``'s weights. The config must equal the run's, except that a
    language-blind run (``BLIND_VOCAB``) starting from a reading model keeps only the word table's
    padding and unknown rows (what every word becomes), and that a dense checkpoint upcycles into an MoE
    run (``upcycles``: the same config with ``moe`` on)."""
    check_vla_init(init, path)
    want = vla.to_dict()
    blind = tuple(want.get("vocab", ())) == BLIND_VOCAB and tuple(init.model_config.get("vocab", ())) != BLIND_VOCAB
    upcycle = upcycles(init.model_name, model_name)
    have = dict(init.model_config, vocab=want.get("vocab")) if blind else dict(init.model_config)
    if upcycle:
        have["moe"] = True
    have["unknown_words"] = want.get("unknown_words")   # the unknown-word backoff changes no weight
    if (init.model_name != model_name and not upcycle) or have != want:
        raise ValueError(f"init_from={path}: holds {init.model_name!r} with a different model config "
                         f"(history, sizes or vocabulary); fine-tune with the same model, preset and instructions "
                         f"(or upcycle {upcycling_hint()})")
    state = dict(init.state_dict)
    if upcycle:
        state = upcycled_state(state, model.state_dict())
        print(f"[vla] init_from {path}: {init.model_name} upcycled into {model_name} "
              f"(each of the {vla.num_experts} experts a copy of the dense FFN, router at zero)", flush=True)
    if blind:
        table = model.state_dict()[_EMBED].clone()
        table[[PAD, UNK]] = state[_EMBED][[PAD, UNK]]
        state[_EMBED] = table
    load_state(model, dataclasses.replace(init, state_dict=state))


# --- the auxiliary grounding loss -----------------------------------------------------------------------

TARGET_TERMS = ("task_base_pose", "task_target_pos")   # the step features the auxiliary target needs
DISTANCE_SCALE = 3.0                                   # m: the spawn-to-target distance, the target's unit


def target_polar(base_pose: torch.Tensor, target_pos: torch.Tensor) -> torch.Tensor:
    """(B, 4) base poses and (B, 3) named-target positions at a window's newest frame -> (B, 2) the target's
    bearing (rad, + left) and distance (m) in the robot frame: what the auxiliary head predicts."""
    bearing, distance = robot_frame_polar(base_pose, target_pos)
    return torch.stack([bearing, distance], dim=-1)


class TargetHead(torch.nn.Module):
    """MLP on the mean of the newest frame's vision-language tokens (the FiLM trunk's TokenLearner tokens,
    conditioned on the instruction) -> (sin, cos) of the named target's bearing and its distance / 3 m."""

    def __init__(self, d_model: int, tokens_per_frame: int):
        super().__init__()
        self.tokens_per_frame = int(tokens_per_frame)
        self.mlp = torch.nn.Sequential(torch.nn.LayerNorm(d_model), torch.nn.Linear(d_model, d_model),
                                       torch.nn.GELU(), torch.nn.Linear(d_model, 3))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(tokens[:, -self.tokens_per_frame:].mean(1))


class TargetAuxLoss:
    """The auxiliary grounding loss (weight ``weight``): a ``TargetHead`` reads the tokens the model's
    front-end returned in its last forward (a forward hook, so the model's own path, DDP included, is
    unchanged) and regresses the named target's bearing and distance (``target_polar`` rows of the batch).
    The head is trained with the model (``parameters()`` join the optimizer) and is not part of the
    deployed model: it only shapes the tokens."""

    def __init__(self, model: torch.nn.Module, weight: float):
        cfg = model.cfg
        self.weight = float(weight)
        self.head = TargetHead(cfg.d_model, cfg.tokens_per_frame).to(next(model.parameters()).device)
        self._tokens: torch.Tensor | None = None
        self._hook = model.frontend.register_forward_hook(self._keep)

    def _keep(self, module, inputs, output) -> None:
        self._tokens = output[0]

    def parameters(self):
        return self.head.parameters()

    def add(self, terms: dict[str, torch.Tensor], batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``terms`` with ``target`` (the auxiliary MSE, added to ``loss`` × weight) and ``target_err_deg``."""
        if "target_polar" not in batch:
            raise ValueError("target_loss needs the named target's pose in the batches (a QUARD store with "
                             f"{list(TARGET_TERMS)})")
        if self._tokens is None:
            raise RuntimeError("target_loss: the model's front-end has not run on this batch")
        pred = self.head(self._tokens)
        polar = batch["target_polar"].float()
        want = torch.stack([torch.sin(polar[:, 0]), torch.cos(polar[:, 0]), polar[:, 1] / DISTANCE_SCALE], -1)
        mse = torch.nn.functional.mse_loss(pred, want)
        err = torch.atan2(torch.sin(torch.atan2(pred[:, 0], pred[:, 1]) - polar[:, 0]),
                          torch.cos(torch.atan2(pred[:, 0], pred[:, 1]) - polar[:, 0])).abs().mean()
        self._tokens = None
        return {**terms, "loss": terms["loss"] + self.weight * mse, "target": mse.detach(),
                "target_err_deg": torch.rad2deg(err).detach()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.head.state_dict().items()}

    def close(self) -> None:
        self._hook.remove()
