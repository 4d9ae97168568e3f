"""`quadforge reproduce --stages quard`: the plan, the z-test, the report from stored results alone."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from quadforge.tools.cli import main as cli_main
from quadforge.envs.quard.families import family_names
from quadforge.tools.quard_report import BEGIN, END, TABLE3_ROWS, load_run, table3_section
from quadforge.tools.reproduce_quard import (EVAL_STAGES, SCALES, TRAIN_STAGES, QuardConfig, Step, build_plan,
                                             eval_results, is_complete, max_steps, missing_capabilities,
                                             steps_to_run,
                                             clear_dead_attempt, plan_markdown, resume_argv, run_quard, run_step,
                                             step_record_path)
from quadforge.tools.results_report import two_proportion_z, write_report

DOCS = Path(__file__).resolve().parents[1] / "docs" / "quard_auto.md"


def test_two_proportion_z_matches_a_hand_computation():
    # 45/60 vs 30/60: pooled p = 75/120 = 0.625; se = sqrt(0.625 * 0.375 * (1/60 + 1/60)) = sqrt(1/128);
    # z = (0.75 - 0.5) * sqrt(128) = 2 sqrt(2); two-sided p = erfc(z / sqrt 2) = erfc(2) = 0.0046777...
    z, p = two_proportion_z(45, 60, 30, 60)
    assert z == pytest.approx(2 * math.sqrt(2), rel=1e-12)
    assert p == pytest.approx(0.004677734981047266, rel=1e-9)
    # unequal sizes: 18/20 vs 40/80: p = 58/100; se = sqrt(.58 * .42 * (1/20 + 1/80)) = sqrt(.0152250)
    z, _ = two_proportion_z(18, 20, 40, 80)
    assert z == pytest.approx(0.4 / math.sqrt(0.58 * 0.42 * 0.0625), rel=1e-12)
    assert two_proportion_z(30, 60, 45, 60)[0] == pytest.approx(-2 * math.sqrt(2))
    assert two_proportion_z(0, 10, 0, 10) == (0.0, 1.0)        # no spread: no evidence
    assert two_proportion_z(3, 0, 1, 10) == (0.0, 1.0)         # an empty side: no evidence


def test_plan_of_every_scale_is_what_the_docs_say():
    text = DOCS.read_text()
    for scale in SCALES:
        assert plan_markdown(scale) in text, f"docs/quard_auto.md does not show the {scale} plan; regenerate it " \
                                             "with plan_markdown"


def test_plan_trains_table3_rows_on_one_store_and_budget_and_chains_the_collectors():
    cfg = QuardConfig(scale="cpu", rounds=2, seeds=(0, 1, 2))
    steps = build_plan(cfg)
    assert [s.id for s in steps[:4]] == ["demos", "pretrain", "r0-demos", "r0-auto"]
    assert "--success-only" in steps[1].argv and steps[1].argv[2] == "germ-dense"   # seed 003's pre-trained VLA
    train0 = [s for s in steps if s.stage == "train" and s.meta["round"] == 0]
    assert {(s.meta["model"], s.meta["failures"]) for s in train0} == set(TABLE3_ROWS)
    assert len(train0) == len(TABLE3_ROWS) * 3
    for s in train0:   # the same data and budget, failures only in the (Y) rows
        a = s.argv
        assert a[a.index("--store") + 1] == f"{cfg.out}/data/round0"
        assert a[a.index("--max-steps") + 1] == "300" and a[a.index("--batch-size") + 1] == "16"
        assert ("--success-only" in a) == (not s.meta["failures"])
    evals = [s for s in steps if s.stage == "eval"]
    assert len(evals) == len([s for s in steps if s.stage == "train"])      # one eval per trained model
    for e in evals:   # every family in one process, no more envs than the episodes kept per cell
        a = e.argv
        assert a[a.index("--task") + 1] == "quard:all" and a[a.index("--policy") + 1].endswith("/last.pt")
        assert int(a[a.index("--num-envs") + 1]) <= int(a[a.index("--episodes-per-cell") + 1])
    auto1 = next(s for s in steps if s.id == "r1-auto")
    assert auto1.argv[auto1.argv.index("--policy") + 1] == f"{cfg.out}/train/germ_Y_r0_s0/last.pt"
    auto0 = next(s for s in steps if s.id == "r0-auto")
    assert auto0.argv[auto0.argv.index("--policy") + 1].endswith("pretrain_germ-dense/last.pt")
    assert [(s.meta["model"], s.meta["failures"]) for s in steps if s.stage == "train" and s.meta["round"] == 1] \
        == [("germ", True)] * 3
    assert build_plan(cfg)[-1].command == steps[-1].command   # pure


def test_config_errors():
    with pytest.raises(ValueError, match="--scale"):
        QuardConfig(scale="huge").validate()
    with pytest.raises(ValueError, match="--rounds"):
        QuardConfig(rounds=0).validate()
    assert cli_main(["reproduce", "--stages", "quard,germ"]) == 2
    assert cli_main(["reproduce", "--stages", "germ", "--scale", "tiny"]) == 2


def test_out_must_be_a_new_folder_or_this_loops_own(tmp_path, capsys):
    """A file, or a folder of someone else's, is refused before anything is written into it; a folder
    holding the loop's own run.json is a rerun, which resumes."""
    afile, theirs = tmp_path / "afile.txt", tmp_path / "theirs"
    afile.write_text("keep me")
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    for out, said in ((afile, "is a file"), (theirs, "not a QUARD reproduction run")):
        assert cli_main(["reproduce", "--stages", "quard", "--scale", "tiny", "--seeds", "0", "--out", str(out),
                         "--docs", str(tmp_path / "r.md")]) == 2
        err = capsys.readouterr().err
        assert f"--out {out}: " in err and said in err
    assert afile.read_text() == "keep me" and sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]
    (theirs / "notes.txt").unlink()
    (theirs / "run.json").write_text("{}")
    QuardConfig(out=str(theirs), docs=str(tmp_path / "r.md"), scale="tiny", seeds=(0,)).validate()


def test_missing_commands_fail_before_running_anything(tmp_path, capsys):
    cfg = QuardConfig(out=str(tmp_path / "run"), docs=str(tmp_path / "results.md"), scale="tiny", seeds=(0,))
    missing = missing_capabilities(build_plan(cfg))
    if not missing:
        pytest.skip("this build has every command the QUARD loop needs")
    code = cli_main(["reproduce", "--stages", "quard", "--scale", "tiny", "--seeds", "0", "--out", cfg.out,
                     "--docs", cfg.docs])
    err = capsys.readouterr().err
    first = next(s for s in build_plan(cfg) if set(s.needs) & set(missing))   # the first step that cannot run
    assert code == 2 and "this build lacks" in err and f"step {first.id} " in err
    assert any(name in err for name in missing)
    assert not (tmp_path / "run" / "logs").exists() and not (tmp_path / "run" / "steps").exists()


def test_eval_results_per_family_pool_the_colour_sets(tmp_path):
    cfg = QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,))
    ev = next(s for s in build_plan(cfg) if s.stage == "eval")
    fams = {"train": {f: {"episodes": 4, "success": 0.25 * i} for i, f in enumerate(family_names())},
            "held_out": {f: {"episodes": 2, "success": 0.5} for f in family_names()}}
    Path(ev.output).mkdir(parents=True)
    (Path(ev.output) / "eval.json").write_text(json.dumps({"overall": {"success": 0.5, "episodes": 30},
                                                           "families": fams}))
    per = eval_results(cfg, ev, {"wall_s": 3.0, "command": "quadforge train x"}, {"wall_s": 7.0})
    assert [(per[f]["successes"], per[f]["episodes"]) for f in family_names()] == [(1, 6), (2, 6), (3, 6), (4, 6), (5, 6)]
    assert per["stop"]["model"] == ev.meta["model"] and per["stop"]["colour_sets"] == ["held_out", "train"]
    assert per["stop"]["train_wall_s"] == 3.0 and per["stop"]["eval_wall_s"] == 7.0
    del fams["train"]["stop"], fams["held_out"]["stop"]
    (Path(ev.output) / "eval.json").write_text(json.dumps({"families": fams}))
    with pytest.raises(ValueError, match="no results for family 'stop'"):
        eval_results(cfg, ev, None, {"wall_s": 1.0})


def test_finished_steps_are_recognised(tmp_path):
    cfg = QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,))
    train = next(s for s in build_plan(cfg) if s.stage == "train")
    assert not is_complete(cfg, train) and resume_argv(train) == train.argv
    Path(train.output).mkdir(parents=True)
    assert resume_argv(train) == train.argv + ["--overwrite"]   # died before its first checkpoint
    (Path(train.output) / "tb").mkdir()        # ... leaving TensorBoard files only: the folder is cleared
    assert clear_dead_attempt(train) and not Path(train.output).exists()
    Path(train.output).mkdir(parents=True)
    (Path(train.output) / "last.pt").write_bytes(b"")
    assert not clear_dead_attempt(train) and (Path(train.output) / "last.pt").exists()
    assert resume_argv(train) == train.argv + ["--resume"]
    assert not is_complete(cfg, train)      # a checkpoint without the step's record: interrupted, resume it
    step_record_path(cfg.out, train).parent.mkdir(parents=True)
    step_record_path(cfg.out, train).write_text("{}")
    assert is_complete(cfg, train)
    demos = build_plan(cfg)[0]
    assert not is_complete(cfg, demos)      # no store yet


def _image_store(root: Path, episodes: int = 3) -> Path:
    """A small store with camera frames, as a demonstration store looks (synthetic episodes)."""
    import numpy as np

    from quadforge.data.compaction import compact
    from quadforge.data.synthetic import synthetic_image_episode, synthetic_info, synthetic_task_params
    from quadforge.data.writer import StagingWriter
    rng = np.random.default_rng(0)
    w = StagingWriter(root, "expert")
    for e in range(episodes):
        f = synthetic_image_episode(rng, 12, True, stride=3, size=4, instruction_index=0)
        params = synthetic_task_params(e, families=family_names())
        w.write_episode(f, {**synthetic_info(e, True), "task_params": params, "frame_stride": 3,
                            "instruction": "go left", "instructions": {"0": "go left"}})
    compact(root)
    return root


def test_plan_starts_from_an_existing_demo_store_and_pretrained_vla(tmp_path):
    demos = _image_store(tmp_path / "demos", episodes=3)
    cfg = QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,), rounds=2, demos=str(demos),
                      pretrained=str(tmp_path / "vla.pt"))
    steps = build_plan(cfg)
    assert [s.id for s in steps[:2]] == ["r0-demos", "r0-auto"]     # neither collected nor pre-trained here
    copy, auto = steps[0], steps[1]
    assert copy.program == "copy" and copy.argv == [str(demos), f"{cfg.out}/data/round0"] and not copy.needs
    assert copy.command == f"cp -r {demos} {cfg.out}/data/round0"
    a = auto.argv
    assert a[a.index("--policy") + 1] == cfg.pretrained
    assert a[a.index("--episodes") + 1] == str(3 + cfg.sizes.auto_episodes)    # a total: the 3 copied + the round's
    assert all(s.argv[s.argv.index("--store") + 1] == f"{cfg.out}/data/round0"
               for s in steps if s.stage == "train" and s.meta["round"] == 0)
    # without the flags the demonstrations are collected once and copied into every round's store
    plain = build_plan(QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,), rounds=2))
    assert [s.id for s in plain[:3]] == ["demos", "pretrain", "r0-demos"]
    assert plain[2].argv == [f"{cfg.out}/data/demos", f"{cfg.out}/data/round0"]
    # the copy step: a store with the demonstrations, complete once copied, kept when it holds episodes
    assert not is_complete(cfg, copy)
    rec = run_step(cfg, copy, log=lambda s: None)
    assert is_complete(cfg, copy) and rec["collection"]["episodes"] == 3
    from quadforge.data.store import TrajectoryStore
    assert len(TrajectoryStore.open(copy.output).episode_ids) == 3 and not Path(copy.output + ".copying").exists()


def test_demos_and_pretrained_flags_are_checked(tmp_path, capsys):
    with pytest.raises(ValueError, match="--demos .*no trajectory store"):
        QuardConfig(demos=str(tmp_path / "nothing")).validate()
    with pytest.raises(FileNotFoundError, match="--pretrained .*no checkpoint"):
        QuardConfig(pretrained=str(tmp_path / "none.pt")).validate()
    ppo = Path(__file__).resolve().parents[1] / "experts" / "checkpoints" / "go1_flat_forward_ppo.pt"
    with pytest.raises(ValueError, match="--pretrained .*not a quadforge policy checkpoint"):
        QuardConfig(pretrained=str(ppo)).validate()
    assert cli_main(["reproduce", "--stages", "quard", "--demos", str(tmp_path / "nothing"), "--out",
                     str(tmp_path / "run")]) == 2
    assert "--demos" in capsys.readouterr().err
    assert cli_main(["reproduce", "--stages", "germ", "--pretrained", str(ppo)]) == 2


# --- the report from stored files ---------------------------------------------------------------------------
# success counts per (model, failures) for seeds 0, 1, 2 (the same in every family), 10 episodes each
COUNTS = {("rt1", False): (2, 3, 4), ("germ-il", False): (3, 3, 3), ("germ-dense", False): (4, 5, 6),
          ("germ-dense", True): (5, 5, 5), ("germ", False): (6, 6, 7), ("germ", True): (8, 9, 7)}


def _write_run(out: Path, seeds: tuple[int, ...] = (0, 1, 2), train_steps: int = 4) -> None:
    def put(path: Path, obj) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj))
    put(out / "run.json", {"config": {"out": str(out), "seeds": list(seeds), "rounds": 2},
                           "scale": {"name": "tiny", "note": "plumbing only", "demo_episodes": 8, "auto_episodes": 8,
                                     "train_steps": train_steps, "batch_size": 4, "preset": "cpu", "eval_episodes": 10},
                           "commands": ["quadforge reproduce --stages quard --scale tiny --rounds 2"],
                           "started_utc": "2026-11-24 01:00:00", "finished_utc": "2026-11-24 02:00:00",
                           "preset_parameters": {
                               "cpu": {"image_size": [64, 64], "instructions": 1008, "models": {
                                   "rt1": {"total": 1_000_000, "active": 1_000_000},
                                   "germ": {"total": 3_400_000, "active": 1_800_000}}},
                               "paper": {"image_size": [300, 300], "instructions": 1008, "models": {
                                   "germ": {"total": 49_840_000, "active": 24_620_000}}}}})
    put(out / "steps" / "r0-auto.json", {"id": "r0-auto", "stage": "auto", "command": "quadforge collect X",
                                         "meta": {"policy": "pre/last.pt"}, "started_utc": "2026-11-24 01:00:01",
                                         "wall_s": 60.0, "collection": {"collector": "auto0", "episodes": 8,
                                         "success_labels": True, "episodes_per_min": 8.0, "per_family": {
                                             "go_to": {"successes": 1, "failures": 3},
                                             "stop": {"successes": 2, "failures": 2}}}})
    put(out / "steps" / "train-germ_Y_r0_s0.json", {"id": "train-germ_Y_r0_s0", "stage": "train", "meta": {},
                                                    "command": "quadforge train --model germ", "wall_s": 30.0,
                                                    "started_utc": "2026-11-24 01:00:02"})
    for (model, failures), per_seed in COUNTS.items():
        for seed in seeds:
            k = per_seed[seed]
            for fam in family_names():
                put(out / "results" / f"{model}_{failures}_{seed}_{fam}.json",
                    {"model": model, "failures": failures, "round": 0, "seed": seed, "family": fam,
                     "run": "x", "successes": k, "episodes": 10,
                     "parameters": {"total": 2000, "active": 1000} if model.startswith("germ") else
                     {"total": 900, "active": 900}})
    for seed in seeds:   # round 1: GeRM (Y) succeeds every time
        k = 10
        for fam in family_names():
            put(out / "results" / f"germ_r1_{seed}_{fam}.json",
                {"model": "germ", "failures": True, "round": 1, "seed": seed, "family": fam, "run": "y",
                 "successes": k, "episodes": 10, "parameters": {"total": 2000, "active": 1000}})


def test_report_is_rebuilt_from_stored_results_alone(tmp_path):
    out, docs = tmp_path / "run", tmp_path / "docs" / "results.md"
    _write_run(out)
    docs.parent.mkdir()
    docs.write_text("# Results: first reproduction\n\nthe other sections stay\n")
    assert cli_main(["reproduce", "--stages", "quard", "--report-only", "--out", str(out), "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert text.startswith("# Results: first reproduction\n\nthe other sections stay\n")
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and "## Table III on our tasks" in text
    # GeRM (Y): seeds 80 %, 90 %, 70 % -> mean 80.0, sample std 10.0, in every family and overall
    germ_row = next(line for line in text.splitlines() if line.startswith("| GeRM (Y) |"))
    assert germ_row == "| GeRM (Y) | 2000 | 1000 | Y | 3 |" + " 80.0 ± 10.0 |" * 6
    rt1_row = next(line for line in text.splitlines() if line.startswith("| RT-1-style (N) |"))
    assert rt1_row.endswith(" 30.0 ± 10.0 |") and "| 900 | 900 | N |" in rt1_row
    # GeRM (Y) vs RT-1 per family: 24/30 vs 9/30, all families pooled: 120/150 vs 45/150
    z, p = two_proportion_z(24, 30, 9, 30)
    assert f"24/30 vs 9/30: z = {z:.2f}, p = {p:.3g} *" in text
    z, p = two_proportion_z(120, 150, 45, 150)
    half = 1.96 * math.sqrt(0.8 * 0.2 / 150 + 0.3 * 0.7 / 150)   # the gap's 95 % (Wald) interval, in points
    assert f"120/150 vs 45/150: +50.0 points ({50 - 100 * half:+.1f} to {50 + 100 * half:+.1f}), z = {z:.2f}, " \
           f"p = {p:.3g} *" in text
    # the flywheel: round 1 (150/150) vs round 0 (120/150) rises
    z, p = two_proportion_z(150, 150, 120, 150)
    assert f"z = {z:.2f}, p = {p:.3g}: rises" in text and "| 0 | 3/8 |" in text
    assert "go_stop" not in text and "go_to: 1/4, stop: 2/4" in text and "quadforge train --model germ" in text
    # GeRM's active of total parameters at the shipped (cpu) and paper presets, next to seed 003's
    assert "| GeRM | 1.80 M of 3.40 M (53 %) | 24.62 M of 49.84 M (49 %) |" in text
    assert "| RT-1-style | 1.00 M of 1.00 M (100 %) | - |" in text
    assert "| GeRM, seed 003 | - | 39.31 M of 83.48 M (47 %) |" in text
    # rebuilt identically, and kept when the first reproduction's report is rewritten
    assert cli_main(["reproduce", "--stages", "quard", "--report-only", "--out", str(out), "--docs", str(docs)]) == 0
    assert docs.read_text() == text
    write_report({"config": {}}, docs)
    rewritten = docs.read_text()
    assert rewritten.startswith("# Results: first reproduction") and "the other sections stay" not in rewritten
    assert BEGIN + text.split(BEGIN)[1].split(END)[0] + END in rewritten


def _tables(text: str) -> list[str]:
    """The success and GeRM-vs-baseline rows of a report: what pooling must not change."""
    return [line for line in text.splitlines() if line.startswith("| ") and ("/" in line or "±" in line)
            and not line.startswith("| r0-auto")]


def test_runs_of_different_seeds_pool_into_the_table_one_run_of_all_seeds_gives(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the page names the runs as given, relative to where it was made
    _write_run(Path("all"))
    _write_run(Path("s01"), seeds=(0, 1))
    _write_run(Path("s2"), seeds=(2,))
    assert cli_main(["reproduce", "--stages", "quard", "--report-only", "--out", "all", "--docs", "one.md"]) == 0
    assert cli_main(["reproduce", "--stages", "quard", "--report-only", "--out", "s01", "--pool", "s2",
                     "--docs", "pooled.md"]) == 0
    text = Path("pooled.md").read_text()
    assert _tables(text) == _tables(Path("one.md").read_text()) and len(_tables(text)) > 12
    # it says what it pooled and how to rebuild it; each run's collections and wall time are its own
    assert "Pooled from 2 runs of one experiment on different seeds ([0, 1, 2])" in text
    assert "--report-only --out s01 --pool s2`" in text
    assert "| r0-auto (s01) |" in text and "| r0-auto (s2) |" in text
    assert "#### `s01`" in text and "#### `s2`" in text


def test_pooling_refuses_runs_that_are_not_one_experiment_on_different_seeds(tmp_path, capsys):
    _write_run(tmp_path / "a", seeds=(0, 1))
    _write_run(tmp_path / "b", seeds=(1, 2))
    _write_run(tmp_path / "long", seeds=(2,), train_steps=24000)
    docs = tmp_path / "page.md"
    docs.write_text("# kept\n")

    def pool(*runs: str, extra: tuple[str, ...] = ("--report-only",)) -> str:
        argv = ["reproduce", "--stages", "quard", *extra, "--out", str(tmp_path / "a"), "--docs", str(docs)]
        for r in runs:
            argv += ["--pool", str(tmp_path / r)]
        assert cli_main(argv) == 2
        return capsys.readouterr().err
    assert "both hold seed 1 of" in pool("b")
    assert "train_steps (24000) is not" in pool("long")
    assert "no " in pool("missing") and "run.json" in pool("missing")
    assert "only with --report-only" in pool("long", extra=())
    assert "--pool belongs to --report-only" in pool("long", extra=("--status",))
    assert docs.read_text() == "# kept\n"   # nothing written by a refused report
    assert cli_main(["reproduce", "--stages", "germ", "--pool", str(tmp_path / "b")]) == 2
    assert "--pool: belongs to --stages quard" in capsys.readouterr().err


def test_report_without_results_says_not_run(tmp_path):
    lines = table3_section(load_run(tmp_path))
    assert "_Not run yet._" in "\n".join(lines)


def test_report_only_without_a_run_is_a_clear_error(tmp_path, capsys):
    assert cli_main(["reproduce", "--stages", "quard", "--report-only", "--out", str(tmp_path / "none")]) == 2
    assert "run.json" in capsys.readouterr().err


@pytest.mark.slow
def test_quard_loop_end_to_end_at_toy_size(tmp_path):
    cfg = QuardConfig(out=str(tmp_path / "run"), docs=str(tmp_path / "results.md"), scale="tiny", seeds=(0,),
                      rounds=2)
    missing = missing_capabilities(build_plan(cfg))
    if missing:
        pytest.skip("the QUARD loop needs commands this build lacks: " + "; ".join(missing.values()))
    docs = run_quard(cfg, log=lambda s: None)
    results = [json.loads(p.read_text()) for p in (tmp_path / "run" / "results").glob("*.json")]
    assert {(r["model"], r["failures"]) for r in results if r["round"] == 0} == set(TABLE3_ROWS)
    assert {r["round"] for r in results} == {0, 1}
    assert all(0 <= r["successes"] <= r["episodes"] for r in results)
    text = docs.read_text()
    assert "## Table III on our tasks" in text and "### The data flywheel" in text
    # resumable: a second invocation finds every step complete and runs nothing
    before = sorted(p.stat().st_mtime_ns for p in (tmp_path / "run" / "steps").glob("*.json"))
    run_quard(cfg, log=lambda s: None)
    assert sorted(p.stat().st_mtime_ns for p in (tmp_path / "run" / "steps").glob("*.json")) == before
    assert isinstance(build_plan(cfg)[0], Step)


@pytest.mark.slow
def test_loop_starts_from_an_existing_demo_store_and_pretrained_checkpoint(tmp_path):
    """--demos / --pretrained at toy size: a demonstration store and a VLA checkpoint made beforehand (as a
    user has them) start round 0: the round's store is a copy of the demonstrations topped up by the given
    checkpoint's episodes; nothing is collected by the expert or pre-trained by the loop."""
    cfg = QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,))
    if missing_capabilities(build_plan(cfg)):
        pytest.skip("the QUARD loop needs commands this build lacks")
    demos, ckpt = tmp_path / "demos", tmp_path / "vla"
    assert cli_main(["collect", "--task", "quard:all", "--policy", "quard_expert", "--store", str(demos),
                     "--episodes", "2", "--num-envs", "2", "--collector-id", "mine", "--no-progress"]) == 0
    assert cli_main(["train", "--model", "germ-dense", "--store", str(demos), "--out", str(ckpt), "--preset", "cpu",
                     "--max-steps", "2", "--batch-size", "2", "--success-only"]) == 0
    cfg = QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,), demos=str(demos),
                      pretrained=str(ckpt)).validate()
    assert cfg.pretrained == str(ckpt / "last.pt")             # a training directory means its last.pt
    steps = build_plan(cfg)
    assert {s.stage for s in steps[:2]} == {"auto"} and not any(s.stage in ("demos", "pretrain") for s in steps)
    for step in steps[:2]:                                       # the copy and round 0's auto-collection
        run_step(cfg, step, log=lambda s: None)
        assert is_complete(cfg, step)
    from quadforge.data.store import TrajectoryStore
    ids = [str(i) for i in TrajectoryStore.open(steps[1].output).episode_ids]
    assert sum(i.startswith("mine-") for i in ids) == 2 and sum(i.startswith("auto0-") for i in ids) == 8
    rec = json.loads(step_record_path(cfg.out, steps[1]).read_text())
    assert rec["collection"]["episodes"] == 8 and f"--policy {cfg.pretrained}" in rec["command"]
    assert not (tmp_path / "run" / "data" / "demos").exists() and not (tmp_path / "run" / "train").exists()


@pytest.mark.slow
def test_preset_parameters_count_germ_active_about_half_of_total():
    """The counts a run stores for the report (meta device: nothing allocated; ~5 s of CPU for the paper
    models' construction)."""
    from quadforge.tools.reproduce_quard import preset_parameters
    counts = preset_parameters()
    assert set(counts) == {"cpu", "paper"}
    for preset in counts.values():
        m = preset["models"]
        assert m["rt1"]["active"] == m["rt1"]["total"] and m["germ-dense"]["active"] == m["germ-dense"]["total"]
        g = m["germ"]
        assert 0.4 < g["active"] / g["total"] < 0.6                 # top-2 of 8 experts: about half
        assert abs(m["germ-dense"]["total"] - g["active"]) < 0.01 * g["active"]   # dense at the MoE's active size
    assert counts["paper"]["models"]["germ"]["total"] > 10 * counts["cpu"]["models"]["germ"]["total"]


def test_report_counts_the_demonstrations_the_rows_trained_on():
    from quadforge.tools.quard_report import demo_count
    scale = {"demo_episodes": 200}
    steps = [{"id": "r0-demos", "meta": {"round": 0, "episodes": 1000, "collector": "demos"}}]
    assert demo_count({"demos": "/data/quard_demos"}, steps, scale) == 1000   # --demos: the store's count
    assert demo_count({}, steps, scale) == 200                              # collected by the run: the scale's


def test_report_names_no_machine_only_path(tmp_path, monkeypatch):
    # a rebuild of Table III from a run given absolute --demos / --pretrained paths must not put them in docs
    from quadforge.tools.quard_report import _provenance
    monkeypatch.chdir(tmp_path)
    run = {"config": {"demos": "/work/runs/quard_demos", "pretrained": str(tmp_path / "ckpt" / "vla.pt"),
                      "out": "runs/rq", "seeds": [0]},
           "scale": {"name": "cpu"},
           "commands": ["quadforge reproduce --stages quard --demos /work/runs/quard_demos"]}
    text = "\n".join(_provenance(run, []))
    assert "/work/" not in text and str(tmp_path) not in text
    assert "`quard_demos` (`--demos`)" in text and "`ckpt/vla.pt` (`--pretrained`)" in text
    assert "--demos quard_demos`" in text


# --- the power scale, --jobs, the validation curves (issue 25) ------------------------------------------------
def test_power_scale_evaluates_what_the_power_analysis_asks_per_row():
    from quadforge.evaluation.metrics import episodes_for_power
    from quadforge.tools.reproduce_quard import EVAL_COLOURS
    need = episodes_for_power(0.50, 0.65)
    for seeds in ((0,), (0, 1, 2)):
        cfg = QuardConfig(scale="power", seeds=seeds, pretrained=None).validate()
        evals = [s for s in build_plan(cfg) if s.stage == "eval" and s.meta["round"] == 0]
        per_cell = {int(s.argv[s.argv.index("--episodes-per-cell") + 1]) for s in evals}
        assert len(per_cell) == 1
        row = per_cell.pop() * len(family_names()) * len(EVAL_COLOURS) * len(seeds)
        assert need <= row < need + len(family_names()) * len(EVAL_COLOURS) * len(seeds)
        trains = [s for s in build_plan(cfg) if s.stage == "train"]
        assert all("val_every=200" in s.argv and "--max-steps" in s.argv for s in trains)


def test_every_step_names_the_steps_whose_outputs_it_reads():
    steps = build_plan(QuardConfig(scale="tiny", rounds=2, seeds=(0, 1)).validate())
    ids = [s.id for s in steps]
    for k, step in enumerate(steps):
        assert all(dep in ids[:k] for dep in step.after), f"{step.id} reads a later or unknown step: {step.after}"
        for dep in step.after:   # a step reads its dependency's output path
            out = next(s.output for s in steps if s.id == dep)
            assert any(out in a for a in step.argv), (step.id, dep)
    by_id = {s.id: s for s in steps}
    assert by_id["r1-auto"].after == ("r1-demos", "train-germ_Y_r0_s0")   # round 1's collector
    assert by_id["eval-rt1_N_r0_s1"].after == ("train-rt1_N_r0_s1",)


def _fake_steps():
    # a -> (b, c) -> d; c fails on request
    return [Step("a", "demos", [], "a", ()), Step("b", "train", [], "b", (), after=("a",)),
            Step("c", "train", [], "c", (), after=("a",)), Step("d", "eval", [], "d", (), after=("b", "c"))]


def test_jobs_run_independent_steps_together_and_dependents_after(monkeypatch):
    import threading
    import time as _time

    from quadforge.tools import reproduce_quard as rq
    lock, live, events = threading.Lock(), set(), []

    def fake_run(cfg, step, log):
        with lock:
            live.add(step.id)
            events.append(("start", step.id, frozenset(live)))
        _time.sleep(0.2)
        with lock:
            live.discard(step.id)
            events.append(("end", step.id, frozenset(live)))
        return {"id": step.id}
    monkeypatch.setattr(rq, "run_step", fake_run)
    done = []
    rq.run_steps(QuardConfig(), _fake_steps(), 2, lambda s: None, lambda st, rec, ran: done.append(st.id))
    starts = {e[1]: e[2] for e in events if e[0] == "start"}
    ends = [e[1] for e in events if e[0] == "end"]
    assert starts["a"] == {"a"} and ends.index("a") < min(ends.index("b"), ends.index("c"))
    assert {"b", "c"} <= starts["b"] | starts["c"]              # b and c ran side by side
    assert starts["d"] == {"d"} and done[-1] == "d" and sorted(done) == ["a", "b", "c", "d"]


def test_a_failed_step_stops_new_steps_and_keeps_the_finished(monkeypatch):
    from quadforge.tools import reproduce_quard as rq

    def fake_run(cfg, step, log):
        if step.id == "c":
            raise rq.StepFailed("step c failed (exit 1)")
        return {"id": step.id}
    monkeypatch.setattr(rq, "run_step", fake_run)
    done = []
    with pytest.raises(rq.StepFailed, match="step c"):
        rq.run_steps(QuardConfig(), _fake_steps(), 2, lambda s: None, lambda st, rec, ran: done.append(st.id))
    assert sorted(done) == ["a", "b"]    # d, which reads c, never started


def test_the_runner_reports_its_running_steps_every_few_minutes(tmp_path, monkeypatch):
    """Between a step's start and end (an hour for a long training) the runner writes a line on what runs:
    a training's step and time left from its log, another step's time so far."""
    import time as _time

    from quadforge.tools import reproduce_quard as rq
    out = tmp_path / "run"

    def fake_run(cfg, step, log):
        if step.stage == "train":
            (out / "logs").mkdir(parents=True, exist_ok=True)
            (out / "logs" / f"{step.id}.log").write_text("[rt1] step 2/4 loss=1 samples_per_s=4\n")
        _time.sleep(0.5)
        return {"id": step.id}
    monkeypatch.setattr(rq, "run_step", fake_run)
    monkeypatch.setattr(rq, "HEARTBEAT_S", 0.1)
    steps = [Step("t", "train", ["train", "--max-steps", "4", "--batch-size", "2"], "t", ()),
             Step("e", "eval", ["eval"], "e", ())]
    lines = []
    rq.run_steps(QuardConfig(out=str(out)), steps, 2, lines.append, lambda *a: None)
    beats = [line for line in lines if " UTC: " in line]
    assert beats, lines
    assert "t at step 2 of 4, ~0 min left at 2.0 steps/s" in beats[-1] and "e running for 0 min" in beats[-1]


_RUNNER_WITH_SLEEPING_STEPS = """
import subprocess, sys
from quadforge.tools import reproduce_quard as rq
folder = sys.argv[1]
def run(cfg, step, log):   # each step's process writes its pid, then sleeps like a long training
    code = (f"import os, time; from quadforge.tools.parent_watch import watch_parent; watch_parent(0.1); "
            f"open({folder!r} + '/{step.id}.pid', 'w').write(str(os.getpid())); time.sleep(120)")
    return rq.run_child([sys.executable, "-c", code], subprocess.DEVNULL, None)
rq.run_step = run
steps = [rq.Step("b", "train", [], "b", ()), rq.Step("c", "train", [], "c", ())]
rq.run_steps(rq.QuardConfig(), steps, 2, print, lambda *a: None)
"""


def test_sigterm_to_the_runner_stops_its_running_steps(tmp_path):
    """A runner stopped by SIGTERM (`kill`, a scheduler's limit) takes its steps' processes with it: an
    orphaned training would run on beside the rerun that resumes it, both writing one checkpoint."""
    import os
    import signal
    import subprocess
    import sys
    import time as _time
    runner = subprocess.Popen([sys.executable, "-c", _RUNNER_WITH_SLEEPING_STEPS, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids = [tmp_path / "b.pid", tmp_path / "c.pid"]
    deadline = _time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in pids):
        assert runner.poll() is None and _time.monotonic() < deadline, runner.communicate()[0]
        _time.sleep(0.05)
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 128 + signal.SIGTERM, out
    assert "stopped: 2 running step(s) ended" in out
    for p in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(int(p.read_text()), 0)


def test_steps_of_a_runner_killed_by_sigkill_end_with_it(tmp_path):
    """SIGKILL cannot be caught, so the runner cannot stop its steps; each step watches its parent
    (tools.parent_watch) and ends once the runner is gone."""
    import os
    import signal
    import subprocess
    import sys
    import time as _time
    runner = subprocess.Popen([sys.executable, "-c", _RUNNER_WITH_SLEEPING_STEPS, str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = [tmp_path / "b.pid", tmp_path / "c.pid"]
    deadline = _time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in pids):
        assert runner.poll() is None and _time.monotonic() < deadline
        _time.sleep(0.05)
    runner.kill()
    runner.wait()
    alive = [int(p.read_text()) for p in pids]
    deadline = _time.monotonic() + 30
    while alive and _time.monotonic() < deadline:
        _time.sleep(0.1)
        alive = [pid for pid in alive if _running(pid)]
    assert not alive, f"steps {alive} outlived their runner"


def _running(pid: int) -> bool:
    """Whether pid is a live process (a zombie awaiting its reaper counts as ended)."""
    import os
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        os.kill(pid, 0)
        return True


def test_the_loop_on_a_gpu_puts_every_step_there():
    """--device cuda --backend mujoco_warp: every training (Table III's and Fig. 6's) gets the device, every
    collection and evaluation the physics backend; the default plan names neither."""
    gpu = build_plan(QuardConfig(scale="tiny", seeds=(0,), fig6="go_to", device="cuda", backend="mujoco_warp",
                                 warp_device="cuda:0"))
    for step in gpu:
        if step.program == "copy":
            continue
        if step.argv[0] == "train":
            assert step.argv[step.argv.index("--device") + 1] == "cuda", step.id
        else:
            assert step.argv[0] in ("collect", "eval"), step.id
            i = step.argv.index("--backend")
            assert step.argv[i:i + 4] == ["--backend", "mujoco_warp", "--warp-device", "cuda:0"], step.id
    default = build_plan(QuardConfig(scale="tiny", seeds=(0,), fig6="go_to"))
    assert not any({"--device", "--backend", "--warp-device"} & set(s.argv) for s in default)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_device_and_backend_are_checked_before_any_step(tmp_path, capsys):
    out = str(tmp_path / "r")
    assert cli_main(["reproduce", "--stages", "quard", "--device", "cuda", "--out", out]) == 2
    assert "--device 'cuda': this machine has no CUDA GPU torch can use" in capsys.readouterr().err
    assert cli_main(["reproduce", "--stages", "quard", "--warp-device", "cpu", "--out", out]) == 2
    assert "only with --backend mujoco_warp" in capsys.readouterr().err
    assert cli_main(["reproduce", "--stages", "imitation", "--backend", "mujoco_warp", "--out", out]) == 2
    assert "--backend: belongs to --stages quard" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_init_starts_every_training_of_its_model_from_the_checkpoint():
    """--init rt1=CKPT: Table III's RT-1 rows and Fig. 6's RT-1 start from CKPT (init_from); no other row."""
    ckpt = str(Path(__file__).resolve().parents[1] / "experts" / "checkpoints" / "vla_rt1.pt")
    cfg = QuardConfig(scale="tiny", seeds=(0, 1), fig6="go_to", init=(f"rt1={ckpt}",))
    assert cfg.inits() == {"rt1": ckpt}
    trains = [s for s in build_plan(cfg) if s.argv[:1] == ["train"]]
    for step in trains:
        model = step.argv[step.argv.index("--model") + 1]
        assert (f"init_from={ckpt}" in step.argv) == (model == "rt1"), step.id
    assert sum(f"init_from={ckpt}" in s.argv for s in trains) == 3      # two seeds' rows and Fig. 6's
    dense = str(Path(ckpt).with_name("vla_germ_dense.pt"))               # upcycles into the MoE rows
    both = QuardConfig(scale="tiny", seeds=(0,), init=(f"germ={dense}", f"germ-il={dense}", f"germ-dense={dense}"))
    assert both.inits() == {"germ": dense, "germ-il": dense, "germ-dense": dense}


def test_a_bad_init_is_a_clear_error_before_any_step(tmp_path, capsys):
    ckpts = Path(__file__).resolve().parents[1] / "experts" / "checkpoints"
    out = str(tmp_path / "r")
    for init, message in ((f"rt1={ckpts / 'vla_germ_dense.pt'}", "holds a 'germ-dense' model, not 'rt1'"),
                          (f"rt2={ckpts / 'vla_rt1.pt'}", "give MODEL=CKPT with MODEL one of"),
                          (f"rt1={tmp_path / 'none.pt'}", "--init " + str(tmp_path / "none.pt") + ": no checkpoint")):
        assert cli_main(["reproduce", "--stages", "quard", "--init", init, "--out", out]) == 2, init
        assert message in capsys.readouterr().err, init
    assert not (tmp_path / "r").exists()


def test_jobs_below_one_is_a_clear_error(tmp_path, capsys):
    assert cli_main(["reproduce", "--stages", "quard", "--jobs", "0", "--out", str(tmp_path / "r")]) == 2
    assert "--jobs 0" in capsys.readouterr().err


def test_flattening_reads_the_last_quarter_of_the_curve():
    from quadforge.tools.quard_report import flattening
    falling = [{"step": s, "loss": 2.0 - s / 1000} for s in range(200, 2001, 200)]
    flat, change = flattening(falling)
    assert not flat and change == pytest.approx((0.0 - 0.6) / 0.6)    # best to step 1500: 0.6; after: 0.0
    plateau = [{"step": s, "loss": 1.0 + 1.0 / s} for s in range(200, 2001, 200)]
    assert flattening(plateau)[0]
    rising = [{"step": s, "loss": 1.0 + s / 1000} for s in range(200, 2001, 200)]   # over-fitting: flat
    assert flattening(rising)[0] and flattening(rising)[1] > 0
    assert flattening(falling[:3]) is None


def test_report_shows_each_runs_validation_curve(tmp_path):
    from quadforge.training.curves import append_val_row, restart_val_curve
    out = tmp_path / "run"
    _write_run(out)
    for run, loss in (("rt1_N_r0_s0", lambda s: 3.0 - s / 1000), ("germ_Y_r0_s0", lambda s: 0.5)):
        path = restart_val_curve(out / "train" / run, 0)
        for s in range(200, 2001, 200):
            append_val_row(path, s, {"loss": loss(s), "greedy_agreement": s / 4000})
    text = "\n".join(table3_section(load_run(out)))
    assert "### Validation curves" in text
    rt1 = next(line for line in text.splitlines() if line.startswith("| rt1_N_r0_s0 |") and "flattened" not in line
               and ("no (" in line or "yes (" in line))
    assert rt1.endswith("| no (-37.5 %) |")   # best to step 1500: 1.6 (step 1400); after: 1.0
    germ = next(line for line in text.splitlines() if line.startswith("| germ_Y_r0_s0 |") and "(" in line)
    assert germ.endswith("| yes (+0.0 %) |")


def test_a_long_runs_curve_shows_a_dozen_steps_and_is_judged_on_all(tmp_path):
    from quadforge.tools.quard_report import CURVE_COLUMNS, shown_steps
    from quadforge.training.curves import append_val_row, restart_val_curve
    steps = list(range(600, 24001, 600))   # a 24,000-step run's 40 validations
    shown = shown_steps(steps)
    assert len(shown) == CURVE_COLUMNS and shown[0] == 600 and shown[-1] == 24000 and shown == sorted(shown)
    assert shown_steps(steps[:10]) == steps[:10]
    out = tmp_path / "run"
    _write_run(out)
    path = restart_val_curve(out / "train" / "germ_Y_r0_s0", 0)
    for s in steps:   # falls until 23,400, then one last drop at 24,000, a step the table may not show
        append_val_row(path, s, {"loss": 1.0 if s < 24000 else 0.5, "greedy_agreement": 0.8})
    text = "\n".join(table3_section(load_run(out)))
    header = next(line for line in text.splitlines() if line.startswith("| run |"))
    assert header.count("|") == CURVE_COLUMNS + 3 and "Columns: 12 of the 40 validation steps" in text
    germ = next(line for line in text.splitlines() if line.startswith("| germ_Y_r0_s0 |") and "(" in line)
    assert germ.endswith("| no (-50.0 %) |")


def test_fig6_plan_trains_on_one_familys_demonstrations_and_evaluates_each_kept_checkpoint():
    cfg = QuardConfig(scale="tiny", seeds=(0, 1), fig6="go_to").validate()
    steps = [s for s in build_plan(cfg) if s.stage.startswith("fig6")]
    trains = [s for s in steps if s.stage == "fig6_train"]
    assert [s.meta["model"] for s in trains] == ["rt1", "germ-il", "germ-dense", "germ"]
    for t in trains:
        assert t.argv[t.argv.index("--store") + 1].endswith("/data/demos") and "--success-only" in t.argv
        assert "families=go_to" in t.argv and "keep_every=2" in t.argv and t.after == ("demos",)
        evals = [s for s in steps if s.stage == "fig6_eval" and s.after == (t.id,)]
        assert [s.meta["step"] for s in evals] == [2, 4]
        assert all(s.argv[s.argv.index("--policy") + 1] == f"{t.output}/step_{s.meta['step']}.pt" for s in evals)
        assert all(s.argv[s.argv.index("--task") + 1] == "quard:go_to" for s in evals)
    with pytest.raises(ValueError, match="--fig6 'go_nowhere'"):
        QuardConfig(scale="tiny", fig6="go_nowhere").validate()


def test_fig6_section_reads_success_against_epochs():
    from quadforge.tools.quard_report import fig6_section
    points = [{"model": m, "family": "go_to", "step": st, "epoch": st / 100, "successes": k, "episodes": 16}
              for m, ks in (("rt1", (2, 6, 10)), ("germ", (12, 14, 13))) for st, k in zip((100, 200, 300), ks)]
    text = "\n".join(fig6_section(points))
    assert "| 100 (1.0) | 200 (2.0) | 300 (3.0) |" in text
    assert "| RT-1-style | 12 (2/16) | 38 (6/16) | 62 (10/16) | 62 | step 300 (epoch 3.0) |" in text
    # 75 is 12.5 points below the best 87.5: converged at step 200
    assert "| GeRM | 75 (12/16) | 88 (14/16) | 81 (13/16) | 88 | step 200 (epoch 2.0) |" in text
    assert fig6_section([]) == []


def test_a_fig6_point_counts_its_familys_episodes_at_the_checkpoints_epoch(tmp_path):
    import torch

    from quadforge.models.checkpoint import Checkpoint, save_checkpoint
    from quadforge.tools.reproduce_quard import fig6_result
    cfg = QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,), fig6="go_to").validate()
    step = next(s for s in build_plan(cfg) if s.stage == "fig6_eval" and s.meta["step"] == 4)
    ckpt = Path(step.argv[step.argv.index("--policy") + 1])
    save_checkpoint(ckpt, Checkpoint("rt1", {}, {"w": torch.zeros(1)}, {"name": "vla"}, step=4,
                                     provenance={"train_windows": 8}))
    Path(step.output).mkdir(parents=True)
    (Path(step.output) / "eval.json").write_text(json.dumps({"families": {"train": {"go_to": {"episodes": 4,
                                                                                             "success": 0.75}}}}))
    point = fig6_result(step, {"wall_s": 3.0})
    assert (point["successes"], point["episodes"]) == (3, 4)
    assert point["epoch"] == pytest.approx(4 * 4 / 8)     # step 4 x batch 4 over 8 training windows
    assert point["model"] == step.meta["model"] and point["family"] == "go_to"


def test_a_resumed_collections_rate_counts_only_the_episodes_it_added(tmp_path, monkeypatch):
    from quadforge.tools import reproduce_quard as rq
    counts = iter([30, 40])    # the collector's episodes before and after the invocation
    monkeypatch.setattr(rq, "store_episodes", lambda path, collector=None: next(counts))
    monkeypatch.setattr(rq, "collection_stats", lambda store, collector: {"episodes": 40, "per_family": {}})
    monkeypatch.setattr(rq, "run_child", lambda cmd, log_file, env: 0)
    cfg = QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,))
    step = next(s for s in build_plan(cfg) if s.id == "r0-auto")
    record = rq.run_step(cfg, step, lambda s: None)
    c = record["collection"]
    assert c["resumed_with"] == 30 and c["episodes"] == 40
    assert c["episodes_per_min"] == pytest.approx(10 / (record["wall_s"] / 60))
    # the step's log keeps every attempt, each under a header naming its command
    counts = iter([40, 40])
    rq.run_step(cfg, step, lambda s: None)
    headers = [ln for ln in (tmp_path / "run" / "logs" / "r0-auto.log").read_text().splitlines() if ln.startswith("# ")]
    assert len(headers) == 2 and all("quadforge collect" in h for h in headers)


def test_train_overrides_reach_every_training_step_and_a_typo_fails_first(tmp_path, capsys):
    cfg = QuardConfig(scale="tiny", seeds=(0,), fig6="go_to", train_overrides=("early_share=0.5",)).validate()
    trains = [s for s in build_plan(cfg) if s.stage in ("pretrain", "train", "fig6_train")]
    assert trains and all(s.argv[-1] == "early_share=0.5" for s in trains)
    with pytest.raises(ValueError, match="--train-override.*early_shar"):
        QuardConfig(scale="tiny", train_overrides=("early_shar=0.5",)).validate()
    assert cli_main(["reproduce", "--stages", "quard", "--scale", "tiny", "--train-override", "batch_size=big",
                     "--out", str(tmp_path / "r")]) == 2
    assert "--train-override" in capsys.readouterr().err
    # a model value is checked on the model config it builds, before any step runs
    with pytest.raises(ValueError, match="--train-override.*unknown_words='closest'"):
        QuardConfig(scale="tiny", train_overrides=("model.unknown_words=closest",)).validate()
    QuardConfig(scale="tiny", train_overrides=("model.history=3", "model.unknown_words=nearest")).validate()


def test_one_seed_cells_show_counts_and_a_wilson_interval():
    from quadforge.evaluation.metrics import wilson_interval
    from quadforge.tools.quard_report import spread
    lo, hi = wilson_interval(60, 170)
    assert spread([{"seed": 0, "successes": 60, "episodes": 170}]) == f"35.3 (60/170; {100 * lo:.0f}–{100 * hi:.0f})"
    assert spread([]) == "-"


def test_the_report_names_each_rows_starting_checkpoint_and_the_upcycled_ones():
    from quadforge.tools.quard_report import _init_line
    ckpts = Path(__file__).resolve().parents[1] / "experts" / "checkpoints"
    line = _init_line([f"rt1={ckpts / 'vla_rt1.pt'}", f"germ={ckpts / 'vla_germ_dense.pt'}"])
    assert "RT-1-style from" in line and "vla_rt1.pt`;" in line
    assert "GeRM from" in line and "vla_germ_dense.pt` (upcycled)" in line and "dense FFN's width" in line
    assert "upcycled" not in _init_line([f"rt1={ckpts / 'vla_rt1.pt'}"]).lower()


def _finish_trainings_and_evals(cfg: QuardConfig) -> list[Step]:
    """Every training and evaluation of ``cfg``'s plan marked finished as a run leaves them (a last.pt or an
    eval.json, and the step's record holding the command it ran)."""
    steps = build_plan(cfg)
    for step in steps:
        if step.stage in TRAIN_STAGES + EVAL_STAGES:
            Path(step.output).mkdir(parents=True, exist_ok=True)
            (Path(step.output) / ("last.pt" if step.stage in TRAIN_STAGES else "eval.json")).write_text("{}")
            step_record_path(cfg.out, step).parent.mkdir(parents=True, exist_ok=True)
            step_record_path(cfg.out, step).write_text(json.dumps({"argv": step.argv}))
    return steps


def test_scores_of_a_training_that_was_continued_are_stale_once_it_finishes(tmp_path, monkeypatch):
    """A runner stopped between a continued training's end and its evaluation's rerun (a session boundary)
    must not take the shorter model's eval.json for the longer model's: the evaluation began before the
    training's last run did, so it runs again, and --status says so."""
    import quadforge.tools.reproduce_quard as rq
    monkeypatch.setattr(rq, "store_episodes", lambda *a, **k: 10 ** 6)
    cfg = QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,))
    steps = {s.id: s for s in _finish_trainings_and_evals(cfg)}
    train, ev = steps["train-rt1_N_r0_s0"], steps["eval-rt1_N_r0_s0"]
    stamp = {train.id: "2026-11-28 13:00:00", ev.id: "2026-11-28 07:00:00"}   # the eval scored the 2k model
    for step in (train, ev):
        step_record_path(cfg.out, step).write_text(json.dumps({"argv": step.argv, "stage": step.stage,
                                                               "started_utc": stamp[step.id]}))
    assert is_complete(cfg, train) and not is_complete(cfg, ev)
    assert [s.id for s in steps_to_run(cfg, list(steps.values()))] == [ev.id]
    step_record_path(cfg.out, ev).write_text(json.dumps({"argv": ev.argv, "stage": ev.stage,
                                                         "started_utc": "2026-11-28 14:00:00"}))
    assert is_complete(cfg, ev) and steps_to_run(cfg, list(steps.values())) == []


def test_a_longer_train_steps_continues_every_training_and_scores_it_again(tmp_path, monkeypatch):
    """--train-steps over a finished run: each training resumes from its last.pt to the new length, and its
    evaluation runs again (the old scores were another model's); a shorter budget or a flywheel round
    collected by the old model is a clear error before anything runs."""
    import quadforge.tools.reproduce_quard as rq
    monkeypatch.setattr(rq, "store_episodes", lambda *a, **k: 10 ** 6)    # every collection complete
    out = str(tmp_path / "run")
    _finish_trainings_and_evals(QuardConfig(out=out, scale="tiny", seeds=(0,)))
    assert steps_to_run(QuardConfig(out=out, scale="tiny", seeds=(0,)), build_plan(
        QuardConfig(out=out, scale="tiny", seeds=(0,)))) == []
    longer = QuardConfig(out=out, scale="tiny", seeds=(0,), train_steps=8).validate()
    todo = steps_to_run(longer, build_plan(longer))
    assert {s.stage for s in todo} == {"train", "eval"}        # round 0's collector keeps its length
    assert len(todo) == len([s for s in build_plan(longer) if s.stage in ("train", "eval")])
    for step in (s for s in todo if s.stage in TRAIN_STAGES):
        argv = resume_argv(step)
        assert argv[argv.index("--max-steps") + 1] == "8" and argv[-1] == "--resume", step.id
    with pytest.raises(ValueError, match="trained 4 steps and this run asks 2 .*use a new --out"):
        steps_to_run(QuardConfig(out=out, scale="tiny", seeds=(0,), train_steps=2), build_plan(
            QuardConfig(out=out, scale="tiny", seeds=(0,), train_steps=2)))
    paper = str(tmp_path / "paper")   # the paper scale trains the preset's length: no --max-steps to compare
    _finish_trainings_and_evals(QuardConfig(out=paper, scale="paper", seeds=(0,)))
    with pytest.raises(ValueError, match="trained the preset length of steps and this run asks 30000 "):
        cfg = QuardConfig(out=paper, scale="paper", seeds=(0,), train_steps=30000)
        steps_to_run(cfg, build_plan(cfg))
    flywheel = str(tmp_path / "flywheel")
    _finish_trainings_and_evals(QuardConfig(out=flywheel, scale="tiny", seeds=(0,), rounds=2))
    cfg = QuardConfig(out=flywheel, scale="tiny", seeds=(0,), rounds=2, train_steps=8)
    with pytest.raises(ValueError, match="r1-auto is complete but read .*train-germ_Y_r0_s0"):
        steps_to_run(cfg, build_plan(cfg))


def test_train_steps_sets_every_rows_length_and_keeps_checkpoints_few():
    """--train-steps replaces the scale's length in every Table III training; a long budget validates and keeps
    checkpoints at most ~40 and ~4 times (each GeRM checkpoint is ~90 MB), a short one as the scale does."""
    plan = build_plan(QuardConfig(scale="power", seeds=(0,), train_steps=24000))
    trains = [s for s in plan if s.stage == "train"]
    assert trains and all(s.argv[s.argv.index("--max-steps") + 1] == "24000" for s in trains)
    assert all("val_every=600" in s.argv and "keep_every=6000" in s.argv for s in trains)
    pre = next(s for s in plan if s.stage == "pretrain")                 # round 0's collector keeps its length
    assert pre.argv[pre.argv.index("--max-steps") + 1] == "2000" and "val_every=200" in pre.argv
    with pytest.raises(ValueError, match="--train-steps 0"):
        QuardConfig(train_steps=0).validate()


def test_the_command_lines_flags_reach_the_runs_config(tmp_path, monkeypatch):
    """Every quard flag given lands in the config the runner gets; the others keep QuardConfig's defaults."""
    import quadforge.tools.reproduce_quard as rq
    got = {}
    monkeypatch.setattr(rq, "run_quard", lambda cfg, command=None, jobs=1: got.update(cfg=cfg, jobs=jobs) or "x")
    ckpt = Path(__file__).resolve().parents[1] / "experts" / "checkpoints" / "vla_rt1.pt"
    out, docs = str(tmp_path / "r"), str(tmp_path / "results.md")
    assert cli_main(["reproduce", "--stages", "quard", "--scale", "power", "--seeds", "1,2", "--rounds", "2",
                     "--jobs", "2", "--train-steps", "500", "--init", f"rt1={ckpt}", "--train-override",
                     "model.history=3", "--out", out, "--docs", docs]) == 0
    cfg = got["cfg"]
    assert (cfg.out, cfg.docs, cfg.scale, cfg.seeds, cfg.rounds, cfg.train_steps, got["jobs"]) == \
        (out, docs, "power", (1, 2), 2, 500, 2)
    assert cfg.init == (f"rt1={ckpt}",) and cfg.train_overrides == ("model.history=3",)
    default = QuardConfig()
    assert (cfg.demos, cfg.pretrained, cfg.fig6, cfg.device, cfg.backend) == \
        (default.demos, default.pretrained, default.fig6, default.device, default.backend)


def test_imitation_flags_with_the_quard_stage_are_a_clear_error(tmp_path, capsys):
    """Flags the quard stage would silently ignore are refused, naming them, before anything runs."""
    out = str(tmp_path / "r")
    assert cli_main(["reproduce", "--stages", "quard", "--quick", "--germ-steps", "9", "--out", out]) == 2
    assert "--quick, --germ-steps belong to the imitation/germ stages" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_finished_toy_run_continued_to_a_longer_budget(tmp_path):
    """The toy loop, then the same command with a longer --train-steps: every row's training resumes from
    its checkpoint to the new length (its checkpoint says so), its evaluation runs again, and nothing else
    does (the demonstrations, the collector and round 0's collection stay)."""
    from quadforge.models.checkpoint import load_checkpoint
    cfg = QuardConfig(out=str(tmp_path / "run"), docs=str(tmp_path / "results.md"), scale="tiny", seeds=(0,))
    if missing_capabilities(build_plan(cfg)):
        pytest.skip("the QUARD loop needs commands this build lacks")
    run_quard(cfg, log=lambda s: None)
    records = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "run" / "steps").glob("*.json")}
    longer = QuardConfig(out=cfg.out, docs=cfg.docs, scale="tiny", seeds=(0,), train_steps=6)
    run_quard(longer, log=lambda s: None)
    again = {p.name for p in (tmp_path / "run" / "steps").glob("*.json")
             if p.stat().st_mtime_ns != records[p.name]}
    assert again == {f"{s.id}.json" for s in build_plan(longer) if s.stage in ("train", "eval")}
    for step in (s for s in build_plan(longer) if s.stage == "train"):
        assert load_checkpoint(str(Path(step.output) / "last.pt")).step == 6, step.id
        record = json.loads(step_record_path(cfg.out, step).read_text())
        assert "--resume" in record["argv"]
        # the record's wall time is the whole training's: the 4-step run's and the continuation's
        assert [max_steps(seg["argv"]) for seg in record["segments"]] == [4, 6]
        assert record["wall_s"] == pytest.approx(sum(seg["wall_s"] for seg in record["segments"]))
    assert "6 training steps" in Path(cfg.docs).read_text()
