"""Where does a VLA's word-to-object binding fail? Three checks on first frames of fresh QUARD scenes.

A scene's first frame shows both candidates; asked with the instruction naming either one, the answer is
the side (left / right of the other) of the one named. Every frame is asked both ways, so the picture
alone scores 0.5 and only reading the word scores above it (issue 24):

- ``legible``: the VLA's front-end (a checkpoint's weights, or fresh ones) plus a small head on the
  newest frame's tokens, trained on that side alone. It reaching ~1.0 on held-out scenes says the frames
  show what the words name, at this camera size, to this trunk.
- ``carried``: a checkpoint's front-end frozen; a linear and an MLP probe on its tokens and instruction
  embedding. Linear means FiLM has already marked the named candidate; MLP-only means the tokens hold
  both candidates' identities and places but the binding is still to be computed.
- ``acted``: the checkpoint's first command on the same frames, both ways: the share whose yaw turns
  toward the asked candidate: yaw rate + sideways velocity, as the closed-loop swap metric reads
  it (training/grounding.py), so the closed loop's decision without the walking.

    python -m quadforge.training.binding_probe experts/checkpoints/vla_rt1.pt --family distinguish
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from quadforge.envs.quard.camera import CameraConfig
from quadforge.envs.builder import make_env
from quadforge.experts.vla import load_vla, load_vla_model
from quadforge.models.vla import images_to_float
from quadforge.training.grounding import lateral, swapped_instruction

ENVS = 16


@dataclass
class AskedFrames:
    """Each first frame twice: asked for the named candidate, then for the other (labels flip)."""
    images: np.ndarray        # (2N, H, W, 3) uint8
    instructions: list[str]   # (2N,)
    left: np.ndarray          # (2N,) 1.0 where the asked candidate is left of the other

    def __len__(self) -> int:
        return len(self.instructions)


def first_frames(family: str, scenes: int, seed: int, size: int = 64) -> AskedFrames:
    """``scenes`` first frames of ``quard:<family>`` (training colours) from fresh env resets."""
    env = make_env(task=f"quard:{family}", num_envs=ENVS, seed=seed,
                   task_options={"camera": CameraConfig(width=size, height=size)})
    images, named, other, left = [], [], [], []
    try:
        while len(named) < scenes:
            env.reset()
            images.append(env.images.copy())
            for i in range(env.num_envs):
                params = env.scenes.params[i]
                named.append(str(params["instruction"]))
                other.append(swapped_instruction(params))
                left.append(float(env.scenes.target[i][1] > env.scenes.distractor[i][1]))
    finally:
        env.close()
    frames = np.concatenate(images)[:scenes]
    named, other, left = named[:scenes], other[:scenes], np.asarray(left[:scenes], np.float32)
    if any(o is None for o in other):
        raise ValueError(f"quard:{family} has no second candidate to ask for; pick a family with a choice")
    return AskedFrames(np.concatenate([frames, frames]), named + other, np.concatenate([left, 1.0 - left]))


def _floats(images: np.ndarray) -> torch.Tensor:
    return images_to_float(torch.from_numpy(images))


def _accuracy(logits_of, frames: AskedFrames, prepared: torch.Tensor, batch: int = 256) -> float:
    hits = []
    with torch.no_grad():
        for i in range(0, len(frames), batch):
            logit = logits_of(_floats(frames.images[i:i + batch]), prepared[i:i + batch])
            hits.append(((logit > 0).float() == torch.from_numpy(frames.left[i:i + batch])).float())
    return float(torch.cat(hits).mean())


def legible(checkpoint: str, train: AskedFrames, test: AskedFrames, steps: int = 500, fresh: bool = False,
            batch: int = 32, lr: float = 3e-4, seed: int = 0, every: int = 250) -> list[dict[str, float]]:
    """Train the front-end (the checkpoint's, or a fresh one of its config) and a head on the side; the
    held-out accuracy every ``every`` steps."""
    torch.manual_seed(seed)
    model = load_vla_model(checkpoint, weights=not fresh)[2]   # fresh: the checkpoint's config, not its weights
    fe, cfg = model.frontend.train(), model.cfg
    head = nn.Sequential(nn.LayerNorm(cfg.d_model), nn.Flatten(), nn.Linear(cfg.tokens_per_frame * cfg.d_model, cfg.d_model),
                         nn.GELU(), nn.Linear(cfg.d_model, 1))

    def logits_of(x: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        return head(fe.frame_tokens(x, fe.embed_instruction(prepared))).squeeze(1)

    train_in, test_in = fe.prepare_instructions(train.instructions), fe.prepare_instructions(test.instructions)
    opt = torch.optim.AdamW(list(fe.parameters()) + list(head.parameters()), lr, weight_decay=1e-4)
    gen, rows, t0 = torch.Generator().manual_seed(seed), [], time.time()
    for step in range(1, steps + 1):
        i = torch.randint(0, len(train), (batch,), generator=gen).numpy()
        loss = F.binary_cross_entropy_with_logits(logits_of(_floats(train.images[i]), train_in[i]),
                                                  torch.from_numpy(train.left[i]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0 or step == steps:
            fe.eval()
            rows.append({"step": step, "loss": loss.item(), "held_out": _accuracy(logits_of, test, test_in),
                         "seconds": time.time() - t0})
            fe.train()
    return rows


def carried(checkpoint: str, train: AskedFrames, test: AskedFrames, steps: int = 3000, seed: int = 0) -> dict[str, float]:
    """Held-out accuracy of a linear and an MLP probe on the frozen front-end's newest-frame tokens and
    instruction embedding."""
    fe = load_vla(checkpoint, 1).model.frontend.eval()

    def features(frames: AskedFrames) -> torch.Tensor:
        out = []
        with torch.no_grad():
            for i in range(0, len(frames), 128):
                e = fe.embed_instruction(fe.prepare_instructions(frames.instructions[i:i + 128]))
                out.append(torch.cat([fe.frame_tokens(_floats(frames.images[i:i + 128]), e).flatten(1), e], 1))
        return torch.cat(out)

    xtr, xte = features(train), features(test)
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-5
    xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    ytr, yte = torch.from_numpy(train.left), torch.from_numpy(test.left)
    out = {}
    for name, hidden in (("linear", 0), ("mlp", 256)):
        torch.manual_seed(seed)
        probe = (nn.Linear(xtr.shape[1], 1) if not hidden else
                 nn.Sequential(nn.Linear(xtr.shape[1], hidden), nn.SiLU(), nn.Linear(hidden, 1)))
        opt = torch.optim.AdamW(probe.parameters(), 1e-3, weight_decay=1e-2)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            i = torch.randint(0, len(xtr), (128,), generator=gen)
            loss = F.binary_cross_entropy_with_logits(probe(xtr[i]).squeeze(1), ytr[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            out[name] = float(((probe(xte).squeeze(1) > 0).float() == yte).float().mean())
    return out


def acted(checkpoint: str, test: AskedFrames) -> dict[str, float]:
    """The checkpoint's first command on each frame (one real frame in its history), asked both ways."""
    policy = load_vla(checkpoint, len(test), instructions=test.instructions)
    policy.reset()
    command = policy.act({"images/front_rgb": torch.from_numpy(test.images), "instruction": torch.arange(len(test))})
    # leftward intent as the closed-loop swap metric reads it (yaw rate + sideways velocity)
    left = lateral(command).cpu().numpy()
    half = len(test) // 2
    return {"toward_asked": float((np.sign(left) == np.where(test.left > 0, 1.0, -1.0)).mean()),
            "same_turn_both_ways": float((np.sign(left[:half]) == np.sign(left[half:])).mean())}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m quadforge.training.binding_probe", description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", help="a VLA checkpoint (its front-end; --fresh: only its config)")
    p.add_argument("--family", default="distinguish", help="a QUARD family with two candidates")
    p.add_argument("--scenes", type=int, default=4000, help="training scenes (each asked both ways)")
    p.add_argument("--test-scenes", type=int, default=1000, help="held-out scenes (another seed)")
    p.add_argument("--steps", type=int, default=500, help="legible: training steps of batch 32")
    p.add_argument("--seed", type=int, default=1, help="the training scenes' env seed; held-out: seed + 1")
    p.add_argument("--checks", default="legible,carried,acted", help="comma list of legible, carried, acted")
    p.add_argument("--fresh", action="store_true", help="legible: a fresh front-end of the checkpoint's config")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args(argv)
    checks = [c for c in a.checks.split(",") if c]
    unknown = sorted(set(checks) - {"legible", "carried", "acted"})
    if unknown:
        p.error(f"--checks {unknown}: allowed legible, carried, acted")
    if not Path(a.checkpoint).exists():
        p.error(f"checkpoint {a.checkpoint} does not exist")
    torch.set_num_threads(1)
    try:
        test = first_frames(a.family, a.test_scenes, a.seed + 1)
        train = first_frames(a.family, a.scenes, a.seed) if {"legible", "carried"} & set(checks) else None
    except ValueError as e:   # an unknown family, or one without a second candidate: one line, not a traceback
        p.error(f"--family {a.family}: {e}")
    out: dict[str, Any] = {"checkpoint": a.checkpoint, "family": a.family, "scenes": a.scenes,
                           "test_scenes": a.test_scenes, "seed": a.seed}
    if "acted" in checks:
        out["acted"] = acted(a.checkpoint, test)
        print(f"acted   toward the asked candidate {out['acted']['toward_asked']:.3f} "
              f"(same turn both ways {out['acted']['same_turn_both_ways']:.3f})", flush=True)
    if "carried" in checks:
        out["carried"] = carried(a.checkpoint, train, test)
        print(f"carried linear {out['carried']['linear']:.3f}  mlp {out['carried']['mlp']:.3f}", flush=True)
    if "legible" in checks:
        out["legible"] = legible(a.checkpoint, train, test, a.steps, fresh=a.fresh)
        print("legible " + "  ".join(f"step {r['step']}: {r['held_out']:.3f}" for r in out["legible"]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
