import subprocess
import sys

import pytest

from quadforge.tools.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_unknown_command_is_a_one_line_error(capsys):
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr()
    assert err.out == "" and len(err.err.strip().splitlines()) == 1 and "no-such-command" in err.err


def test_version_is_one_line(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("quadforge ")


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "quadforge.tools.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "quadforge" in r.stdout


def _actions(parser):
    """(subcommand path, action) of every flag and positional, sub-subcommands (dataset info, ...) included."""
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for path, a in _actions(sub):
                    yield (name, *path), a
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield (), action


def _subcommand_parsers():
    from quadforge.tools.cli import build_parser
    for name in COMMANDS:
        parser = build_parser(with_subcommand=name)
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        yield name, sub.choices[name]


def test_every_flag_has_help_and_follows_the_convention():
    """docs/cli.md: help text on every flag; one name per shared thing (old names only as hidden aliases)."""
    import argparse
    old_names = {"--data", "--threads", "--num_threads", "--output-dir", "--out-dir", "--json-out"}
    for name, parser in _subcommand_parsers():
        for path, action in _actions(parser):
            where = " ".join((name, *path, *action.option_strings)) or f"{name} {action.dest}"
            if action.help == argparse.SUPPRESS:
                continue  # a deprecated alias (hidden) or a flag this subcommand replaces
            assert action.help, f"quadforge {where}: no --help text"
            assert not set(action.option_strings) & old_names, f"quadforge {where}: use the docs/cli.md name"
        dests = {a.dest: a for _, a in _actions(parser) if a.help != argparse.SUPPRESS}
        if "store" in dests:
            assert "--store" in dests["store"].option_strings, f"quadforge {name}: the store is --store"
        if "num_threads" in dests:
            assert "--num-threads" in dests["num_threads"].option_strings


def test_deprecated_spellings_still_work(tmp_path, capsys):
    from quadforge.tools.cli import build_parser
    args = build_parser("rollout").parse_args(["rollout", "--threads", "2"])
    assert args.num_threads == 2 and "--threads is deprecated" in capsys.readouterr().err
    args = build_parser("collect").parse_args(["collect", "--out", "S", "--episodes", "1"])
    assert args.store == "S"
    args = build_parser("train").parse_args(["train", "--model", "mlp", "--data", "S"])
    assert args.store == "S"
    args = build_parser("eval").parse_args(["eval", "--out", "D", "--episodes", "3"])
    assert args.episodes == 3
    assert main(["dataset", "info", str(tmp_path / "missing")]) == 2   # the old positional store
    assert "positional arguments of dataset info are deprecated; use --store" in capsys.readouterr().err


def test_a_count_below_one_is_the_same_one_line_error_for_every_command(tmp_path, capsys):
    import pytest
    argvs = [
        ["collect", "--store", str(tmp_path / "s"), "--episodes", "2", "--num-threads", "0"],
        ["collect", "--store", str(tmp_path / "s"), "--episodes", "2", "--num-envs", "0"],
        ["eval", "--task", "quard:go_to", "--policy", "quard_expert", "--out", str(tmp_path / "e"),
         "--num-threads", "0"],
        ["rollout", "--num-threads", "0"],
        ["train", "--model", "mlp", "--store", str(tmp_path / "s"), "--out", str(tmp_path / "t"),
         "--num-threads", "-1"],
    ]
    for argv in argvs:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        flag, value = argv[-2], argv[-1]
        assert err == f"quadforge {argv[0]}: error: {flag} {value}: must be at least 1", err
    assert not any(tmp_path.iterdir())   # refused before any work: nothing written
    with pytest.raises(SystemExit):   # not a number at all: argparse's own error
        main(["rollout", "--num-threads", "two"])


def test_an_unknown_flag_is_the_subcommands_error(capsys):
    assert main(["rollout", "--bogus", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("quadforge rollout: error: unrecognized arguments: --bogus 1 "
                                               "(see quadforge rollout --help)")


def test_overrides_after_a_later_flag_are_one_list_in_order(monkeypatch):
    import quadforge.training.cli as train_cli
    seen = []
    monkeypatch.setattr(train_cli, "run", lambda args: seen.append(args.overrides) or 0)
    assert main(["train", "--model", "fcnet", "batch_size=8", "--store", "S", "--out", "O", "val_every=1",
                 "lr=1e-3"]) == 0
    assert seen == [["batch_size=8", "val_every=1", "lr=1e-3"]]


def test_tracking_eval_is_a_subcommand(capsys):
    assert main(["eval-tracking", "--policy", "nope.pt"]) == 2
    assert "nope.pt" in capsys.readouterr().err


@pytest.mark.parametrize("argv,said", [(["nosuch=1"], "override nosuch: eval-tracking takes env settings only"),
                                        (["--envs-per-type", "0"], "--envs-per-type 0: "),
                                        (["--episode-s", "0"], "--episode-s 0.0: ")])
def test_tracking_eval_refuses_what_it_would_ignore_or_misname(argv, said, capsys):
    assert main(["eval-tracking", "--policy", "gait", *argv]) == 2
    assert said in capsys.readouterr().err


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`quadforge dataset info --store S | head -1`: stdout closed before the command writes is a quiet exit
    141 (as a Unix tool killed by SIGPIPE), for any subcommand: tools/cli.py handles it once."""
    import os

    import numpy as np

    from quadforge.data.compaction import compact
    from quadforge.data.synthetic import synthetic_episode, synthetic_info
    from quadforge.data.writer import StagingWriter
    store = tmp_path / "s"
    with StagingWriter(store, "c0") as w:
        w.write_episode(synthetic_episode(np.random.default_rng(0), 20, True), synthetic_info(0, True))
    compact(store)
    for argv in (["dataset", "info", "--store", str(store)], ["dataset", "validate", "--store", str(store)]):
        read_end, write_end = os.pipe()
        os.close(read_end)   # the reader is gone before the first write
        try:
            r = subprocess.run([sys.executable, "-m", "quadforge.tools.cli", *argv], stdout=write_end,
                               stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write_end)
        assert r.returncode == 141, (argv, r.stderr)
        assert r.stderr == "", (argv, r.stderr)


def test_info_reports_versions_devices_and_every_registry(tmp_path, capsys):
    """`quadforge info`: the installed versions, torch's devices, and the backends, robots, tasks and models
    exactly as their registries hold them, with whether the GPU backend is installed here."""
    import json

    import mujoco
    import torch

    from quadforge.envs.backends import BACKENDS, PLANNED
    from quadforge.envs.backends.mujoco_warp import available
    from quadforge.envs.builder import get_task, task_names
    from quadforge.envs.robots import ROBOTS
    from quadforge.models.registry import model_names
    out = tmp_path / "info.json"
    assert main(["info", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["required"]["torch"] == torch.__version__ and r["required"]["mujoco"] == mujoco.__version__
    assert all(r["required"].values())                          # every required package is installed here
    assert r["torch"]["cuda"] == torch.cuda.is_available() and len(r["torch"]["gpus"]) == torch.cuda.device_count()
    assert list(r["backends"]) == list(BACKENDS) and r["planned_backends"] == PLANNED
    assert r["backends"]["mujoco_warp"]["installed"] == available() and r["backends"]["mujoco_cpu"]["installed"]
    get_task("quard:all")                                       # the prefixed tasks register on import
    assert r["robots"] == list(ROBOTS) and r["tasks"] == list(task_names())
    assert list(r["models"]) == list(model_names())
    for name in (*BACKENDS, *ROBOTS, *model_names()):
        assert name in printed
    assert main(["info", "--json", "-"]) == 0                   # stdout: the JSON alone, the report on stderr
    both = capsys.readouterr()
    assert json.loads(both.out)["quadforge"] == r["quadforge"] and "robots: " in both.err
    assert main(["info", "--json"]) == 0                        # no PATH: stdout, as `dataset info --json`
    assert json.loads(capsys.readouterr().out)["robots"] == r["robots"]
    nested = tmp_path / "not" / "yet" / "info.json"             # parent folders made, as every --json makes them
    assert main(["info", "--json", str(nested)]) == 0 and json.loads(nested.read_text())["robots"] == r["robots"]


def test_json_on_stdout_is_the_json_alone_for_a_command_with_a_text_report(capsys):
    """`rollout --json -` printed its summary and then the JSON on stdout, which no JSON reader parses."""
    import json
    assert main(["rollout", "--num-envs", "2", "--seconds", "0.2", "--json", "-"]) == 0
    both = capsys.readouterr()
    assert json.loads(both.out)["num_envs"] == 2 and "env steps/s" in both.err
    # a flag of the locomotion task on a QUARD task is refused, not ignored
    assert main(["rollout", "--task", "quard:go_to", "--command", "1,0,0"]) == 2
    assert "--command 1,0,0: the locomotion task's joystick" in capsys.readouterr().err


def test_the_recorded_commit_is_the_codes_not_the_callers_directorys(tmp_path, monkeypatch):
    """`quadforge info` and a run's provenance name the commit of the checkout the code runs from, run
    from any directory (another repository's included)."""
    from quadforge.tools.run_info import git_state
    here = git_state()
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.chdir(tmp_path)
    assert git_state() == here


def test_info_lists_policy_kinds_terrain_types_reward_terms_and_layouts(tmp_path, capsys, monkeypatch):
    """`quadforge info` listed backends, robots, tasks and models only; a policy kind registered before it runs
    is listed too (the lists are read when asked)."""
    import json

    from quadforge.envs.rewards import REWARD_TERMS
    from quadforge.envs.terrain import TERRAIN_TYPES
    from quadforge.experts import registry
    from quadforge.layout import LAYOUTS
    monkeypatch.setattr(registry, "POLICY_KINDS", dict(registry.POLICY_KINDS))
    registry.register_policy_kind("mine", lambda arg, ctx: None, "a test's kind", needs_path=False)
    out = tmp_path / "info.json"
    assert main(["info", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert list(r["policy_kinds"]) == list(registry.POLICY_KINDS)
    assert {"gait", "vla", "quard_expert", "mine"} <= set(r["policy_kinds"])
    assert r["policy_kinds"]["mine"] == {"help": "a test's kind", "takes_path": False}
    assert r["policy_kinds"]["model"]["takes_path"] is True
    assert r["terrain_types"] == list(TERRAIN_TYPES) and r["reward_terms"] == list(REWARD_TERMS)
    assert r["layouts"] == {name: layout.dim for name, layout in LAYOUTS.items()} and r["layouts"]["legged_gym_48"] == 48
    assert "policy kinds: gait, zero, model:PATH" in printed and ", mine" in printed
    for line, names in (("terrain types: ", TERRAIN_TYPES), ("reward terms: ", REWARD_TERMS)):
        assert line + ", ".join(names) in printed
    assert "layouts: legged_gym_48 (48)" in printed
