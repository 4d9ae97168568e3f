"""`quadforge reproduce --stages quard --status`: a run's steps, a training's progress and time left from its
log, the plan of a longer budget; nothing is run or written."""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

import quadforge.tools.quard_status as qs
import quadforge.tools.reproduce_quard as rq
from quadforge.tools.cli import main as cli_main
from quadforge.tools.quard_status import config_of_run, run_status, status_text
from quadforge.tools.reproduce_quard import EVAL_STAGES, TRAIN_STAGES, QuardConfig, build_plan, step_record_path
from quadforge.tools.train_progress import training_progress


def _finished(cfg: QuardConfig, monkeypatch) -> None:
    """``cfg``'s run as a finished one leaves it: every collection full, every training with its last.pt and
    a log, every evaluation with its eval.json, each step's record holding its command."""
    for mod in (rq, qs):
        monkeypatch.setattr(mod, "store_episodes", lambda *a, **k: 10 ** 6)
    for step in build_plan(cfg):
        if step.stage in TRAIN_STAGES + EVAL_STAGES:
            Path(step.output).mkdir(parents=True, exist_ok=True)
            (Path(step.output) / ("last.pt" if step.stage in TRAIN_STAGES else "eval.json")).write_text("{}")
            step_record_path(cfg.out, step).parent.mkdir(parents=True, exist_ok=True)
            step_record_path(cfg.out, step).write_text(json.dumps({"argv": step.argv}))
        if step.stage in TRAIN_STAGES:
            log = Path(cfg.out) / "logs" / f"{step.id}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("# started\n[rt1] step 2/4 loss=1 samples_per_s=8\n[rt1] val step 4 loss=1\n"
                           "[rt1] step 4/4 loss=0.9 bin_accuracy=0.5 samples_per_s=16\n")
    (Path(cfg.out) / "run.json").write_text(json.dumps({"config": asdict(cfg)}))


def test_progress_is_the_logs_last_step_line(tmp_path):
    log = tmp_path / "t.log"
    assert training_progress(log, 16) is None
    log.write_text("[germ] step 50/24000 loss=1 samples_per_s=32\n[germ] val step 50 loss=1\n"
                   "[germ] step 100/24000 loss=1 lr=3e-4 samples_per_s=64.0\nTraceback ...\n")
    p = training_progress(log, 16)
    assert (p.step, p.of, p.steps_per_s) == (100, 24000, 4.0)
    assert p.describe(24000) == "at step 100 of 24,000, ~100 min left at 4.0 steps/s"
    unknown = training_progress(log, None)   # the preset's batch (--scale paper): a step, no time left
    assert unknown.describe(24000) == "at step 100 of 24,000" and unknown.left_s(24000) is None


def test_a_fresh_plan_is_all_to_run_and_waits_in_order(tmp_path):
    cfg = QuardConfig(out=str(tmp_path / "run"), scale="tiny", seeds=(0,)).validate()
    rows = run_status(cfg)
    assert not any(r.complete for r in rows)
    by_id = {r.step.id: r for r in rows}
    assert by_id["r0-demos"].detail == "0 of 8 episodes"
    assert by_id["train-rt1_N_r0_s0"].detail == "not started, 4 steps"
    assert by_id["eval-rt1_N_r0_s0"].detail == "after train-rt1_N_r0_s0"
    text = status_text(cfg, rows)
    assert text.startswith(f"{cfg.out}: 0 of {len(rows)} steps complete (no run there yet")
    assert not (tmp_path / "run").exists()   # nothing written


def test_a_longer_budget_shows_each_training_continued_and_its_time_left(tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    _finished(QuardConfig(out=out, scale="tiny", seeds=(0,)), monkeypatch)
    done = config_of_run(out, {})
    assert done.scale == "tiny" and done.seeds == (0,)      # the run's own config, tuples restored
    assert "nothing to run" in status_text(done, run_status(done))
    longer = config_of_run(out, {"train_steps": 8})
    rows = run_status(longer)
    trains = [r for r in rows if r.step.stage in TRAIN_STAGES and not r.complete]
    assert trains and all(r.step.stage == "train" for r in trains)   # round 0's collector keeps its length
    # 16 samples/s at batch 4 is 4 steps/s: 4 steps left take 1 s
    assert all(r.detail.startswith("at step 4 of 8, ~0 min left at 4.0 steps/s") for r in trains)
    assert all(r.left_s == pytest.approx(1.0) for r in trains)
    evals = [r for r in rows if r.step.stage == "eval"]
    assert evals and all(not r.complete and r.detail.startswith("after train-") for r in evals)
    assert "trainings left: %d" % len(trains) in status_text(longer, rows)
    with pytest.raises(ValueError, match="trained 4 steps and this run asks 2"):
        run_status(config_of_run(out, {"train_steps": 2}))


def test_a_log_written_just_now_marks_its_step_running(tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    _finished(QuardConfig(out=out, scale="tiny", seeds=(0,)), monkeypatch)
    cfg = config_of_run(out, {"train_steps": 8})
    log = Path(out) / "logs" / "train-rt1_N_r0_s0.log"
    old = log.stat().st_mtime - 3600
    os.utime(log, (old, old))
    rows = {r.step.id: r.detail for r in run_status(cfg, now=old + 3600)}
    assert rows["train-rt1_N_r0_s0"].endswith("log written 60 min ago")
    assert rows["train-rt1_N_r0_s0"] != rows["train-germ_Y_r0_s0"]
    assert rows["train-germ_Y_r0_s0"].endswith("log written 0 s ago")   # new, but its last line is the 4-step run's
    log.write_text("[rt1] step 6/8 loss=1 samples_per_s=16\n")           # the continuation's own line
    rows = {r.step.id: r.detail for r in run_status(cfg)}
    assert rows["train-rt1_N_r0_s0"].startswith("at step 6 of 8") and rows["train-rt1_N_r0_s0"].endswith("(running)")


def test_status_from_the_command_line_prints_and_writes_nothing(tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "run")
    _finished(QuardConfig(out=out, scale="tiny", seeds=(0,)), monkeypatch)
    before = sorted(p for p in Path(out).rglob("*"))
    assert cli_main(["reproduce", "--stages", "quard", "--status", "--out", out, "--train-steps", "8"]) == 0
    text = capsys.readouterr().out
    assert "train-germ_Y_r0_s0" in text and "at step 4 of 8" in text
    assert sorted(p for p in Path(out).rglob("*")) == before
    assert json.loads((Path(out) / "run.json").read_text())["config"]["train_steps"] is None


def test_status_flag_errors(tmp_path, capsys):
    assert cli_main(["reproduce", "--status", "--out", str(tmp_path)]) == 2
    assert "--status: belongs to --stages quard" in capsys.readouterr().err
    assert cli_main(["reproduce", "--stages", "quard", "--status", "--report-only", "--out", str(tmp_path)]) == 2
    assert "--report-only and --status" in capsys.readouterr().err
