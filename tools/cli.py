"""The `quadforge` console script.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
modules are imported only when their subcommand runs, so ``quadforge --help`` stays instant and a
broken optional part never blocks the others.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from quadforge.cli_flags import check_counts, json_alone_on_stdout
from quadforge.tools.bench.cli import BENCHMARKS

# what a Unix tool killed by SIGPIPE exits with (128 + 13), e.g. `quadforge dataset info | head -1`
EXIT_BROKEN_PIPE = 141

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("quadforge.tools.demo", "end-to-end demo: collect with the gait expert, train FCNet, evaluate both"),
    "rollout": ("quadforge.tools.rollout_cmd", "run a policy in the env for a few seconds and print a summary"),
    "collect": ("quadforge.collection.collect_cmd", "collect labelled episodes into a zarr trajectory store"),
    "dataset": ("quadforge.data.cli", "inspect, validate, export or import a trajectory store"),
    "train": ("quadforge.training.cli", "train an imitation model or GeRM on a trajectory store"),
    "train-sweep": ("quadforge.training.sweep", "equal-budget lr x optimizer sweep of every imitation model"),
    "dagger": ("quadforge.training.dagger", "imitation with the gait expert relabelling the learner's states (DAgger)"),
    "train-expert": ("quadforge.training.ppo", "train a PPO expert with rsl_rl on the locomotion task"),
    "eval": ("quadforge.evaluation.evaluate_cmd", "closed-loop evaluation of a policy across terrain types and levels"),
    "eval-expert": ("quadforge.evaluation.evaluate_expert", "evaluate an expert per terrain type x level"),
    "compare": ("quadforge.evaluation.compare", "finished evaluations of several policies side by side, per cell, with each difference's significance"),
    "eval-tracking": ("quadforge.evaluation.tracking_eval", "velocity tracking and fall rate of an expert per terrain type"),
    "reproduce": ("quadforge.tools.reproduce", "the reproduction report docs/results.md (imitation sizes, GeRM ablations, latency; --stages quard: QUARD-Auto and Table III)"),
    "bench": ("quadforge.tools.bench.cli", "benchmarks: " + " | ".join(BENCHMARKS)),
    "info": ("quadforge.tools.info_cmd", "what this machine can run: versions, devices, optional parts, registries"),
}


def build_parser(with_subcommand: str | None = None) -> argparse.ArgumentParser:
    from quadforge import __version__
    parser = argparse.ArgumentParser(prog="quadforge", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"quadforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == with_subcommand:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        from quadforge import __version__
        print(f"quadforge {__version__}")
        return 0
    name = next((a for a in argv if not a.startswith("-")), None)
    if name not in COMMANDS:
        if not argv or argv[0] in ("-h", "--help"):
            build_parser().print_help()
            return 0
        what = f"unknown command {name!r}" if name else f"unknown option {argv[0]!r}"
        print(f"quadforge: error: {what} (commands: {', '.join(COMMANDS)}; see quadforge --help)",
              file=sys.stderr)
        return 2
    from quadforge.errors import JobFailed, write_failure_reason
    from quadforge.tools.parent_watch import watch_parent
    watch_parent()   # a step of `quadforge reproduce`: end with the runner, even one killed by SIGKILL
    args, unknown = build_parser(with_subcommand=name).parse_known_args(argv)
    if unknown and isinstance(getattr(args, "overrides", None), list) and \
            all("=" in u and not u.startswith("-") for u in unknown):
        # KEY=VALUE overrides after a later flag (`train --model m lr=1e-3 --store S val_every=5`): argparse
        # takes one run of a positional; the rest are the same list, in command-line order
        args.overrides, unknown = [*args.overrides, *unknown], []
    if unknown:   # argparse would blame the top-level parser; the flag belongs to the subcommand's
        print(f"quadforge {name}: error: unrecognized arguments: {' '.join(unknown)} (see quadforge {name} --help)",
              file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        check_counts(args)
        json_out = getattr(args, "json", None)
        if isinstance(json_out, str) and json_out != "-":   # --json PATH: checked before the work, not after
            from quadforge.output_paths import check_output_file, is_json_file
            check_output_file(json_out, flag="--json", owns=is_json_file)   # replaces only an earlier JSON
        with json_alone_on_stdout(json_out):
            code = int(module.run(args) or 0)
        sys.stdout.flush()   # inside the try: a reader that left early fails the flush here, not at exit
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt as err:
        kept = str(err)   # an ``Interrupted`` says what was kept and how to go on
        print(f"interrupted: {kept}" if kept else "interrupted", file=sys.stderr)
        return 130
    except JobFailed as err:
        # a job stopped for an outside reason (disk full, a worker died): its message says what is safe and how
        # to go on
        print(f"quadforge {name}: {err}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, NotImplementedError, ImportError) as err:
        # Bad input (or a missing optional package) is a one-line error naming what is wrong, not a traceback.
        print(f"quadforge {name}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        reason = write_failure_reason(err)
        if reason is None:
            raise
        # the disk filled, or the target is read-only, where no job said more: one line, not a traceback
        where = f" {err.filename}" if err.filename else ""
        print(f"quadforge {name}: error: cannot write{where}: {reason}", file=sys.stderr)
        return 1


def _stdout_closed() -> int:
    """The reader of stdout went away (`| head -1`): stop quietly, as Unix tools do. stdout is pointed at
    /dev/null so the interpreter's own flush at exit does not print a second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):   # stdout without a file descriptor (captured): nothing left to silence
        pass
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
