"""`quadforge train`: any model of the registry (``models.registry``), handed to the trainer its spec
names (``TRAINER_MODULES``): the imitation zoo to ``training.imitation``, GeRM over proprioceptive
transitions to ``training.qlearning``, the vision-language models (``rt1``; GeRM on a store holding
camera frames, or with ``--inputs vision``) to ``training.vla``.

    quadforge train --model fcnet --store STORE --out DIR [--max-steps N] [--seed S] [--device cpu|cuda] [--num-threads N]
                    [--preset NAME] [--layout NAME] [--resume] [--ram-budget SIZE] [key=value ...]

``key=value`` overrides address the trainer config by (dotted) field name, e.g. ``batch_size=256``,
``optim.lr=1e-3``, ``model.num_layers=2``; values are parsed as Python literals when they parse
(numbers, booleans, tuples), else kept as strings. Run it under ``torchrun --nproc_per_node K`` for DDP.
"""
from __future__ import annotations


import argparse
import os
import importlib

from quadforge.cli_flags import add_num_threads, add_out, add_resume, add_seed, add_store
from quadforge.errors import Interrupted
from quadforge.training.loop import AMP_MODES
from quadforge.models.registry import INPUTS, ModelSpec, model_inputs, model_names, model_spec

# trainer (a ``ModelSpec.trainer``) -> the module whose ``run_from_args`` trains it, imported on use
TRAINER_MODULES = {"imitation": "quadforge.training.imitation", "qlearning": "quadforge.training.qlearning",
                   "vla": "quadforge.training.vla"}
IMAGE_FEATURE = "images/front_rgb"
INPUT_CHOICES = ("auto",) + INPUTS


def _model_help() -> str:
    parts = []
    for name in model_names():
        kinds = model_inputs(name)
        parts.append(name if len(kinds) == 1 and kinds[0] == "proprio" else f"{name} ({'/'.join(kinds)})")
    return "one of " + ", ".join(parts) + "; a model with both inputs reads camera frames when the store holds them"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help=_model_help())
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
    parser.add_argument("--amp", choices=AMP_MODES, default=None,
                        help="mixed precision: bf16 runs the forward passes under bf16 autocast (default off)")
    parser.add_argument("--inputs", choices=INPUT_CHOICES, default="auto",
                        help="for a model with both kinds of input (GeRM): proprio (layout vector) or vision "
                             "(camera frames + instruction); auto: vision when the store holds images/front_rgb")
    parser.add_argument("--ram-budget", default=None, metavar="SIZE",
                        help="memory the RAM sampler path may hold, e.g. 8G or 512M (default auto: half of this "
                             "machine's memory, shared by the ranks on a node); a store whose tables exceed it is "
                             "read out of core from memory-mapped shards; the log says which path (docs/data.md)")
    # why: torch takes every core by default, and two CPU trainings side by side then spin against each
    # other (measured on 2 cores, 2026-11-27: 5 samples/s each instead of ~100 and ~200 alone)
    add_num_threads(parser, None, "torch CPU threads of this run (two runs side by side on one machine: "
                    "give each its share, e.g. 1 on 2 cores)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


def default_preset(device: str) -> str:
    """'paper' needs a GPU to finish in hours; on a CPU the default is the small 'cpu' preset."""
    return "cpu" if str(device).split(":")[0] == "cpu" else "paper"


def run(args: argparse.Namespace) -> int:
    spec = resolve_model(args)
    if getattr(args, "layout", None) and spec.trainer != "imitation":   # refused, not dropped without a word
        raise ValueError(f"--layout {args.layout}: the observation layout of the imitation models; {spec.name} "
                         f"(the {spec.trainer} trainer) does not take it")
    set_cpu_threads(getattr(args, "num_threads", None))
    if getattr(args, "ram_budget", None) is not None:   # every trainer's config has the field: one override
        from quadforge.data.ram_budget import parse_ram_budget
        parse_ram_budget(args.ram_budget)                # a bad size is an error before any work
        args.overrides = [*(args.overrides or []), f"ram_budget={args.ram_budget}"]
    # before any work: never replace a finished run unasked, never crash at the end; under torchrun
    # rank 0 checks (the others would see the files rank 0 has just started writing)
    if args.out and int(os.environ.get("RANK", "0")) == 0:
        from quadforge.output_paths import check_run_dir
        check_run_dir(args.out, resume=bool(args.resume), overwrite=bool(getattr(args, "overwrite", False)))
    if spec.trainer == "imitation" and args.preset is None:
        from quadforge.training.distributed import resolve_device
        resolve_device(args.device)   # a bad --device is the error, before a preset is chosen for it
        args.preset = default_preset(args.device)
        print(f"train {spec.name}: preset {args.preset!r} (the default on {args.device}; pass --preset to choose)")
    try:
        return int(importlib.import_module(TRAINER_MODULES[spec.trainer]).run_from_args(args) or 0)
    except Interrupted as err:   # the loop says what it kept; the command says how to go on
        raise Interrupted(f"{err}: the same command with --resume continues from it" if err.resumable
                          else str(err)) from None


def set_cpu_threads(n: int | None) -> None:
    """``--num-threads N``: torch's CPU threads for this process (None keeps torch's default, all cores;
    N >= 1 is checked for every command by ``cli_flags.check_counts``)."""
    if n is None:
        return
    import torch   # lazy: --help stays fast
    torch.set_num_threads(int(n))


def resolve_model(args: argparse.Namespace) -> ModelSpec:
    """The registry's spec for ``--model`` over ``--inputs`` (auto: the model's only kind of input, or
    vision when the store holds camera frames)."""
    name, inputs = str(args.model), getattr(args, "inputs", "auto") or "auto"
    if name not in model_names():
        raise ValueError(f"--model {name!r} unknown; allowed: {', '.join(model_names())}")
    have = model_inputs(name)
    if inputs != "auto" and inputs not in have:
        raise ValueError(f"--model {name} --inputs {inputs}: {name} reads only {' or '.join(have)} inputs")
    if inputs == "auto":
        inputs = have[0] if len(have) == 1 else ("vision" if _store_has_images(args) else "proprio")
    return model_spec(name, inputs)


def _store_has_images(args: argparse.Namespace) -> bool:
    """Whether the --store holds camera frames (False when there is no store to look at)."""
    data = getattr(args, "store", None)
    if not data:
        return False
    from pathlib import Path
    if not Path(data).exists():
        return False   # the trainer reports the missing store
    from quadforge.data.store import TrajectoryStore   # lazy: --help stays fast
    return IMAGE_FEATURE in TrajectoryStore.open(str(data)).feature_names
