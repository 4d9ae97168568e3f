"""`quadforge bench <name> [--quick] [--json PATH]`: each benchmark is a module in tools/bench/."""
from __future__ import annotations

import argparse
import importlib

from quadforge.cli_flags import add_json

BENCHMARKS = {
    "sim": "quadforge.tools.bench.sim",
    "experts": "quadforge.tools.bench.experts",
    "store": "quadforge.tools.bench.store",
    "models": "quadforge.tools.bench.models",
    "germ": "quadforge.tools.bench.germ",
    "env_step": "quadforge.tools.bench.env_step",
    "quard": "quadforge.tools.bench.quard",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(BENCHMARKS),
                        help="sim: env vs raw MuJoCo throughput; env_step: where an env step's time goes; "
                             "experts: gait controller falls and tracking; store: compaction and sampling; "
                             "models: step latency and training throughput; germ: GeRM trainer; "
                             "quard: QUARD expert success, speeds, gaits and camera frames/s")
    parser.add_argument("--quick", action="store_true", help="a smaller sweep (about a minute)")
    add_json(parser, "the results")


def run(args: argparse.Namespace) -> int:
    if args.json:   # before the benchmark runs, not after
        from quadforge.output_paths import check_output_file
        check_output_file(args.json, flag="--json")
    return int(importlib.import_module(BENCHMARKS[args.name]).main(quick=args.quick, json_path=args.json) or 0)
