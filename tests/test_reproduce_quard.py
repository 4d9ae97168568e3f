"""`quadforge reproduce --stages quard`: the plan, the z-test, the report from stored results alone."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from quadforge.tools.cli import main as cli_main
from quadforge.tools.quard_report import BEGIN, END, FAMILIES, TABLE3_ROWS, load_run, table3_section
from quadforge.tools.reproduce_quard import (SCALES, QuardConfig, Step, build_plan, is_complete, missing_capabilities,
                                             plan_markdown, resume_argv, run_quard, step_record_path)
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
        assert a[a.index("--max-steps") + 1] == "1500" and a[a.index("--batch-size") + 1] == "16"
        assert ("--success-only" in a) == (not s.meta["failures"])
    evals = [s for s in steps if s.stage == "eval"]
    assert {s.meta["family"] for s in evals} == set(FAMILIES)
    assert len(evals) == 5 * len([s for s in steps if s.stage == "train"])
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


def test_finished_steps_are_recognised(tmp_path):
    cfg = QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,))
    train = next(s for s in build_plan(cfg) if s.stage == "train")
    assert not is_complete(cfg, train) and resume_argv(train) == train.argv
    Path(train.output).mkdir(parents=True)
    assert resume_argv(train) == train.argv + ["--overwrite"]   # died before its first checkpoint
    (Path(train.output) / "last.pt").write_bytes(b"")
    assert resume_argv(train) == train.argv + ["--resume"]
    assert not is_complete(cfg, train)      # a checkpoint without the step's record: interrupted, resume it
    step_record_path(cfg.out, train).parent.mkdir(parents=True)
    step_record_path(cfg.out, train).write_text("{}")
    assert is_complete(cfg, train)
    demos = build_plan(cfg)[0]
    assert not is_complete(cfg, demos)      # no store yet


# --- the report from stored files ---------------------------------------------------------------------------
# success counts per (model, failures) for seeds 0, 1, 2 (the same in every family), 10 episodes each
COUNTS = {("rt1", False): (2, 3, 4), ("germ-il", False): (3, 3, 3), ("germ-dense", False): (4, 5, 6),
          ("germ-dense", True): (5, 5, 5), ("germ", False): (6, 6, 7), ("germ", True): (8, 9, 7)}


def _write_run(out: Path) -> None:
    def put(path: Path, obj) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj))
    put(out / "run.json", {"config": {"out": str(out), "seeds": [0, 1, 2], "rounds": 2},
                           "scale": {"name": "tiny", "note": "plumbing only", "demo_episodes": 8, "auto_episodes": 8,
                                     "train_steps": 4, "batch_size": 4, "preset": "cpu", "eval_episodes": 10},
                           "commands": ["quadforge reproduce --stages quard --scale tiny --rounds 2"],
                           "started_utc": "2026-11-24 01:00:00", "finished_utc": "2026-11-24 02:00:00"})
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
        for seed, k in enumerate(per_seed):
            for fam in FAMILIES:
                put(out / "results" / f"{model}_{failures}_{seed}_{fam}.json",
                    {"model": model, "failures": failures, "round": 0, "seed": seed, "family": fam,
                     "run": "x", "successes": k, "episodes": 10,
                     "parameters": {"total": 2000, "active": 1000} if model.startswith("germ") else
                     {"total": 900, "active": 900}})
    for seed, k in enumerate((10, 10, 10)):   # round 1: GeRM (Y) succeeds every time
        for fam in FAMILIES:
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
    assert f"120/150 vs 45/150: z = {z:.2f}, p = {p:.3g} *" in text
    # the flywheel: round 1 (150/150) vs round 0 (120/150) rises
    z, p = two_proportion_z(150, 150, 120, 150)
    assert f"z = {z:.2f}, p = {p:.3g}: rises" in text and "| 0 | 3/8 |" in text
    assert "go_stop" not in text and "go_to: 1/4, stop: 2/4" in text and "quadforge train --model germ" in text
    # rebuilt identically, and kept when the first reproduction's report is rewritten
    assert cli_main(["reproduce", "--stages", "quard", "--report-only", "--out", str(out), "--docs", str(docs)]) == 0
    assert docs.read_text() == text
    write_report({"config": {}}, docs)
    rewritten = docs.read_text()
    assert rewritten.startswith("# Results: first reproduction") and "the other sections stay" not in rewritten
    assert BEGIN + text.split(BEGIN)[1].split(END)[0] + END in rewritten


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
