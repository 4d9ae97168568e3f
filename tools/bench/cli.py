"""`quadforge bench <name> [--quick] [--json PATH]`: each benchmark is a module in tools/bench/."""
from __future__ import annotations

import argparse
import importlib

from quadforge.cli_flags import add_json

BENCHMARKS = {
    "sim": "quadforge.tools.bench.sim",
    "experts": "quadforge.tools.bench.experts",
    "store": "quadforge.tools.bench.store",
    "store_images": "quadforge.tools.bench.store_images",
    "out_of_core": "quadforge.tools.bench.out_of_core",
    "models": "quadforge.tools.bench.models",
    "germ": "quadforge.tools.bench.germ",
    "env_step": "quadforge.tools.bench.env_step",
    "scale": "quadforge.tools.bench.scale",
    "quard": "quadforge.tools.bench.quard",
    "quard_gpu": "quadforge.tools.bench.quard_gpu",
    "vla": "quadforge.tools.bench.vla",
    "vla_closed_loop": "quadforge.tools.bench.vla_closed_loop",
    "warp_profile": "quadforge.tools.bench.warp_profile",
}

# dest -> argparse keywords of the flags only some benchmarks take (default None: the benchmark's own)
BENCHMARK_FLAGS: dict[str, dict] = {
    "policy": dict(action="append", metavar="PATH",
                   help="vla_closed_loop: a policy checkpoint to evaluate (repeatable)"),
    "episodes": dict(type=int, help="vla_closed_loop: episodes per family and evaluation (default 100; --quick 2)"),
    "num_envs": dict(type=int, metavar="N", help="vla_closed_loop: envs stepped as one batch (default 16; --quick 2); "
                                                 "scale: mujoco_warp at this many worlds alone; warp_profile: worlds (default 4096)"),
    "task": dict(help="vla_closed_loop: quard:all (default) or quard:<family>"),
    "workers": dict(type=int, help="vla_closed_loop: evaluations run in this many processes (one per core; default 1)"),
    "seed": dict(type=int, help="vla_closed_loop: root seed of every evaluation's scenes (default 0): another seed, "
                                "other scenes"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(BENCHMARKS),
                        help="sim: env vs raw MuJoCo throughput; env_step: where an env step's time goes; "
                             "experts: gait controller falls and tracking; store: compaction and sampling (with its "
                             "image section); store_images: the image section alone; "
                             "out_of_core: training on stores larger than RAM, both sampler paths, peak RSS; "
                             "models: step latency and training throughput; germ: GeRM trainer; "
                             "scale: env steps/s vs worlds per backend (mujoco_cpu, mujoco_warp) + compile time; "
                             "quard: QUARD expert success (flat and terrain), speeds, gaits, camera frames/s and collect-path "
                             "episodes/min with and without images; "
                             "quard_gpu: QUARD on mujoco_warp with the batch renderer (env steps/s, frames/s) and VLA "
                             "training samples/s on the GPU (Warp's CPU device without one); "
                             "vla: vision-language-action acting latency, training throughput and image-window sampling (uniform vs stream); "
                             "vla_closed_loop: QUARD success per family of --policy checkpoints beside the "
                             "privileged expert (seen / held-out colours, swapped instructions); "
                             "warp_profile: GPU time per MuJoCo Warp function of one physics step of the Go1 rough "
                             "scene, with collision variants (CUDA only)")
    parser.add_argument("--quick", action="store_true", help="a smaller sweep (about a minute)")
    add_json(parser, "the results")
    # the flags some benchmarks take (each module lists the ones it takes in OPTIONS; the others refuse them)
    for dest, kw in BENCHMARK_FLAGS.items():
        parser.add_argument("--" + dest.replace("_", "-"), default=None, **kw)


def run(args: argparse.Namespace) -> int:
    from quadforge.progress import progress_bar
    from quadforge.tools.bench import common
    module = importlib.import_module(BENCHMARKS[args.name])
    options = {k: getattr(args, k) for k in BENCHMARK_FLAGS if getattr(args, k) is not None}
    refused = sorted(set(options) - set(getattr(module, "OPTIONS", ())))
    if refused:
        flags = ", ".join("--" + k.replace("_", "-") for k in refused)
        raise ValueError(f"bench {args.name} takes no {flags} (see `quadforge bench --help` for which takes what)")
    # a bar of measured rows and elapsed time (a benchmark does not know its row count in advance, so
    # there is no ETA); ticks land between measurements, never inside one
    common.PROGRESS = progress_bar(None, desc=f"bench {args.name}", unit="row")
    try:
        return int(module.main(quick=args.quick, json_path=args.json, **options) or 0)
    finally:
        common.PROGRESS.close()
        common.PROGRESS = None
