"""`quadforge train`: imitation models here; GeRM (any model name starting with "germ") in
``training.qlearning`` on proprioceptive stores; the vision-language models (``rt1``, and ``germ``,
``germ-dense``, ``germ-il`` on a store holding camera frames, or with ``--inputs vision``) in
``training.vla``.

    quadforge train --model fcnet --store STORE --out DIR [--max-steps N] [--seed S] [--device cpu|cuda]
                    [--preset NAME] [--layout NAME] [--resume] [--ram-budget SIZE] [key=value ...]

``key=value`` overrides address the trainer config by (dotted) field name, e.g. ``batch_size=256``,
``optim.lr=1e-3``, ``model.num_layers=2``; values are parsed as Python literals when they parse
(numbers, booleans, tuples), else kept as strings. Run it under ``torchrun --nproc_per_node K`` for DDP.
"""
from __future__ import annotations


import argparse
import os
import importlib

from quadforge.cli_flags import add_out, add_resume, add_seed, add_store
from quadforge.training.models import MODELS

IMITATION_MODELS = tuple(MODELS)   # the model zoo of training.models is the one list
VISION_ONLY_MODELS = ("rt1",)
IMAGE_FEATURE = "images/front_rgb"
INPUTS = ("auto", "proprio", "vision")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help=f"one of {', '.join(IMITATION_MODELS + VISION_ONLY_MODELS)}, or a GeRM model (name "
                             "starting with 'germ'; over camera frames when the store holds them)")
    add_store(parser, "trained on", old="--data")
    add_out(parser, "checkpoints, TensorBoard logs, config")
    parser.add_argument("--max-steps", type=int, default=None, help="optimizer steps (default: the preset's)")
    add_seed(parser)
    parser.add_argument("--device", default="cpu", help="cpu | cuda (cuda:K under torchrun picks LOCAL_RANK)")
    parser.add_argument("--preset", default=None,
                        help="hyperparameter preset: 'paper' (the seeds' settings) or 'cpu' (small widths, 300 steps). "
                             "Default: 'cpu' on a CPU device - the FCNet paper preset is 785k parameters at about "
                             "9 s per step on a 2-core CPU, about 14 h - and 'paper' on a GPU")
    parser.add_argument("--layout", default=None, help="observation layout from quadforge.layout (default: proprio)")
    add_resume(parser, "its last checkpoint (OUT/last.pt)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the run in OUT (without it, an OUT holding a run is refused)")
    parser.add_argument("--success-only", action="store_true", help="train only on episodes labelled successful")
    parser.add_argument("--batch-size", type=int, default=None, help="windows per optimizer step (per rank)")
    parser.add_argument("--log-every", type=int, default=None, help="print/log every N steps")
    parser.add_argument("--val-every", type=int, default=None, help="validate (and checkpoint) every N steps")
    parser.add_argument("--inputs", choices=INPUTS, default="auto",
                        help="GeRM inputs: proprio (layout vector) or vision (camera frames + instruction); "
                             "auto: vision when the store holds images/front_rgb")
    parser.add_argument("--ram-budget", default=None, metavar="SIZE",
                        help="memory the RAM sampler path may hold, e.g. 8G or 512M (default auto: half of this "
                             "machine's memory, shared by the ranks on a node); a store whose tables exceed it is "
                             "read out of core from memory-mapped shards; the log says which path (docs/data.md)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


def default_preset(device: str) -> str:
    """'paper' needs a GPU to finish in hours; on a CPU the default is the small 'cpu' preset."""
    return "cpu" if str(device).split(":")[0] == "cpu" else "paper"


def run(args: argparse.Namespace) -> int:
    model = str(args.model)
    if getattr(args, "ram_budget", None) is not None:   # every trainer's config has the field: one override
        from quadforge.data.ram_budget import parse_ram_budget
        parse_ram_budget(args.ram_budget)                # a bad size is an error before any work
        args.overrides = [*(args.overrides or []), f"ram_budget={args.ram_budget}"]
    # before any work: never replace a finished run unasked, never crash at the end; under torchrun
    # rank 0 checks (the others would see the files rank 0 has just started writing)
    if args.out and int(os.environ.get("RANK", "0")) == 0:
        from quadforge.output_paths import check_run_dir
        check_run_dir(args.out, resume=bool(args.resume), overwrite=bool(getattr(args, "overwrite", False)))
    if model in IMITATION_MODELS and args.preset is None:
        args.preset = default_preset(args.device)
        print(f"train {model}: preset {args.preset!r} (the default on {args.device}; pass --preset to choose)")
    if model in VISION_ONLY_MODELS or (model.startswith("germ") and _vision_inputs(args)):
        return int(importlib.import_module("quadforge.training.vla").run_from_args(args) or 0)
    if model.startswith("germ"):
        return int(importlib.import_module("quadforge.training.qlearning").run_from_args(args) or 0)
    if model not in IMITATION_MODELS:
        raise ValueError(f"--model {model!r} unknown; allowed: {IMITATION_MODELS + VISION_ONLY_MODELS} "
                         "or a name starting with 'germ'")
    return int(importlib.import_module("quadforge.training.imitation").run_from_args(args) or 0)


def _vision_inputs(args: argparse.Namespace) -> bool:
    """--inputs vision, or auto and the --store holds camera frames."""
    inputs = getattr(args, "inputs", "auto") or "auto"
    if inputs != "auto":
        return inputs == "vision"
    data = getattr(args, "store", None)
    if not data:
        return False
    from pathlib import Path
    if not Path(data).exists():
        return False   # the trainer reports the missing store
    from quadforge.data.store import TrajectoryStore   # lazy: --help stays fast
    return IMAGE_FEATURE in TrajectoryStore.open(str(data)).feature_names
