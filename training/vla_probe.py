"""Does a VLA steer? Its greedy planar commands against the demonstrations' on held-out windows, by family.

Closed-loop success can hide a policy that walks straight at the instructed gait (a straight walk passes
within the success radius of both go_to slots). This compares, window by window, the yaw rate (and
lateral speed) a checkpoint commands with the one the demonstration commanded on the same frames:
mean magnitudes, mean absolute error, correlation and the regression slope of commanded on demonstrated
(1: steers as much as the expert; 0: not at all). The numbers of the shipped checkpoints are in
experts/checkpoints/VLA_MODEL_CARD.md.

    from quadforge.training.vla_probe import steering_by_family
    steering_by_family("experts/checkpoints/vla_rt1.pt", "quard_demos")   # {"all": {...}, "go_to": {...}, ...}

Does it read the words? ``swap_by_family`` is the trainer's instruction-swap metric (``training.grounding``)
for a checkpoint on a store's windows: ``python -m quadforge.training.vla_probe CHECKPOINT STORE --swap``
(``--split all`` for a store the checkpoint was not trained on).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from quadforge.envs.quard.instructions import parse_instruction
from quadforge.experts.vla import load_vla
from quadforge.training.grounding import DECISION_FRAMES, GroundingProbe, null_instruction
from quadforge.models.vla import images_to_float
from quadforge.training.vla import act_bins
from quadforge.training.vla_data import ImageWindowSource, open_image_source

STEERING_DIMS = {"vy": 1, "wz": 2}   # indices into HL_COMMAND_NAMES


def quard_family(text: str) -> str:
    """The QUARD family an instruction belongs to ("other" for text that fits no template)."""
    try:
        return str(parse_instruction(text)["family"])
    except ValueError:
        return "other"


def steering_stats(data: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """One dimension's agreement: magnitudes, mean |error|, correlation and slope of pred on data."""
    moving = data.std() > 0 and pred.std() > 0
    return {"n": int(len(data)), "data_abs": float(np.abs(data).mean()), "pred_abs": float(np.abs(pred).mean()),
            "error": float(np.abs(pred - data).mean()),
            "corr": float(np.corrcoef(data, pred)[0, 1]) if moving else float("nan"),
            "slope": float(np.polyfit(data, pred, 1)[0]) if data.std() > 0 else float("nan")}


@torch.no_grad()
def steering_by_family(checkpoint: str, source: ImageWindowSource | str, windows: int = 512, batch: int = 64,
                       seed: int = 0, split: str = "val",
                       family_of: Callable[[str], str] = quard_family) -> dict[str, dict[str, dict[str, float]]]:
    """``{family or "all": {"wz": stats, "vy": stats}}`` over ``windows`` windows of the demonstrations'
    successes (a store path: its ``split`` episodes, the trainer's seeded held-out 10 % by default)."""
    policy = load_vla(checkpoint, 1)
    model = policy.model.eval()
    t = model.cfg.history
    if not isinstance(source, ImageWindowSource):
        source = open_image_source(str(source), t, seed=seed, split=split, success_only=True)
    torch.manual_seed(seed)
    fams: list[str] = []
    data, pred = [], []
    for _ in range(max(1, windows // batch)):
        b = source.sample(batch)
        texts = [source.instructions[i] for i in b["instruction"].tolist()]
        cmd = policy.binner.decode(act_bins(model, images_to_float(b["frames"][:, :t]), b["frame_mask"][:, :t].bool(),
                                            model.frontend.prepare_instructions(texts)))
        fams += [family_of(s) for s in texts]
        data.append(b["action"].float())
        pred.append(cmd.float())
    d, p = torch.cat(data).numpy(), torch.cat(pred).numpy()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for fam in ["all", *sorted(set(fams))]:
        rows = np.array([fam == "all" or f == fam for f in fams])
        out[fam] = {name: steering_stats(d[rows, i], p[rows, i]) for name, i in STEERING_DIMS.items()}
    return out


def swap_by_family(checkpoint: str, store: str, windows: int = 256, seed: int = 0, split: str = "val",
                   families: tuple[str, ...] = (), decision_frames: int = DECISION_FRAMES,
                   contrast: float = 0.0) -> dict[str, float]:
    """The instruction-swap metric (``training.grounding.swap_scores``: ``toward_named``, ``change``, per
    family) of a checkpoint on ``windows`` successful windows of ``store`` (``split`` "val": the trainer's
    seeded held-out episodes; "all": every episode; ``decision_frames``: windows ending in each episode's
    first so many frames, 0: any). ``contrast`` w != 0 acts on ``contrasted_logits`` instead of the plain
    greedy bins (RT-1-style only)."""
    policy = load_vla(checkpoint, 1)
    probe = GroundingProbe.from_store(store, policy.model.cfg.history, seed=seed,
                                      val_fraction=0.1 if split == "val" else 0.0, windows=windows,
                                      families=families, decision_frames=decision_frames)
    if probe is None:
        raise ValueError(f"{store}: no successful QUARD windows with two candidates (split {split!r})")
    if not contrast:
        return {k[len("swap_"):]: v for k, v in probe.measure(policy.model, policy.binner).items()}
    if policy.model.name != "rt1":
        raise ValueError(f"--contrast: RT-1-style checkpoints only ({checkpoint} holds {policy.model.name!r}, which "
                         f"decodes its dimensions one after another)")
    model, binner = policy.model.eval(), policy.binner

    @torch.no_grad()
    def act(frames: torch.Tensor, mask: torch.Tensor, texts: list[str]) -> torch.Tensor:
        return binner.decode(contrasted_logits(model, images_to_float(frames), mask, texts, contrast).argmax(-1))
    return probe.measure_act(act)


def contrasted_logits(model: torch.nn.Module, frames: torch.Tensor, mask: torch.Tensor, texts: list[str],
                      w: float) -> torch.Tensor:
    """Classifier-free-guidance-style contrast at acting time: ``l(instr) + w (l(instr) - l(null))`` with the
    null instruction of ``null_instruction``. Measured in docs/vla.md ("Grounding"): on a model never
    trained on null instructions it does not help, since its null output is not a language-free one."""
    fe = model.frontend
    on = model(frames, mask, fe.prepare_instructions(texts)).logits
    off = model(frames, mask, fe.prepare_instructions([null_instruction(t) for t in texts])).logits
    return on + w * (on - off)


def format_steering(report: dict[str, dict[str, dict[str, float]]], dim: str = "wz") -> str:
    lines = [f"| family | windows | mean abs {dim}, data | mean abs {dim}, commanded | error | corr | slope |",
             "|---|---|---|---|---|---|---|"]
    for fam, dims in report.items():
        s = dims[dim]
        lines.append(f"| {fam} | {s['n']} | {s['data_abs']:.3f} | {s['pred_abs']:.3f} | {s['error']:.3f} | "
                     f"{s['corr']:.2f} | {s['slope']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:   # python -m quadforge.training.vla_probe CKPT STORE
    import argparse
    p = argparse.ArgumentParser(prog="python -m quadforge.training.vla_probe")
    p.add_argument("checkpoint")
    p.add_argument("store")
    p.add_argument("--swap", action="store_true", help="the instruction-swap metric instead of the steering table")
    p.add_argument("--split", choices=("val", "all"), default="val")
    p.add_argument("--windows", type=int, default=None, help="windows measured (default 256 with --swap, else 512)")
    p.add_argument("--families", default=None, help="--swap: comma-separated QUARD families (default: all in the store)")
    p.add_argument("--decision-frames", type=int, default=None,
                   help=f"--swap: windows end in an episode's first N image frames (0: anywhere; default {DECISION_FRAMES})")
    p.add_argument("--contrast", type=float, default=None, metavar="W", help="--swap, RT-1-style: act on "
                   "l(instr) + W (l(instr) - l(null instruction)) (docs/vla.md, Grounding; default 0)")
    args = p.parse_args(argv)
    if args.windows is not None and args.windows < 1:
        p.error(f"--windows {args.windows}: allowed: an integer >= 1")
    torch.set_num_threads(1)
    if args.swap:
        families = tuple(f for f in (args.families or "").split(",") if f)
        swap = swap_by_family(args.checkpoint, args.store, args.windows or 256, split=args.split, families=families,
                              decision_frames=DECISION_FRAMES if args.decision_frames is None else args.decision_frames,
                              contrast=args.contrast or 0.0)
        print(" ".join(f"{k}={v:.3f}" for k, v in swap.items()))
        return swap
    swap_only = [flag for flag, v in (("--families", args.families), ("--decision-frames", args.decision_frames),
                                      ("--contrast", args.contrast)) if v is not None]
    if swap_only:   # the steering table reads every family's successes: refused, not ignored
        p.error(f"{', '.join(swap_only)}: apply to --swap only")
    report = steering_by_family(args.checkpoint, args.store, args.windows or 512, split=args.split)
    print(format_steering(report))
    return report


if __name__ == "__main__":
    main()
